// Drain (common/rpc/drain.h): it starts draining at once, cancels what remains after the grace
// period, returns as soon as nothing is in flight, and a second signal cuts the grace short.
#include "common/rpc/drain.h"

#include <pthread.h>
#include <signal.h>

#include <atomic>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace tripod {
namespace {

struct Recorder {
  std::atomic<bool> draining{false};
  std::atomic<int> in_flight{1};
  std::atomic<int> cancels{0};
  DrainableFunctions work{[this] { draining = true; }, [this] { return in_flight.load(); },
                          [this] {
                            ++cancels;
                            in_flight = 0;
                          }};
};

sigset_t Usr1() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  return set;
}

TEST(DrainTest, CancelsWhatRemainsAfterTheGracePeriod) {
  const sigset_t set = Usr1();
  Recorder r;
  const absl::Time start = absl::Now();
  Drain(r.work, absl::Milliseconds(100), set);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(100));
  EXPECT_TRUE(r.draining);
  EXPECT_EQ(r.cancels.load(), 1);
}

TEST(DrainTest, ReturnsOnceNothingIsInFlight) {
  const sigset_t set = Usr1();
  Recorder r;
  r.in_flight = 0;
  const absl::Time start = absl::Now();
  Drain(r.work, absl::Seconds(30), set);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_TRUE(r.draining);
  EXPECT_EQ(r.cancels.load(), 1);  // CancelAll always ends the drain (nothing to cancel here)
}

TEST(DrainTest, ASecondSignalCutsTheGracePeriodShort) {
  const sigset_t set = Usr1();
  sigset_t old;
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &set, &old), 0);
  ASSERT_EQ(pthread_kill(pthread_self(), SIGUSR1), 0);  // pending: taken by the drain's wait
  Recorder r;
  const absl::Time start = absl::Now();
  Drain(r.work, absl::Seconds(30), set);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(r.cancels.load(), 1);
  ASSERT_EQ(pthread_sigmask(SIG_SETMASK, &old, nullptr), 0);
}

}  // namespace
}  // namespace tripod
