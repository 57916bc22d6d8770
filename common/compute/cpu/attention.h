// Causal attention over the KV cache on the CPU: tiled, online softmax, grouped-query heads.
// Never materialises the n x n score matrix. The same kernel serves prefill (many queries per
// sequence) and decode (one query per sequence, many sequences).
#pragma once

#include <cstdint>
#include <span>

#include "common/kv/kv_layout.h"

namespace tripod {

struct AttentionArgs {
  const float* q = nullptr;  // [n_q, n_heads * head_dim], RoPE applied, rows q_stride apart
  int64_t q_stride = 0;
  int n_q = 0;     // queries (new tokens) of this sequence
  int n_past = 0;  // cache slots before the first query; query i sees slots
                   // [kv.first_visible_slot, n_past + i] (its own K/V already written at
                   // slot n_past + i); an empty window gives a zero output row
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  float scale = 0;  // usually 1 / sqrt(head_dim)
  KvLayerRef kv;
  float* out = nullptr;  // [n_q, n_heads * head_dim], rows out_stride apart
  int64_t out_stride = 0;
  // Compute each query exactly as it would be computed alone (no slot splits across tasks, the
  // per-row score path for every tile size): results independent of batch and chunking.
  bool batch_invariant = false;
};

// Runs every sequence's attention; work is split over (sequence, kv head, query tile) on the
// compute threads.
void AttentionCpu(std::span<const AttentionArgs> seqs);

// Writes n rows of K and V (fp32, [n, n_kv_heads * head_dim], rows `stride` apart) into slots
// [slot_begin, slot_begin + n) of kv, converting to kv.dtype.
void WriteKvCpu(const float* k, const float* v, int n, int64_t stride, int n_kv_heads, int head_dim,
                const KvLayerRef& kv, int64_t slot_begin);

// Converts `rows` fp32 rows of n values (src_ld floats apart) to `dtype` (dst_ld bytes apart),
// with the KV cache's conversion kernels (round to nearest even for f16 and bf16), on the compute
// threads when there are enough values to pay for a parallel region. The bf16 GEMMs convert their
// activations with it: serially it was a visible share of a long prefill (docs/cpu-kernels.md,
// "Activations converted on the compute threads").
void ConvertRowsCpu(const float* src, int64_t rows, int64_t src_ld, int n, KvDtype dtype,
                    uint8_t* dst, int64_t dst_ld);

}  // namespace tripod
