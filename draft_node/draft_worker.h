// DraftWorker: a DraftEngine behind the shared job queue (common/rpc/job_queue.h): requests run
// one at a time on the queue's engine thread, up to a bound on how many may wait. A request waits
// on its caller's thread (a gRPC handler); one that is cancelled or whose deadline passes while
// it waits leaves the queue, and one that runs stops at the engine's next chunk. On shutdown new
// requests are refused and the waiting ones are given a grace period.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/rpc/job_queue.h"
#include "draft_node/draft_engine.h"
#include "draft_node/draft_metrics.h"

namespace tripod {

struct DraftOutcome {
  absl::Status status;
  DraftResult result;
  double queue_s = 0, total_s = 0;
};

struct DraftJob {
  uint64_t request_id = 0;                // anonymous: a Score is cancelled through its caller
  const DraftRequest* request = nullptr;  // the caller's, who waits for the job to end
  std::chrono::steady_clock::time_point accepted;
};

class DraftWorker {
 public:
  // `engine` and `metrics` (may be null) must outlive the worker.
  DraftWorker(DraftEngine& engine, DraftMetrics* metrics, int max_queue);

  DraftEngine& engine() const { return engine_; }

  // Waits for the engine (RESOURCE_EXHAUSTED when max_queue requests already wait, UNAVAILABLE
  // while draining), then runs the request: CANCELLED when `cancelled` says so, DEADLINE_EXCEEDED
  // past `deadline`, waiting or running.
  absl::StatusOr<DraftOutcome> Run(const DraftRequest& request, absl::Time deadline,
                                   const std::function<bool()>& cancelled);

  // Refuses new requests and waits up to `grace` for the queued and running ones.
  void Shutdown(absl::Duration grace) { queue_.Shutdown(grace); }
  // What the process drains on SIGTERM (drain.h).
  Drainable& drainable() { return queue_; }

  int queued() const { return queue_.queued(); }
  int running() const { return queue_.running(); }
  bool draining() const { return queue_.draining(); }

 private:
  DraftEngine& engine_;
  JobQueue<DraftJob, DraftOutcome> queue_;
};

}  // namespace tripod
