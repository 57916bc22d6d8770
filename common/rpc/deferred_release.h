// Drops references on a thread of its own. gRPC must not destroy a channel on one of its own
// callback threads: the channel's destructor shuts down the channel's callback completion queue
// and joins gRPC threads, possibly the one it runs on (grpc/grpc#37858 and #37198; with Debian's
// gRPC 1.51 it corrupted the heap: a double free under ASan, a bad free under TSan). Whatever may
// hold the last reference to a channel (a worker's stubs, a finished call's ClientContext) and can
// be let go from a callback is handed here instead.
#pragma once

#include <chrono>
#include <memory>

namespace tripod {

// Keeps `what` alive until the release thread drops it, at once. Any thread; never blocks on it.
void ReleaseLater(std::shared_ptr<void> what);

// Waits, at most `timeout`, until everything handed over so far is dropped: for orderly exits
// and tests. True when it was.
bool FlushReleases(std::chrono::milliseconds timeout);

}  // namespace tripod
