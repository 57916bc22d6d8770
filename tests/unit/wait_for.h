// Bounded polling for the concurrency tests: a condition another thread makes true.
#pragma once

#include <functional>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tripod {

// Checks `cond` every millisecond; true once it holds, false when `bound` passes first.
inline bool WaitFor(const std::function<bool()>& cond, absl::Duration bound = absl::Seconds(20)) {
  const absl::Time deadline = absl::Now() + bound;
  while (!cond()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

}  // namespace tripod
