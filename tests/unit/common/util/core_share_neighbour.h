// A neighbour worker for the core share's tests (core_share.h): a real process, forked before
// the test's process joins (a fork inherits a joined share), that joins a slot and marks itself
// busy or idle, with work queued or not, on command. Joining is for a process's lifetime, so the
// tests that use it run in a child of their own (EXPECT_EXIT).
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/util/core_share.h"

namespace tripod {

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
// success), 'b' busy, 'i' idle, 't' its CoreShareThreads(), 'Q' work queued, 'E' none queued,
// 'o' its CoreShareOthersBacklogged(), 'q' exit, 'x' exit still busy (as a crashed worker would).
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
        if (c == 'Q') SetCoreShareBacklog(true);
        if (c == 'E') SetCoreShareBacklog(false);
        if (c == 'o') reply = CoreShareOthersBacklogged() ? 1 : 0;
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

}  // namespace tripod
