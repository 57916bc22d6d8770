// ParallelFor covers [0, n) exactly once, on every path (one chunk per thread, grain-sized
// chunks, nested calls, one thread).
#include "common/util/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <vector>

namespace tripod {
namespace {

void ExpectCoveredOnce(int64_t n, int64_t grain) {
  std::vector<std::atomic<int>> hits(n);
  ParallelFor(
      n,
      [&](int64_t b, int64_t e) {
        ASSERT_LE(0, b);
        ASSERT_LE(b, e);
        ASSERT_LE(e, n);
        for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
      },
      grain);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "index " << i << " of " << n;
}

TEST(ThreadPoolTest, CoversEveryIndexOnce) {
  for (int threads : {1, 2, 3}) {
    SetComputeThreads(threads);
    for (int64_t n : {1, 2, 7, 64, 1000}) {
      for (int64_t grain : {0, 1, 3, 100}) ExpectCoveredOnce(n, grain);
    }
  }
}

TEST(ThreadPoolTest, StdFunctionOverloadAndNestingRunInline) {
  SetComputeThreads(2);
  std::atomic<int64_t> sum{0};
  const std::function<void(int64_t, int64_t)> outer = [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      // A nested call must not deadlock or lose work.
      ParallelFor(10, [&](int64_t nb, int64_t ne) { sum += (ne - nb) * i; });
    }
  };
  ParallelFor(100, outer);
  EXPECT_EQ(sum.load(), 10 * (99 * 100 / 2));
}

TEST(ThreadPoolTest, ParallelRunGivesEachThreadItsIndex) {
  SetComputeThreads(2);
  std::vector<std::atomic<int>> seen(8);
  std::atomic<int> total{0};
  ParallelRun([&](int t, int n) {
    ASSERT_GE(t, 0);
    ASSERT_LT(t, n);
    seen[t].fetch_add(1);
    total.fetch_add(1);
  });
  EXPECT_GE(total.load(), 1);
  EXPECT_EQ(seen[0].load(), 1);
}

TEST(ThreadPoolTest, EmptyRangeCallsNothing) {
  bool called = false;
  ParallelFor(0, [&](int64_t, int64_t) { called = true; });
  EXPECT_FALSE(called);
}

}  // namespace
}  // namespace tripod
