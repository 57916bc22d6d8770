// Gives freed heap memory back to the kernel once a worker has gone idle after work. glibc keeps
// memory freed inside its per-thread arenas (the gRPC and engine threads' allocations, freed when
// a request ends) and returns only what sits at the top of a heap; malloc_trim(0) also returns
// the whole free pages in the middle. Without it the decode worker grew after every abort storm,
// whatever glibc's arena_max, mmap_threshold and trim_threshold tunables; malloc_trim returned the
// memory (docs/reliability.md; docs/benchmarks.md, "Idle memory release"). Trimming costs a walk
// of the free lists, so it runs once per idle spell, never while requests run.
#pragma once

#include <cstdint>
#include <functional>

namespace tripod {

class IdleMemoryRelease {
 public:
  // `release` does the trimming (default: malloc_trim(0)).
  explicit IdleMemoryRelease(std::function<void()> release = {});

  // Called periodically (the worker's main loop, about once a second) with a counter that moves
  // whenever work is done and whether nothing is running or waiting now. Releases once when a
  // counter that moved since the last release stood still for a whole period and the worker is
  // idle. True when it released.
  bool Observe(uint64_t activity, bool idle);

 private:
  std::function<void()> release_;
  uint64_t last_activity_ = 0;
  bool seen_ = false;
  bool worked_ = false;  // activity since the last release
};

}  // namespace tripod
