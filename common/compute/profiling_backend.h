// Per-op timing for any Backend: a decorator that times each call and, when it is destroyed,
// prints a table (op, calls, rows, total ms, share, and the time between ops by length) to
// stderr, headed by the process's logger name and pid. Turned on by the environment
// variable TRIPOD_PROFILE=1 where engines make their backend (MaybeProfile), so that a slow
// step can be taken apart without a sampling profiler. Calls are timed on the host clock, which
// is right for the CPU backend (synchronous); an asynchronous backend would need its own events.
#pragma once

#include <cstdio>
#include <memory>

#include "common/compute/backend.h"

namespace tripod {

// Wraps `inner` in the profiler, which writes its table to `out` when destroyed. Linear calls
// are named by their matrix's shape.
std::unique_ptr<Backend> MakeProfilingBackend(std::unique_ptr<Backend> inner,
                                              std::FILE* out = stderr);

// A profiler over `inner` (owned elsewhere, outliving it) that waits for the backend before and
// after each op, so that an asynchronous backend's (the GPU's) ops are timed one by one. The
// waits themselves slow the whole down: for taking a step apart, not for its total.
std::unique_ptr<Backend> MakeSynchronizedProfile(Backend& inner, std::FILE* out = stdout);

// `inner` itself, or wrapped when TRIPOD_PROFILE is set to anything but "" or "0".
std::unique_ptr<Backend> MaybeProfile(std::unique_ptr<Backend> inner);

}  // namespace tripod
