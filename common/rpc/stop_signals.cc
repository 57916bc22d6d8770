// Stop signals; see stop_signals.h.
#include "common/rpc/stop_signals.h"

#include <csignal>
#include <cstdint>
#include <ctime>

namespace tripod {

sigset_t BlockStopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  return set;
}

bool WaitStopSignal(const sigset_t& set, absl::Duration timeout) {
  if (timeout == absl::InfiniteDuration()) {
    int sig = 0;
    return sigwait(&set, &sig) == 0;
  }
  if (timeout < absl::ZeroDuration()) timeout = absl::ZeroDuration();
  const int64_t ns = absl::ToInt64Nanoseconds(timeout);
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  siginfo_t info;
  return sigtimedwait(&set, &info, &ts) > 0;
}

}  // namespace tripod
