// CheckedRegexes; see checked_regexes.h.
#include "scheduler/checked_regexes.h"

#include <string>

namespace tripod::scheduler {

bool CheckedRegexes::Contains(std::string_view regex) const {
  MutexLock lock(&mu_);
  return set_.contains(std::string(regex));  // Debian's Abseil: its own string_view
}

void CheckedRegexes::Add(std::string_view regex) {
  if (regex.size() > capacity_bytes_) return;
  MutexLock lock(&mu_);
  if (!set_.emplace(std::string(regex)).second) return;
  order_.emplace_back(regex);
  bytes_ += regex.size();
  while (bytes_ > capacity_bytes_) {
    bytes_ -= order_.front().size();
    set_.erase(order_.front());
    order_.pop_front();
  }
}

}  // namespace tripod::scheduler
