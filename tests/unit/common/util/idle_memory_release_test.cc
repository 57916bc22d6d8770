// IdleMemoryRelease: one release per idle spell that follows work, none while busy, none at start.
#include "common/util/idle_memory_release.h"

#include <gtest/gtest.h>

namespace tripod {
namespace {

TEST(IdleMemoryReleaseTest, ReleasesOncePerIdleSpellAfterWork) {
  int released = 0;
  IdleMemoryRelease r([&] { ++released; });
  EXPECT_FALSE(r.Observe(0, true));  // baseline
  EXPECT_FALSE(r.Observe(0, true));  // no work yet: nothing to give back
  EXPECT_EQ(released, 0);
  EXPECT_FALSE(r.Observe(5, false));  // working
  EXPECT_FALSE(r.Observe(9, false));
  EXPECT_FALSE(r.Observe(9, false));  // standing still, but requests still in the engine
  EXPECT_TRUE(r.Observe(9, true));    // still and idle: once
  EXPECT_FALSE(r.Observe(9, true));
  EXPECT_FALSE(r.Observe(9, true));
  EXPECT_EQ(released, 1);
  EXPECT_FALSE(r.Observe(10, true));  // a short burst that ended within the period
  EXPECT_TRUE(r.Observe(10, true));
  EXPECT_EQ(released, 2);
}

TEST(IdleMemoryReleaseTest, TheDefaultTrimsTheRealHeap) {
  IdleMemoryRelease r;
  r.Observe(0, true);
  r.Observe(1, true);
  EXPECT_TRUE(r.Observe(1, true));  // malloc_trim ran (and returned): no crash, no hang
}

}  // namespace
}  // namespace tripod
