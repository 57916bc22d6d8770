// ParallelFor on OpenMP; see thread_pool.h for why OpenMP is the pool.
#include "common/util/thread_pool.h"

#include <omp.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "common/util/core_share.h"

namespace tripod {
namespace {
// Read by every computing thread, written at start-up (and again by engine threads, with the same
// value, as they pin their teams).
std::atomic<int> g_threads{0};

// Pins worker threads 1..n-1 of the OpenMP pool to distinct CPUs of this process's allowed set
// (in a core share: of its CPU order, so that threads past its own CPUs land on the neighbours'
// it borrows). Why: after the pool idles (its workers sleep), the scheduler may wake a worker on
// the calling thread's CPU; two spinning threads on one CPU then pass each barrier only at a
// scheduler tick, milliseconds per parallel region instead of microseconds (docs/cpu-kernels.md,
// "Compute threads pinned"). Outside a share the calling thread stays unpinned, so threads it
// starts later are unaffected, and the scheduler moves it off a busy worker's CPU. Skipped when
// there are fewer CPUs than threads.
void PinWorkers(int n) {
#ifdef __linux__
  std::vector<int> cpus = CoreShareCpuOrder();
  if (cpus.empty()) {
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    if (n < 2 || sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return;
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
    }
  }
  if (n < 2 || static_cast<int>(cpus.size()) < n) return;
#pragma omp parallel num_threads(n)
  {
    const int t = omp_get_thread_num();
    if (t > 0) {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(cpus[t], &one);
      pthread_setaffinity_np(pthread_self(), sizeof(one), &one);
    }
  }
#else
  (void)n;
#endif
}

// In a core share, an engine thread (the caller of a team) stays on its own CPUs: a borrowed
// thread then never shares a CPU with its own team's caller.
void PinCallerHome() {
#ifdef __linux__
  const std::vector<int> home = CoreShareHomeCpus();
  if (home.empty()) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : home) CPU_SET(c, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
#endif
}

int MaxThreads() {
  const int n = g_threads.load(std::memory_order_relaxed);
  return n > 0 ? n : omp_get_max_threads();
}

}  // namespace

void SetComputeThreads(int n) {
  const int threads = std::max(1, n);
  g_threads.store(threads, std::memory_order_relaxed);
  omp_set_num_threads(threads);  // this thread's ICV: its team's size
  if (!omp_in_parallel()) PinWorkers(threads);
}

void PinComputeThreads() {
  PinCallerHome();
  SetComputeThreads(MaxThreads());
}

int MaxComputeThreads() { return MaxThreads(); }

int ComputeThreads() {
  const int max = MaxThreads();
  const int lent = CoreShareThreads();
  return lent > 0 ? std::clamp(lent, 1, max) : max;
}

namespace internal {

void ParallelForImpl(int64_t n, int64_t grain, RangeFn fn, void* ctx) {
  if (n <= 0) return;
  const int threads = ComputeThreads();
  if (threads == 1 || n == 1 || omp_in_parallel()) {
    fn(ctx, 0, n);
    return;
  }
  int64_t chunks = grain > 0 ? (n + grain - 1) / grain : threads;
  chunks = std::clamp<int64_t>(chunks, 1, n);
  if (chunks == 1) {
    fn(ctx, 0, n);
    return;
  }
  if (chunks <= threads) {
    // One chunk per thread: no shared counter to hand them out. (The loop covers a team
    // smaller than asked for.)
    const int team = static_cast<int>(chunks);
#pragma omp parallel num_threads(team)
    {
      const int64_t step = omp_get_num_threads();
      for (int64_t c = omp_get_thread_num(); c < chunks; c += step) {
        const int64_t begin = n * c / chunks, end = n * (c + 1) / chunks;
        if (begin < end) fn(ctx, begin, end);
      }
    }
    return;
  }
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = n * c / chunks;
    const int64_t end = n * (c + 1) / chunks;
    if (begin < end) fn(ctx, begin, end);
  }
}

}  // namespace internal

void ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain) {
  internal::ParallelForImpl(
      n, grain,
      [](void* ctx, int64_t b, int64_t e) {
        (*static_cast<const std::function<void(int64_t, int64_t)>*>(ctx))(b, e);
      },
      const_cast<void*>(static_cast<const void*>(&fn)));
}

void ParallelRun(const std::function<void(int, int)>& fn) {
  const int threads = MaxThreads();
  if (threads == 1 || omp_in_parallel()) {
    fn(0, 1);
    return;
  }
#pragma omp parallel num_threads(threads)
  fn(omp_get_thread_num(), omp_get_num_threads());
}

}  // namespace tripod
