// ContiguousKvCache; see contiguous_kv_cache.h.
#include "common/kv/contiguous_kv_cache.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/kv/kv_dtype.h"
#include "common/util/status_macros.h"

namespace tripod {

absl::StatusOr<std::unique_ptr<ContiguousKvCache>> ContiguousKvCache::Create(
    const KvLayout& layout, int n_seqs, int capacity_tokens,
    const std::optional<KvMemory>& device) {
  if (n_seqs <= 0 || capacity_tokens <= 0 || layout.n_layers <= 0) {
    return absl::InvalidArgumentError("KV cache needs at least one sequence, slot and layer");
  }
  if (absl::Status s = ValidateKvLayout(layout); !s.ok()) return s;
  std::unique_ptr<ContiguousKvCache> c(new ContiguousKvCache());
  c->layout_ = layout;
  c->n_seqs_ = n_seqs;
  c->capacity_ = capacity_tokens;
  c->n_blocks_ = (capacity_tokens + kBlockTokens - 1) / kBlockTokens;
  c->block_bytes_ =
      size_t{1} * layout.n_kv_heads * kBlockTokens * KvRowBytes(layout.dtype, layout.head_dim);
  c->block_ids_.resize(c->n_blocks_);
  for (int b = 0; b < c->n_blocks_; ++b) c->block_ids_[b] = b;
  const size_t total = c->block_bytes_ * c->n_blocks_ * 2 * layout.n_layers * n_seqs;
  if (total > (size_t{64} << 30)) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache of ", total, " bytes is too large"));
  }
  if (device) {
    c->device_storage_ = device->alloc(total);  // zeroed
    if (c->device_storage_ == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("KV cache of ", total, " bytes does not fit in device memory"));
    }
    c->device_ = device;
  } else {
    ASSIGN_OR_RETURN(c->storage_, HugePageBuffer::Allocate(total));  // zeroed
  }
  c->bytes_ = total;
  return c;
}

ContiguousKvCache::~ContiguousKvCache() {
  if (device_storage_ != nullptr) device_->free(device_storage_);
}

KvLayerRef ContiguousKvCache::Layer(int32_t kv_seq, int layer) {
  KvLayerRef r;
  const size_t half = block_bytes_ * n_blocks_;  // one layer's K (or V) blocks
  uint8_t* base = (device_storage_ != nullptr ? device_storage_ : storage_.data()) +
                  (static_cast<size_t>(kv_seq) * layout_.n_layers + layer) * 2 * half;
  r.k_base = base;
  r.v_base = base + half;
  r.block_ids = block_ids_.data();
  r.n_blocks = n_blocks_;
  r.block_tokens = kBlockTokens;
  r.block_bytes = block_bytes_;
  r.dtype = layout_.dtype;
  return r;
}

}  // namespace tripod
