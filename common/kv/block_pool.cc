// BlockPool; see block_pool.h.
#include "common/kv/block_pool.h"

#include "absl/strings/str_cat.h"

namespace tripod {

BlockPool::BlockPool(int num_blocks)
    : refcount_(num_blocks > 0 ? num_blocks : 0, 0), in_free_(refcount_.size(), 1) {
  free_.reserve(refcount_.size());
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

int32_t BlockPool::Allocate() {
  if (free_.empty()) return -1;
  const int32_t b = free_.back();
  free_.pop_back();
  in_free_[b] = 0;
  refcount_[b] = 1;
  return b;
}

absl::Status BlockPool::Ref(int32_t block) {
  if (!valid(block)) return absl::OutOfRangeError(absl::StrCat("no KV block ", block));
  if (in_free_[block]) {
    return absl::FailedPreconditionError(absl::StrCat("KV block ", block, " is free"));
  }
  ++refcount_[block];
  return absl::OkStatus();
}

absl::Status BlockPool::Unref(int32_t block) {
  if (!valid(block)) return absl::OutOfRangeError(absl::StrCat("no KV block ", block));
  if (refcount_[block] <= 0) {
    return absl::FailedPreconditionError(absl::StrCat("KV block ", block, " has no reference"));
  }
  --refcount_[block];
  return absl::OkStatus();
}

absl::Status BlockPool::Free(int32_t block) {
  if (!valid(block)) return absl::OutOfRangeError(absl::StrCat("no KV block ", block));
  if (in_free_[block]) {
    return absl::FailedPreconditionError(absl::StrCat("KV block ", block, " freed twice"));
  }
  if (refcount_[block] != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("KV block ", block, " freed with ", refcount_[block], " references"));
  }
  in_free_[block] = 1;
  free_.push_back(block);
  return absl::OkStatus();
}

absl::Status BlockPool::CheckConsistency() const {
  std::vector<uint8_t> seen(refcount_.size(), 0);
  for (int32_t b : free_) {
    if (!valid(b)) return absl::InternalError(absl::StrCat("free list holds bad block ", b));
    if (seen[b]++) return absl::InternalError(absl::StrCat("block ", b, " twice on the free list"));
    if (refcount_[b] != 0) {
      return absl::InternalError(absl::StrCat("free block ", b, " has references"));
    }
  }
  for (size_t b = 0; b < refcount_.size(); ++b) {
    if ((seen[b] != 0) != (in_free_[b] != 0)) {
      return absl::InternalError(absl::StrCat("block ", b, " free flag disagrees with the list"));
    }
    if (refcount_[b] < 0) return absl::InternalError(absl::StrCat("block ", b, " refcount < 0"));
  }
  return absl::OkStatus();
}

}  // namespace tripod
