// DraftWorker: admission in front of a DraftEngine, which runs one request at a time. A request
// waits for the engine on its caller's thread (a gRPC handler), up to a bound on how many may
// wait; one that is cancelled or whose deadline passes while it waits leaves the queue; on
// shutdown new requests are refused and the waiting ones are given a grace period.
#pragma once

#include <functional>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/util/mutex.h"
#include "draft_node/draft_engine.h"
#include "draft_node/draft_metrics.h"

namespace tripod {

struct DraftOutcome {
  DraftResult result;
  double queue_s = 0, total_s = 0;
};

class DraftWorker {
 public:
  // `engine` and `metrics` (may be null) must outlive the worker.
  DraftWorker(DraftEngine& engine, DraftMetrics* metrics, int max_queue);

  DraftEngine& engine() const { return engine_; }

  // Waits for the engine (RESOURCE_EXHAUSTED when max_queue requests already wait, UNAVAILABLE
  // while draining, CANCELLED when `cancelled` says so or DEADLINE_EXCEEDED past `deadline`
  // while waiting), then runs the request.
  absl::StatusOr<DraftOutcome> Run(const DraftRequest& request, absl::Time deadline,
                                   const std::function<bool()>& cancelled);

  // Refuses new requests and waits up to `grace` for the queued and running ones.
  void Shutdown(absl::Duration grace);

  int queued() const;
  int running() const;
  bool draining() const;

 private:
  DraftEngine& engine_;
  DraftMetrics* metrics_;
  const int max_queue_;
  mutable Mutex mu_;  // common/util/mutex.h: TSan sees it
  CondVar cv_;        // signalled when the engine falls free or a waiter leaves
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tripod
