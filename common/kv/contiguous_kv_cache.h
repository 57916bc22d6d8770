// A simple KvStore: each sequence owns its slots of every layer, sized at creation, in 16-slot
// blocks laid out in order (the paged pool's block layout, without the pool). Used by the CLI,
// benchmarks and tests; the decode worker uses the paged cache instead.
// Why blocks: decode attention then gives a task every KV head of a block (6 KB of K, then of V,
// for SmolLM2), which streams better than one head's long run per task (docs/cpu-kernels.md,
// "Contiguous KV cache in 16-slot blocks").
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "common/kv/kv_memory.h"
#include "common/kv/kv_store.h"
#include "common/util/huge_pages.h"

namespace tripod {

class ContiguousKvCache final : public KvStore {
 public:
  // Room for n_seqs sequences of capacity_tokens slots each, in host memory, or in `device`'s
  // memory when given (a GPU backend's DeviceKvMemory).
  static absl::StatusOr<std::unique_ptr<ContiguousKvCache>> Create(
      const KvLayout& layout, int n_seqs, int capacity_tokens,
      const std::optional<KvMemory>& device = std::nullopt);
  ~ContiguousKvCache() override;
  KvLayout layout() const override { return layout_; }
  KvLayerRef Layer(int32_t kv_seq, int layer) override;
  const KvMemory* memory() const override { return device_ ? &*device_ : nullptr; }
  int capacity_tokens() const { return capacity_; }
  size_t bytes() const { return bytes_; }

 private:
  ContiguousKvCache() = default;
  KvLayout layout_;
  static constexpr int kBlockTokens = 16;
  int n_seqs_ = 0;
  int capacity_ = 0;
  int n_blocks_ = 0;
  size_t block_bytes_ = 0;
  size_t bytes_ = 0;
  HugePageBuffer storage_;             // [seq][layer][K|V][block], on huge pages
  uint8_t* device_storage_ = nullptr;  // the same in device memory (then storage_ is empty)
  std::optional<KvMemory> device_;
  std::vector<int32_t> block_ids_;  // 0, 1, ..., n_blocks_ - 1
};

}  // namespace tripod
