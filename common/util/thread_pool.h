// The compute threads, and parallel_for over index ranges.
// The pool is the OpenMP runtime: oneDNN (Debian's build) runs its GEMMs on OpenMP too, so every
// kernel of ours and every oneDNN primitive share one set of threads instead of oversubscribing.
//
// Threads in a server: the thread count is one process-wide setting (atomic; any thread may read
// it), but OpenMP gives every thread that opens a parallel region its own team. So each engine
// thread (a prefill queue's, DecodeEngine::Loop) computes on its own team, and calls
// PinComputeThreads() once when it starts so that its team's workers are pinned as start-up
// pinned the main thread's. gRPC handler threads never open parallel regions. Under `tripod
// serve` the workers of one machine may lend each other idle CPUs (core_share.h): a region's team
// is then sized when it opens.
#pragma once

#include <cstdint>
#include <functional>
#include <type_traits>

namespace tripod {

// The most threads a parallel region uses; set at start-up (flags), before any compute. Also pins
// the calling thread's team's workers (not the caller) to distinct CPUs where there are enough.
// Thread-safe.
void SetComputeThreads(int n);
// Call first thing on every thread that computes (an engine thread): its own OpenMP team gets its
// workers pinned as start-up pinned the main thread's, and in a core share (core_share.h) the
// thread itself stays on the worker's own CPUs.
void PinComputeThreads();
// The setting above.
int MaxComputeThreads();
// The threads the next parallel region gets: MaxComputeThreads(), or in a core share the CPUs it
// may use at this moment (its own and those idle neighbours lend), at most the setting. May change
// from one region to the next: split work by it, but never size per-thread scratch by it.
int ComputeThreads();  // thread-safe

// Calls fn(begin, end) on disjoint chunks covering [0, n), at most one chunk per thread when
// grain is 0, else chunks of about `grain` items. Runs inline when n is small or one thread.
// Chunks are handed out dynamically when there are more of them than threads (a thread that the
// OS delays takes fewer), statically (one per thread, no shared counter) otherwise.
void ParallelFor(int64_t n, const std::function<void(int64_t begin, int64_t end)>& fn,
                 int64_t grain = 0);

// Calls fn(thread_index, num_threads) once on every compute thread, MaxComputeThreads() of them
// (for per-thread scratch).
void ParallelRun(const std::function<void(int thread, int num_threads)>& fn);

namespace internal {
using RangeFn = void (*)(void* ctx, int64_t begin, int64_t end);
void ParallelForImpl(int64_t n, int64_t grain, RangeFn fn, void* ctx);
}  // namespace internal

// The same for any callable, without building a std::function (which allocates when a lambda
// captures more than two references): decode opens hundreds of parallel regions per token.
template <class F>
requires std::is_invocable_v<F&, int64_t, int64_t>
void ParallelFor(int64_t n, F&& fn, int64_t grain = 0) {
  using Fn = std::remove_reference_t<F>;
  internal::ParallelForImpl(
      n, grain, [](void* ctx, int64_t b, int64_t e) { (*static_cast<Fn*>(ctx))(b, e); },
      const_cast<void*>(static_cast<const void*>(&fn)));
}

}  // namespace tripod
