// The core share between worker processes: a worker computes on its own CPUs plus those of the idle
// workers after it in its order, up to the first busy one; a busy mark is seen by the others at
// once, and a restarted worker's slot starts idle; two members of one slot (a draft worker beside
// its prefill worker) keep it busy while either computes. Joining is for a process's lifetime, so
// each case runs in a child process (EXPECT_EXIT), and the neighbours are real processes (fork).
#include "common/util/core_share.h"

#include <gtest/gtest.h>
#include <omp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/util/thread_pool.h"
#include "tests/unit/common/util/core_share_neighbour.h"

namespace tripod {
namespace {

std::string SharePath(const char* name) {
  return (std::filesystem::temp_directory_path() /
          (std::string("tripod_core_share_") + name + "_" + std::to_string(getpid())))
      .string();
}

int TeamSize() {
  std::atomic<int> team{0};
  ParallelFor(
      64, [&](int64_t, int64_t) { team.store(omp_get_num_threads()); }, 1);
  return team.load();
}

// Each case joins a share for its process's lifetime, so it runs in a child; "threadsafe" makes the
// child a fresh process (OpenMP's threads do not survive a plain fork).
class CoreShareTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(CoreShareTest, CreateRefusesBadLayouts) {
  const std::string path = SharePath("bad");
  EXPECT_FALSE(CreateCoreShare(path, {}).ok());
  EXPECT_FALSE(CreateCoreShare(path, {{0}, {}}).ok());
  EXPECT_FALSE(CreateCoreShare(path, {{0, 1}, {1}}).ok());  // a CPU in two slots
  EXPECT_FALSE(CreateCoreShare(path, {{-1}}).ok());
  EXPECT_FALSE(
      CreateCoreShare(path, std::vector<std::vector<int>>(kCoreShareMaxSlots + 1, {0})).ok());
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST_F(CoreShareTest, JoinRefusesWhatIsNotAShare) {
  EXPECT_EXIT(
      {
        const std::string path = SharePath("join");
        CHILD_CHECK(!JoinCoreShare(path, 0).ok());  // missing
        { std::ofstream(path) << "not a core share"; }
        const absl::Status s = JoinCoreShare(path, 0);
        CHILD_CHECK(!s.ok() && s.message().find("not a core share") != std::string::npos);
        CHILD_CHECK(CreateCoreShare(path, {{0}, {1}}).ok());
        CHILD_CHECK(!JoinCoreShare(path, 2).ok());
        CHILD_CHECK(!JoinCoreShare(path, -1).ok());
        CHILD_CHECK(!InCoreShare());
        CHILD_CHECK(JoinCoreShare(path, 1).ok());
        CHILD_CHECK(!JoinCoreShare(path, 0).ok());  // once per process
        std::filesystem::remove(path);
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST_F(CoreShareTest, BorrowsIdleNeighboursUpToTheFirstBusyOne) {
  EXPECT_EXIT(
      {
        const std::string path = SharePath("borrow");
        CHILD_CHECK(CreateCoreShare(path, {{0}, {1}, {2}}).ok());
        Neighbour n0 = Neighbour::Start(path, 0);
        Neighbour n2 = Neighbour::Start(path, 2);
        CHILD_CHECK(n0.Ask('j') == 1);
        CHILD_CHECK(n2.Ask('j') == 1);
        CHILD_CHECK(CoreShareThreads() == 0);  // not joined yet
        CHILD_CHECK(JoinCoreShare(path, 1).ok());
        CHILD_CHECK((CoreShareCpuOrder() == std::vector<int>{1, 2, 0}));
        CHILD_CHECK((CoreShareHomeCpus() == std::vector<int>{1}));
        SetComputeThreads(3);
        CHILD_CHECK(CoreShareThreads() == 3);
        CHILD_CHECK(ComputeThreads() == 3);
        CHILD_CHECK(TeamSize() == 3);

        // Slot 2 (next in the order) busy: nothing past it is borrowed either.
        n2.Ask('b');
        CHILD_CHECK(CoreShareThreads() == 1);
        CHILD_CHECK(ComputeThreads() == 1);
        CHILD_CHECK(TeamSize() == 1);
        CHILD_CHECK(MaxComputeThreads() == 3);
        n2.Ask('i');
        CHILD_CHECK(CoreShareThreads() == 3);

        // Slot 0 (last in the order) busy: slot 2's CPU is still lent.
        n0.Ask('b');
        CHILD_CHECK(CoreShareThreads() == 2);
        CHILD_CHECK(TeamSize() == 2);
        n0.Ask('i');
        CHILD_CHECK(CoreShareThreads() == 3);

        // Our own mark is what the others read; nested marks count.
        CHILD_CHECK(n0.Ask('t') == 3);
        SetComputeBusy(true);
        SetComputeBusy(true);
        SetComputeBusy(false);
        CHILD_CHECK(n0.Ask('t') == 1);  // its next slot (ours) is busy
        CHILD_CHECK(n2.Ask('t') == 2);  // slot 0 lent, then ours busy
        SetComputeBusy(false);
        CHILD_CHECK(n0.Ask('t') == 3);
        n0.Exit('q');
        n2.Exit('q');
        std::filesystem::remove(path);
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST_F(CoreShareTest, ARestartedWorkersSlotStartsIdle) {
  EXPECT_EXIT(
      {
        const std::string path = SharePath("restart");
        CHILD_CHECK(CreateCoreShare(path, {{0}, {1}}).ok());
        Neighbour crashed = Neighbour::Start(path, 1);
        Neighbour successor = Neighbour::Start(path, 1);
        CHILD_CHECK(crashed.Ask('j') == 1);
        crashed.Ask('b');
        crashed.Exit('x');
        CHILD_CHECK(JoinCoreShare(path, 0).ok());
        CHILD_CHECK(CoreShareThreads() == 1);  // it died busy: its CPU is not taken
        CHILD_CHECK(successor.Ask('j') == 1);  // serve restarts it: the slot starts idle
        CHILD_CHECK(CoreShareThreads() == 2);
        successor.Exit('q');
        std::filesystem::remove(path);
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST_F(CoreShareTest, TheMembersOfASlotKeepItBusyWhileEitherComputes) {
  EXPECT_EXIT(
      {
        const std::string path = SharePath("members");
        CHILD_CHECK(CreateCoreShare(path, {{0}, {1}}).ok());
        Neighbour prefill = Neighbour::Start(path, 1, 0);
        Neighbour draft = Neighbour::Start(path, 1, 1);
        Neighbour crashed = Neighbour::Start(path, 1, 1);
        CHILD_CHECK(!JoinCoreShare(path, 0, kCoreShareMaxMembers).ok());
        CHILD_CHECK(JoinCoreShare(path, 0).ok());
        CHILD_CHECK(prefill.Ask('j') == 1);
        CHILD_CHECK(crashed.Ask('j') == 1);
        CHILD_CHECK(CoreShareThreads() == 2);
        // Both members borrow slot 0 while it is idle.
        CHILD_CHECK(prefill.Ask('t') == 2);
        CHILD_CHECK(crashed.Ask('t') == 2);
        crashed.Ask('b');
        CHILD_CHECK(CoreShareThreads() == 1);
        crashed.Exit('x');
        CHILD_CHECK(CoreShareThreads() == 1);  // it died busy
        // Its successor clears its own bit only: the prefill worker's mark stands.
        prefill.Ask('b');
        CHILD_CHECK(draft.Ask('j') == 1);
        CHILD_CHECK(CoreShareThreads() == 1);
        // Either member computing keeps the slot busy; idle once both are.
        draft.Ask('b');
        prefill.Ask('i');
        CHILD_CHECK(CoreShareThreads() == 1);
        prefill.Ask('b');
        draft.Ask('i');
        CHILD_CHECK(CoreShareThreads() == 1);
        prefill.Ask('i');
        CHILD_CHECK(CoreShareThreads() == 2);
        prefill.Exit('q');
        draft.Exit('q');
        std::filesystem::remove(path);
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

// The decode worker reads whether a neighbour has prompts queued: any member's mark, of any other
// slot, never its own; a restarted member's mark is cleared, the other member's stands.
TEST_F(CoreShareTest, AQueueMarkIsSeenByTheOtherSlotsOnly) {
  EXPECT_EXIT(
      {
        const std::string path = SharePath("backlog");
        CHILD_CHECK(CreateCoreShare(path, {{0}, {1}, {2}}).ok());
        CHILD_CHECK(!CoreShareOthersBacklogged());  // not joined: never
        Neighbour prefill = Neighbour::Start(path, 1, 0);
        Neighbour draft = Neighbour::Start(path, 1, 1);
        Neighbour crashed = Neighbour::Start(path, 1, 1);
        Neighbour other = Neighbour::Start(path, 2, 0);
        CHILD_CHECK(JoinCoreShare(path, 0).ok());
        CHILD_CHECK(prefill.Ask('j') == 1);
        CHILD_CHECK(crashed.Ask('j') == 1);
        CHILD_CHECK(other.Ask('j') == 1);
        CHILD_CHECK(!CoreShareOthersBacklogged());
        SetCoreShareBacklog(true);  // its own mark is not a neighbour's
        CHILD_CHECK(!CoreShareOthersBacklogged());
        CHILD_CHECK(prefill.Ask('o') == 1 && other.Ask('o') == 1);
        SetCoreShareBacklog(false);
        CHILD_CHECK(prefill.Ask('o') == 0);
        prefill.Ask('Q');
        CHILD_CHECK(CoreShareOthersBacklogged());
        CHILD_CHECK(prefill.Ask('o') == 0);  // its slot's own mark
        CHILD_CHECK(other.Ask('o') == 1);
        crashed.Ask('Q');
        prefill.Ask('E');
        CHILD_CHECK(CoreShareOthersBacklogged());  // either member's mark
        crashed.Exit('x');
        CHILD_CHECK(CoreShareOthersBacklogged());  // it died with work queued
        CHILD_CHECK(draft.Ask('j') == 1);          // its successor starts with none
        CHILD_CHECK(!CoreShareOthersBacklogged());
        prefill.Ask('Q');
        CHILD_CHECK(draft.Ask('j') == 0);  // joined already: refused, the marks unchanged
        CHILD_CHECK(CoreShareOthersBacklogged());
        other.Ask('Q');
        prefill.Ask('E');
        CHILD_CHECK(CoreShareOthersBacklogged());
        other.Ask('E');
        CHILD_CHECK(!CoreShareOthersBacklogged());
        prefill.Exit('q');
        draft.Exit('q');
        other.Exit('q');
        std::filesystem::remove(path);
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace tripod
