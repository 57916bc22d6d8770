// BlockPool: ids of fixed-size KV blocks, a free list and a reference count per block. It only
// counts; the memory lives with the cache, and the prefix cache decides what a block whose count
// dropped to zero becomes (free again, or cached for reuse).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace tripod {

class BlockPool {
 public:
  explicit BlockPool(int num_blocks);

  int num_blocks() const { return static_cast<int>(refcount_.size()); }
  int num_free() const { return static_cast<int>(free_.size()); }

  // Takes a free block with a reference count of 1; -1 when none is free. Lower ids first on a
  // fresh pool.
  int32_t Allocate();
  // One more reference to a block that is not free.
  absl::Status Ref(int32_t block);
  // One reference fewer; the block is not freed (see Free).
  absl::Status Unref(int32_t block);
  // Returns an unreferenced block to the free list.
  absl::Status Free(int32_t block);

  int refcount(int32_t block) const { return refcount_[block]; }
  bool is_free(int32_t block) const { return in_free_[block] != 0; }
  bool valid(int32_t block) const { return block >= 0 && block < num_blocks(); }

  // Free-list entries are distinct, unreferenced and flagged.
  absl::Status CheckConsistency() const;

 private:
  std::vector<int32_t> refcount_;
  std::vector<int32_t> free_;     // a stack
  std::vector<uint8_t> in_free_;  // block is on free_
};

}  // namespace tripod
