// ParallelFor on OpenMP; see thread_pool.h for why OpenMP is the pool.
#include "common/util/thread_pool.h"

#include <omp.h>

#include <algorithm>

namespace tripod {
namespace {
int g_threads = 0;
}  // namespace

void SetComputeThreads(int n) {
  g_threads = std::max(1, n);
  omp_set_num_threads(g_threads);
}

int ComputeThreads() { return g_threads > 0 ? g_threads : omp_get_max_threads(); }

void ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain) {
  if (n <= 0) return;
  const int threads = ComputeThreads();
  if (threads == 1 || n == 1 || omp_in_parallel()) {
    fn(0, n);
    return;
  }
  int64_t chunks = grain > 0 ? (n + grain - 1) / grain : threads;
  chunks = std::clamp<int64_t>(chunks, 1, n);
  if (chunks == 1) {
    fn(0, n);
    return;
  }
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = n * c / chunks;
    const int64_t end = n * (c + 1) / chunks;
    if (begin < end) fn(begin, end);
  }
}

void ParallelRun(const std::function<void(int, int)>& fn) {
  const int threads = ComputeThreads();
  if (threads == 1 || omp_in_parallel()) {
    fn(0, 1);
    return;
  }
#pragma omp parallel num_threads(threads)
  fn(omp_get_thread_num(), omp_get_num_threads());
}

}  // namespace tripod
