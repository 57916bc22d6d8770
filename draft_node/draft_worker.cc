// DraftWorker; see draft_worker.h.
#include "draft_node/draft_worker.h"

#include <algorithm>
#include <utility>

namespace tripod {
namespace {

JobQueue<DraftJob, DraftOutcome>::Options QueueOptions(int max_queue) {
  JobQueue<DraftJob, DraftOutcome>::Options o;
  o.name = "draft";
  o.max_queue = max_queue;
  return o;
}

}  // namespace

DraftWorker::DraftWorker(DraftEngine& engine, DraftMetrics* metrics, int max_queue)
    : engine_(engine),
      queue_(
          [this, metrics](const DraftJob& job, CancelToken& cancel) {
            using Seconds = std::chrono::duration<double>;
            DraftOutcome o;
            o.queue_s = Seconds(std::chrono::steady_clock::now() - job.accepted).count();
            absl::StatusOr<DraftResult> r = engine_.Score(*job.request, &cancel);
            o.total_s = Seconds(std::chrono::steady_clock::now() - job.accepted).count();
            if (!r.ok()) {
              o.status = r.status();
              return JobRunResult<DraftOutcome>(std::move(o));
            }
            o.result = *std::move(r);
            if (metrics != nullptr) {
              metrics->RanRequest(*job.request, o.result, o.queue_s, o.total_s);
            }
            return JobRunResult<DraftOutcome>(std::move(o));
          },
          QueueOptions(max_queue)) {}

absl::StatusOr<DraftOutcome> DraftWorker::Run(const DraftRequest& request, absl::Time deadline,
                                              const std::function<bool()>& cancelled) {
  DraftJob job;
  job.request = &request;
  absl::StatusOr<std::shared_ptr<JobTicket<DraftJob, DraftOutcome>>> ticket =
      queue_.Submit(std::move(job));
  if (!ticket.ok()) return ticket.status();
  // Poll for a cancel while waiting: the caller's client may go away (gRPC's sync API has no
  // callback for it). A job that has started is cancelled too: the engine stops at its next
  // chunk, free for the requests behind it, rather than finish a map nobody will read.
  bool gave_up = false;
  bool past_deadline = false;
  while (!(*ticket)->WaitUntil(gave_up
                                   ? absl::InfiniteFuture()
                                   : std::min(deadline, absl::Now() + absl::Milliseconds(20)))) {
    const bool cancel = cancelled && cancelled();
    if (!cancel && absl::Now() < deadline) continue;
    if (queue_.CancelIfQueued(**ticket)) {
      return cancel
                 ? absl::CancelledError("draft worker: the client cancelled while waiting")
                 : absl::DeadlineExceededError("draft worker: the deadline passed while waiting");
    }
    past_deadline = !cancel;
    queue_.Cancel(**ticket);  // running: stop it, then wait for its end
    gave_up = true;
  }
  DraftOutcome o = (*ticket)->outcome();
  if (past_deadline && absl::IsCancelled(o.status)) {
    return absl::DeadlineExceededError(
        absl::StrCat("draft worker: the deadline passed while running (", o.status.message(), ")"));
  }
  if (!o.status.ok()) return o.status;
  return o;
}

}  // namespace tripod
