// The decode worker's compiled constraints, keyed by their regex (one worker serves one model,
// so the text is the whole key): clients repeat the same schema across requests, and a compile
// plus the masks it has cached cost far more than a lookup. Bounded, least recently used first
// out; a constraint evicted while sequences still use it lives on with them (shared_ptr).
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/model/tokenizer.h"
#include "common/structured/token_constraint.h"
#include "common/util/mutex.h"

namespace tripod::structured {

class ConstraintCache {
 public:
  // The tokenizer must outlive the cache; its trie is built on the first Get.
  // At most capacity * TokenConstraint::kMaxCachedMasks masks live here (and in evicted
  // constraints still in use).
  explicit ConstraintCache(const Tokenizer& tokenizer, size_t capacity = 32)
      : tokenizer_(tokenizer), capacity_(capacity) {}

  // Errors: those of TokenConstraint::Compile (a refused pattern is not cached).
  absl::StatusOr<std::shared_ptr<TokenConstraint>> Get(std::string_view regex);

  std::shared_ptr<const VocabularyTrie> trie();
  size_t size();

 private:
  const Tokenizer& tokenizer_;
  const size_t capacity_;
  Mutex mu_;
  std::shared_ptr<const VocabularyTrie> trie_ ABSL_GUARDED_BY(mu_);
  std::list<std::shared_ptr<TokenConstraint>> lru_ ABSL_GUARDED_BY(mu_);  // most recent first
  absl::flat_hash_map<std::string, std::list<std::shared_ptr<TokenConstraint>>::iterator> by_regex_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace tripod::structured
