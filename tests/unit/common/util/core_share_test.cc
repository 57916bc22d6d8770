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

namespace tripod {
namespace {

std::string SharePath(const char* name) {
  return (std::filesystem::temp_directory_path() /
          (std::string("tripod_core_share_") + name + "_" + std::to_string(getpid())))
      .string();
}

// Fails the child with a message and a distinct exit code.
#define CHILD_CHECK(cond)                                                     \
  do {                                                                        \
    if (!(cond)) {                                                            \
      std::fprintf(stderr, "check failed at line %d: %s\n", __LINE__, #cond); \
      std::_Exit(1);                                                          \
    }                                                                         \
  } while (0)

// A neighbour worker: a process forked before the caller joins (a fork inherits a joined share)
// that obeys one-byte commands, answering each once it is done: 'j' join `slot` (answers 1 on
// success), 'b' busy, 'i' idle, 't' its CoreShareThreads(), 'q' exit, 'x' exit still busy (as a
// crashed worker would).
struct Neighbour {
  pid_t pid = -1;
  int to = -1, from = -1;

  static Neighbour Start(const std::string& path, int slot, int member = 0) {
    int cmd[2], ack[2];
    if (pipe(cmd) != 0 || pipe(ack) != 0) std::_Exit(2);
    Neighbour n;
    n.pid = fork();
    if (n.pid == 0) {
      close(cmd[1]);
      close(ack[0]);
      char c;
      while (read(cmd[0], &c, 1) == 1) {
        char reply = 1;
        if (c == 'j') reply = JoinCoreShare(path, slot, member).ok() ? 1 : 0;
        if (c == 'b') SetComputeBusy(true);
        if (c == 'i') SetComputeBusy(false);
        if (c == 't') reply = static_cast<char>(CoreShareThreads());
        if (c == 'q') SetComputeBusy(false);
        if (write(ack[1], &reply, 1) != 1) std::_Exit(4);
        if (c == 'q' || c == 'x') std::_Exit(0);
      }
      std::_Exit(0);
    }
    close(cmd[0]);
    close(ack[1]);
    n.to = cmd[1];
    n.from = ack[0];
    return n;
  }
  int Reply() const {
    char r = 0;
    CHILD_CHECK(read(from, &r, 1) == 1);
    return r;
  }
  int Ask(char c) const {
    CHILD_CHECK(write(to, &c, 1) == 1);
    return Reply();
  }
  void Exit(char how) {
    Ask(how);
    int status = 0;
    waitpid(pid, &status, 0);
    CHILD_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    close(to);
    close(from);
  }
};

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

}  // namespace
}  // namespace tripod
