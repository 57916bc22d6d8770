// The structured-output patterns this scheduler has already checked and found good, so that a
// request repeating a schema (the usual case) is not compiled again on the API thread: checking
// builds the pattern's whole automaton, thousands of states for json_object's (refusals are
// not kept: a pattern refused is refused again). Bounded by the patterns' bytes (a body
// may carry megabytes of schema): the oldest goes first. Thread-safe (the API threads share one).
#pragma once

#include <cstddef>
#include <deque>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_set.h"
#include "common/util/mutex.h"

namespace tripod::scheduler {

class CheckedRegexes {
 public:
  explicit CheckedRegexes(size_t capacity_bytes) : capacity_bytes_(capacity_bytes) {}

  bool Contains(std::string_view regex) const;
  // Remembers a good pattern (not one larger than the capacity); past the capacity the oldest
  // remembered are forgotten.
  void Add(std::string_view regex);

 private:
  const size_t capacity_bytes_;
  mutable Mutex mu_;
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_set<std::string> set_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> order_ ABSL_GUARDED_BY(mu_);  // oldest first
};

}  // namespace tripod::scheduler
