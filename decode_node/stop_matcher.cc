// StopMatcher; see stop_matcher.h.
#include "decode_node/stop_matcher.h"

#include <algorithm>
#include <utility>

namespace tripod {

StopMatcher::StopMatcher(std::vector<std::string> stops, bool include_stop)
    : include_stop_(include_stop) {
  for (std::string& s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

StopMatcher::Result StopMatcher::Push(std::string_view piece) {
  Result r;
  if (stopped_) return r;
  held_.append(piece);
  // The earliest match of any stop string; held_ never contains a complete one before this
  // push, so every match is new.
  // Of two matches at the same place, the one listed first.
  size_t first = std::string::npos, length = 0;
  for (const std::string& s : stops_) {
    const size_t at = held_.find(s);
    if (at < first) {
      first = at;
      length = s.size();
    }
  }
  if (first != std::string::npos) {
    r.text = held_.substr(0, include_stop_ ? first + length : first);
    r.stopped = stopped_ = true;
    held_.clear();
    return r;
  }
  // Hold back the longest suffix of held_ that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const std::string& s : stops_) {
    for (size_t n = std::min(s.size() - 1, held_.size()); n > keep; --n) {
      if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
        keep = n;
        break;
      }
    }
  }
  r.text = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return r;
}

std::string StopMatcher::Flush() {
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace tripod
