// ConstraintCache; see constraint_cache.h.
#include "common/structured/constraint_cache.h"

namespace tripod::structured {

std::shared_ptr<const VocabularyTrie> ConstraintCache::trie() {
  MutexLock lock(&mu_);
  if (trie_ == nullptr) trie_ = BuildVocabularyTrie(tokenizer_);
  return trie_;
}

absl::StatusOr<std::shared_ptr<TokenConstraint>> ConstraintCache::Get(std::string_view regex) {
  {
    MutexLock lock(&mu_);
    auto it = by_regex_.find(std::string(regex));
    if (it != by_regex_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return *it->second;
    }
  }
  // Compiled outside the lock: other requests' lookups go on meanwhile. Two requests compiling
  // the same new pattern at once both compile it; the second insert wins, both results work.
  absl::StatusOr<std::shared_ptr<TokenConstraint>> c = TokenConstraint::Compile(regex, trie());
  if (!c.ok()) return c.status();
  MutexLock lock(&mu_);
  auto it = by_regex_.find(std::string(regex));
  if (it != by_regex_.end()) {
    lru_.erase(it->second);
    by_regex_.erase(it);
  }
  lru_.push_front(*c);
  by_regex_[std::string(regex)] = lru_.begin();
  while (lru_.size() > capacity_) {
    by_regex_.erase(lru_.back()->regex());
    lru_.pop_back();
  }
  return c;
}

size_t ConstraintCache::size() {
  MutexLock lock(&mu_);
  return lru_.size();
}

}  // namespace tripod::structured
