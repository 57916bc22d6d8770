// PrefixCache: full KV blocks published for reuse by later sequences with the same prompt
// prefix. A block's key is a hash chained over the parent block's hash, the plan that computed
// the KV (ForwardPlan::KvKey: POP KV never mixes with full-model KV) and the block's token ids
// (XXH3_64). Each entry also keeps its token ids, plan and parent entry, and a hit is verified
// against them, so a hash collision can never alias KV. Unreferenced cached blocks are kept in
// LRU order and evicted when the pool runs out of free blocks.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "common/kv/block_pool.h"

namespace tripod {

class PrefixCache {
 public:
  explicit PrefixCache(int num_blocks);

  // The chain hash of a block: parent is the previous block's hash (0 for the first block).
  static uint64_t ChainHash(uint64_t parent, uint64_t plan_key, std::span<const int32_t> tokens);

  struct Hit {
    int32_t block;
    uint64_t gen;  // identifies the entry (never reused), the parent of the next block
  };
  // The cached block with this hash whose content is exactly these tokens under this plan,
  // following the entry parent_gen (0 for the first block).
  std::optional<Hit> Find(uint64_t hash, uint64_t parent_gen, uint64_t plan_key,
                          std::span<const int32_t> tokens) const;

  // Publishes a full, referenced block. Returns the entry now holding this content: a new one,
  // or an existing identical one (the block then stays private); 0 when another content holds
  // the hash (a collision: the block is not published).
  uint64_t Publish(int32_t block, uint64_t hash, uint64_t parent_gen, uint64_t plan_key,
                   std::span<const int32_t> tokens);

  bool cached(int32_t block) const { return is_cached_[block] != 0; }
  int num_cached() const { return static_cast<int>(entries_.size()); }
  int num_evictable() const { return n_lru_; }

  // A cached block lost its last reference: it becomes the most recently used evictable one.
  void OnUnreferenced(int32_t block);
  // A cached, unreferenced block is referenced again (a prefix hit): it is no longer evictable.
  void OnReferenced(int32_t block);
  // Drops the least recently used evictable block from the cache and returns it (-1 if none);
  // the caller returns it to the pool.
  int32_t EvictLru();

  // Every entry's block is cached under it, evictable blocks are exactly the unreferenced
  // cached ones, none is free.
  absl::Status CheckConsistency(const BlockPool& pool) const;

 private:
  struct Entry {
    int32_t block;
    uint64_t gen;
    uint64_t parent_gen;
    uint64_t plan_key;
    std::vector<int32_t> tokens;
  };
  void LruUnlink(int32_t block);

  absl::flat_hash_map<uint64_t, Entry> entries_;  // by chain hash
  std::vector<uint64_t> hash_of_;                 // block -> its hash while cached
  std::vector<uint8_t> is_cached_;
  uint64_t next_gen_ = 1;
  // Intrusive doubly-linked LRU list over block ids; sentinel = num_blocks. Front = oldest.
  std::vector<int32_t> prev_, next_;
  std::vector<uint8_t> in_lru_;
  int n_lru_ = 0;
};

}  // namespace tripod
