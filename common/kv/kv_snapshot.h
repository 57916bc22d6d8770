// KvSnapshot: the K/V of one sequence taken out of the store that computed it, as a prefill
// worker hands it to a decode worker (in-process now, chunked over the wire later). Trimmed KV
// (SpecKV) keeps, per layer and KV head, its own subset of prompt positions; every (layer, head)
// keeps the same number of entries, and stored K already carries RoPE, so the entries' order in
// the cache does not matter.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/kv/kv_layout.h"
#include "common/kv/kv_store.h"

namespace tripod {

struct KvSnapshot {
  KvLayout layout;  // layers, KV heads, head_dim and the element type of k and v
  int n_slots = 0;  // slots per (layer, KV head), padding included
  // [n_layers][n_kv_heads][n_slots] rows of head_dim elements of layout.dtype.
  std::vector<uint8_t> k, v;
  // Source position of each entry, [n_layers][n_kv_heads][n_slots]; empty when untrimmed
  // (entry s of every layer and head is prompt position s). Padding slots hold -1.
  std::vector<int32_t> positions;
  // Trimmed only, [n_layers]: the first slot holding KV in each layer; empty when every layer's
  // slots are all kept entries (as if all 0).
  std::vector<int32_t> layer_first;
  // The prompt tokens the untrimmed KV was computed from (for prefix caching); may be empty.
  std::vector<int32_t> token_ids;
  uint64_t plan_key = 0;  // ForwardPlan::KvKey() of the plan that made it; plans never mix

  bool trimmed() const { return !positions.empty(); }
  int first_slot(int layer) const { return layer_first.empty() ? 0 : layer_first[layer]; }
  // Bytes of K and V that carry entries (padding left out): what a transfer sends.
  size_t kept_bytes() const;
  size_t row_bytes() const { return KvRowBytes(layout.dtype, layout.head_dim); }
  size_t offset(int layer, int head, int slot) const {
    return ((size_t{1} * layer * layout.n_kv_heads + head) * n_slots + slot) * row_bytes();
  }
};

// Sizes agree with the layout, positions (if any) are in [0, max_position) and distinct within
// each (layer, head), layer_first (if any) is in [0, n_slots] with -1 positions exactly below it.
absl::Status ValidateSnapshot(const KvSnapshot& s, int32_t max_position);

// Copies slots [0, n_slots) of sequence kv_seq out of a store.
absl::StatusOr<KvSnapshot> ExportSnapshot(KvStore& store, int32_t kv_seq, int n_slots);

// Writes a snapshot into slots [0, n_slots) of kv_seq of a store (room already made), converting
// the element type when the store's differs; padding slots are left as they are.
absl::Status WriteSnapshot(const KvSnapshot& s, KvStore& store, int32_t kv_seq);

}  // namespace tripod
