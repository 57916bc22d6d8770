#include "draft_node/draft_worker.h"

#include "absl/strings/str_cat.h"

namespace tripod {

DraftWorker::DraftWorker(DraftEngine& engine, DraftMetrics* metrics, int max_queue)
    : engine_(engine), metrics_(metrics), max_queue_(max_queue) {}

absl::StatusOr<DraftOutcome> DraftWorker::Run(const DraftRequest& request, absl::Time deadline,
                                              const std::function<bool()>& cancelled) {
  const absl::Time accepted = absl::Now();
  {
    MutexLock lock(&mu_);
    if (draining_) return absl::UnavailableError("draft worker: draining, no new work");
    if (waiting_ >= max_queue_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("draft worker: ", waiting_, " requests already wait (--max_queue)"));
    }
    ++waiting_;
    // Poll for a cancel while waiting: the caller's client may go away (gRPC's sync API has no
    // callback for it).
    while (busy_) {
      cv_.WaitWithTimeout(&mu_, absl::Milliseconds(20));
      if (!busy_) break;
      if (cancelled && cancelled()) {
        --waiting_;
        cv_.SignalAll();
        return absl::CancelledError("draft worker: the client cancelled while waiting");
      }
      if (absl::Now() >= deadline) {
        --waiting_;
        cv_.SignalAll();
        return absl::DeadlineExceededError("draft worker: the deadline passed while waiting");
      }
    }
    --waiting_;
    busy_ = true;
  }
  const absl::Time started = absl::Now();
  absl::StatusOr<DraftResult> r = engine_.Score(request);
  {
    MutexLock lock(&mu_);
    busy_ = false;
    cv_.SignalAll();
  }
  if (!r.ok()) return r.status();
  DraftOutcome o;
  o.result = *std::move(r);
  o.queue_s = absl::ToDoubleSeconds(started - accepted);
  o.total_s = absl::ToDoubleSeconds(absl::Now() - accepted);
  if (metrics_ != nullptr) metrics_->RanRequest(request, o.result, o.queue_s, o.total_s);
  return o;
}

void DraftWorker::Shutdown(absl::Duration grace) {
  MutexLock lock(&mu_);
  draining_ = true;
  const absl::Time until = absl::Now() + grace;
  while ((waiting_ > 0 || busy_) && absl::Now() < until) cv_.WaitWithDeadline(&mu_, until);
}

int DraftWorker::queued() const {
  MutexLock lock(&mu_);
  return waiting_;
}

int DraftWorker::running() const {
  MutexLock lock(&mu_);
  return busy_ ? 1 : 0;
}

bool DraftWorker::draining() const {
  MutexLock lock(&mu_);
  return draining_;
}

}  // namespace tripod
