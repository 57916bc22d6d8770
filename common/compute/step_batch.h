// StepBatch: the tokens of one forward pass, flat over sequences, and where each sequence's
// K/V live (KvStore). Built by whoever schedules (CLI, decode engine, prefill engine).
#pragma once

#include <cstdint>
#include <vector>

#include "common/kv/kv_store.h"

namespace tripod {

struct SeqInBatch {
  int32_t token_begin = 0;  // first row of this sequence in the batch
  int32_t n_tokens = 0;
  int32_t n_past = 0;  // cache slots filled before this step; new K/V go to n_past..
  int32_t kv_seq = 0;  // the KvStore's handle
};

struct StepBatch {
  std::vector<int32_t> tokens;      // [T]
  std::vector<int32_t> positions;   // [T] RoPE positions (need not equal slots)
  std::vector<SeqInBatch> seqs;     // contiguous, in row order
  std::vector<int32_t> logit_rows;  // rows whose logits are wanted, in output order

  int n_tokens() const { return static_cast<int>(tokens.size()); }
  // Appends one sequence's tokens at positions pos0.. and cache slots n_past..
  void AddSequence(int32_t kv_seq, const int32_t* ids, int n, int32_t pos0, int32_t n_past,
                   bool logits_for_last);
};

}  // namespace tripod
