// The process-wide pool of compute threads, and parallel_for over index ranges.
// The pool is the OpenMP runtime: oneDNN (Debian's build) runs its GEMMs on OpenMP too, so every
// kernel of ours and every oneDNN primitive share one set of threads instead of oversubscribing.
#pragma once

#include <cstdint>
#include <functional>

namespace tripod {

// Number of threads parallel_for uses; set once at start-up (flags), before any compute.
void SetComputeThreads(int n);
int ComputeThreads();

// Calls fn(begin, end) on disjoint chunks covering [0, n), at most one chunk per thread when
// grain is 0, else chunks of about `grain` items. Runs inline when n is small or one thread.
void ParallelFor(int64_t n, const std::function<void(int64_t begin, int64_t end)>& fn,
                 int64_t grain = 0);

// Calls fn(thread_index, num_threads) once on every compute thread (for per-thread scratch).
void ParallelRun(const std::function<void(int thread, int num_threads)>& fn);

}  // namespace tripod
