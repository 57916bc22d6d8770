// Drain; see drain.h.
#include "common/rpc/drain.h"

#include <algorithm>

#include "absl/time/clock.h"
#include "common/rpc/stop_signals.h"
#include "spdlog/spdlog.h"

namespace tripod {

void Drain(Drainable& work, absl::Duration grace, const sigset_t& signals, absl::Duration poll) {
  spdlog::info("draining ({} in flight, grace {} ms)", work.InFlight(),
               absl::ToInt64Milliseconds(grace));
  work.StartDraining();
  const absl::Time until = absl::Now() + grace;
  while (work.InFlight() > 0 && absl::Now() < until) {
    if (WaitStopSignal(signals, std::min(poll, until - absl::Now()))) {
      spdlog::info("second signal, cutting the grace period short");
      break;
    }
  }
  if (const int left = work.InFlight(); left > 0)
    spdlog::info("cancelling {} still in flight", left);
  work.CancelAll();
}

}  // namespace tripod
