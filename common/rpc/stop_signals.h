// How every Tripod process hears SIGTERM and SIGINT: blocked in all threads (call
// BlockStopSignals first thing in main, before any thread starts, so that gRPC's, OpenMP's and
// the HTTP server's threads inherit the mask) and taken by the main thread with WaitStopSignal,
// which then drains. SIGPIPE is ignored: a peer that hangs up is an error on the socket, not the
// end of the process.
#pragma once

#include <signal.h>

#include "absl/time/time.h"

namespace tripod {

// Blocks SIGTERM and SIGINT in the calling thread (and every thread it starts later), ignores
// SIGPIPE, and returns the set to wait on.
sigset_t BlockStopSignals();

// Waits at most `timeout` for a signal of `set`; true when one came. absl::InfiniteDuration():
// until one comes.
bool WaitStopSignal(const sigset_t& set, absl::Duration timeout);

}  // namespace tripod
