// Attention probabilities reduced per KV head and key: what a draft model's (or the prefill
// worker's) attention says about each prompt position (SpecPC, SpecKV, SnapKV scoring). A
// separate pass over the cache, run only for the captured layers and the window's few queries,
// so that the fast attention kernels stay as they are when nothing is captured.
#pragma once

#include <cstdint>
#include <span>

#include "common/kv/kv_layout.h"

namespace tripod {

struct AttentionScoreArgs {
  const float* q = nullptr;  // [n_q, n_heads * head_dim], RoPE applied, rows q_stride apart
  int64_t q_stride = 0;
  int n_q = 0;
  int q_slot0 =
      0;           // cache slot of query 0: query i sees slots [kv.first_visible_slot, q_slot0 + i]
  int n_keys = 0;  // slots [0, n_keys) are scored (>= q_slot0 + n_q)
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  float scale = 0;
  KvLayerRef kv;
  // SpecPC's query weights: query i of n_q counts i / (n_q - 1) in the max (1 when n_q == 1);
  // the sum is unweighted either way.
  bool ramp_weights = false;
  // [n_kv_heads][n_keys]: max_out[h][j] = max(max_out[h][j], max over the group's query heads and
  // the queries i of w_i * p_i(j)); sum_out[h][j] += the sum of p_i(j) over them. p_i is
  // softmax(q_i . K^T * scale) over the slots query i sees (0 elsewhere). Either may be null.
  float* max_out = nullptr;
  float* sum_out = nullptr;
};

// Scores every sequence's queries (fp32 softmax, K read from the cache in any dtype and layout),
// parallel over (sequence, KV head) on the compute threads.
void AttentionScoresCpu(std::span<const AttentionScoreArgs> seqs);

}  // namespace tripod
