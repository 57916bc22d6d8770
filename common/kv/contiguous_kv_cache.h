// A simple KvStore: each sequence owns one contiguous block per layer, sized at creation.
// Used by the CLI, benchmarks and tests; the decode worker uses the paged cache instead.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/kv/kv_store.h"

namespace tripod {

class ContiguousKvCache final : public KvStore {
 public:
  // Room for n_seqs sequences of capacity_tokens slots each.
  static absl::StatusOr<std::unique_ptr<ContiguousKvCache>> Create(const KvLayout& layout,
                                                                   int n_seqs, int capacity_tokens);
  KvLayout layout() const override { return layout_; }
  KvLayerRef Layer(int32_t kv_seq, int layer) override;
  int capacity_tokens() const { return capacity_; }
  size_t bytes() const { return storage_.size(); }

 private:
  ContiguousKvCache() = default;
  KvLayout layout_;
  int n_seqs_ = 0;
  int capacity_ = 0;
  size_t block_bytes_ = 0;
  std::vector<uint8_t> storage_;  // [seq][layer][K|V] blocks
  int32_t zero_ = 0;              // the single block id
};

}  // namespace tripod
