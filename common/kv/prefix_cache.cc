// PrefixCache; see prefix_cache.h.
#include "common/kv/prefix_cache.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "xxhash.h"

namespace tripod {

PrefixCache::PrefixCache(int num_blocks)
    : hash_of_(num_blocks, 0),
      is_cached_(num_blocks, 0),
      prev_(num_blocks + 1, num_blocks),
      next_(num_blocks + 1, num_blocks),
      in_lru_(num_blocks, 0) {}

uint64_t PrefixCache::ChainHash(uint64_t parent, uint64_t plan_key,
                                std::span<const int32_t> tokens) {
  // The parent and plan seed the hash of the block's ids: one pass, no streaming state.
  const uint64_t head[2] = {parent, plan_key};
  return XXH3_64bits_withSeed(tokens.data(), tokens.size_bytes(), XXH3_64bits(head, sizeof(head)));
}

std::optional<PrefixCache::Hit> PrefixCache::Find(uint64_t hash, uint64_t parent_gen,
                                                  uint64_t plan_key,
                                                  std::span<const int32_t> tokens) const {
  const auto it = entries_.find(hash);
  if (it == entries_.end()) return std::nullopt;
  const Entry& e = it->second;
  if (e.parent_gen != parent_gen || e.plan_key != plan_key ||
      !std::equal(e.tokens.begin(), e.tokens.end(), tokens.begin(), tokens.end())) {
    return std::nullopt;
  }
  return Hit{e.block, e.gen};
}

uint64_t PrefixCache::Publish(int32_t block, uint64_t hash, uint64_t parent_gen, uint64_t plan_key,
                              std::span<const int32_t> tokens) {
  const auto it = entries_.find(hash);
  if (it != entries_.end()) {
    const std::optional<Hit> same = Find(hash, parent_gen, plan_key, tokens);
    return same ? same->gen : 0;
  }
  const uint64_t gen = next_gen_++;
  entries_.emplace(hash, Entry{block, gen, parent_gen, plan_key, {tokens.begin(), tokens.end()}});
  hash_of_[block] = hash;
  is_cached_[block] = 1;
  return gen;
}

void PrefixCache::LruUnlink(int32_t block) {
  next_[prev_[block]] = next_[block];
  prev_[next_[block]] = prev_[block];
  in_lru_[block] = 0;
  --n_lru_;
}

void PrefixCache::OnUnreferenced(int32_t block) {
  if (!is_cached_[block] || in_lru_[block]) return;
  const int32_t sentinel = static_cast<int32_t>(in_lru_.size());
  const int32_t last = prev_[sentinel];
  next_[last] = block;
  prev_[block] = last;
  next_[block] = sentinel;
  prev_[sentinel] = block;
  in_lru_[block] = 1;
  ++n_lru_;
}

void PrefixCache::OnReferenced(int32_t block) {
  if (in_lru_[block]) LruUnlink(block);
}

int32_t PrefixCache::EvictLru() {
  if (n_lru_ == 0) return -1;
  const int32_t sentinel = static_cast<int32_t>(in_lru_.size());
  const int32_t block = next_[sentinel];
  LruUnlink(block);
  entries_.erase(hash_of_[block]);
  is_cached_[block] = 0;
  return block;
}

absl::Status PrefixCache::CheckConsistency(const BlockPool& pool) const {
  const int n = static_cast<int>(in_lru_.size());
  if (pool.num_blocks() != n) return absl::InternalError("prefix cache and pool sizes differ");
  int cached = 0;
  for (int b = 0; b < n; ++b) {
    if (!is_cached_[b]) {
      if (in_lru_[b]) return absl::InternalError(absl::StrCat("uncached block ", b, " in LRU"));
      continue;
    }
    ++cached;
    const auto it = entries_.find(hash_of_[b]);
    if (it == entries_.end() || it->second.block != b) {
      return absl::InternalError(absl::StrCat("cached block ", b, " has no entry"));
    }
    if (pool.is_free(b)) return absl::InternalError(absl::StrCat("cached block ", b, " is free"));
    const bool unreferenced = pool.refcount(b) == 0;
    if (unreferenced != (in_lru_[b] != 0)) {
      return absl::InternalError(absl::StrCat("cached block ", b, " with ", pool.refcount(b),
                                              " references is", in_lru_[b] ? "" : " not",
                                              " evictable"));
    }
  }
  if (cached != static_cast<int>(entries_.size())) {
    return absl::InternalError("prefix cache entries and cached blocks differ");
  }
  int walked = 0;
  for (int32_t b = next_[n]; b != n; b = next_[b]) {
    if (b < 0 || b > n || !in_lru_[b] || ++walked > n_lru_) {
      return absl::InternalError("LRU list is corrupt");
    }
  }
  if (walked != n_lru_) return absl::InternalError("LRU list length is wrong");
  return absl::OkStatus();
}

}  // namespace tripod
