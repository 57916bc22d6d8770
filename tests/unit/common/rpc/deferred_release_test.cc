// ReleaseLater drops what it is given on its own thread, soon, and FlushReleases waits for it.
#include "common/rpc/deferred_release.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

namespace tripod {
namespace {

// Records the thread its destructor ran on.
struct Tracked {
  Tracked(std::atomic<int>* d, std::thread::id* o) : destroyed(d), on(o) {}
  std::atomic<int>* destroyed;
  std::thread::id* on;
  ~Tracked() {
    *on = std::this_thread::get_id();
    destroyed->fetch_add(1);
  }
};

TEST(DeferredReleaseTest, DropsOnItsOwnThreadAndFlushWaits) {
  std::atomic<int> destroyed{0};
  std::thread::id on;
  auto t = std::make_shared<Tracked>(&destroyed, &on);
  std::weak_ptr<Tracked> watch = t;
  ReleaseLater(std::move(t));
  ASSERT_TRUE(FlushReleases(std::chrono::seconds(10)));
  EXPECT_TRUE(watch.expired());
  EXPECT_EQ(destroyed.load(), 1);
  EXPECT_NE(on, std::this_thread::get_id());
}

TEST(DeferredReleaseTest, AnotherHolderKeepsItAlive) {
  std::atomic<int> destroyed{0};
  std::thread::id on;
  auto t = std::make_shared<Tracked>(&destroyed, &on);
  ReleaseLater(t);
  ASSERT_TRUE(FlushReleases(std::chrono::seconds(10)));
  EXPECT_EQ(destroyed.load(), 0);  // only the release thread's reference went
  t.reset();
  EXPECT_EQ(destroyed.load(), 1);
  EXPECT_EQ(on, std::this_thread::get_id());
}

TEST(DeferredReleaseTest, ManyThreadsAtOnce) {
  std::atomic<int> destroyed{0};
  constexpr int kThreads = 8, kEach = 200;
  std::vector<std::thread::id> ons(kThreads * kEach);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      for (int j = 0; j < kEach; ++j) {
        ReleaseLater(std::make_shared<Tracked>(&destroyed, &ons[i * kEach + j]));
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(FlushReleases(std::chrono::seconds(10)));
  EXPECT_EQ(destroyed.load(), kThreads * kEach);
  ReleaseLater(nullptr);  // nothing to drop: no effect
  EXPECT_TRUE(FlushReleases(std::chrono::seconds(1)));
}

}  // namespace
}  // namespace tripod
