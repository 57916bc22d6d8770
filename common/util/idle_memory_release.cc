// IdleMemoryRelease; see idle_memory_release.h.
#include "common/util/idle_memory_release.h"

#include <malloc.h>

#include <utility>

namespace tripod {

IdleMemoryRelease::IdleMemoryRelease(std::function<void()> release)
    : release_(release ? std::move(release) : [] { malloc_trim(0); }) {}

bool IdleMemoryRelease::Observe(uint64_t activity, bool idle) {
  if (!seen_ || activity != last_activity_) {
    worked_ = worked_ || seen_;  // the first observation is the baseline, not work
    seen_ = true;
    last_activity_ = activity;
    return false;
  }
  if (!worked_ || !idle) return false;
  worked_ = false;
  release_();
  return true;
}

}  // namespace tripod
