// PrefillWorker; see prefill_worker.h.
#include "prefill_node/prefill_worker.h"

#include "absl/time/time.h"

namespace tripod {

PrefillWorker::PrefillWorker(PrefillEngine& engine, metrics::Registry* registry,
                             const PrefillWorkerOptions& options)
    : engine_(engine) {
  if (registry != nullptr) {
    metrics_ = std::make_unique<PrefillMetrics>(*registry, engine.model().config);
  }
  OpenKvSender open_sender = PushKvSenders(
      [this](const std::string& address, const std::string& tls_name) {
        return channels_.Get(address, tls_name);
      },
      options.transfer);
  PrefillQueue::Options qo;
  qo.name = "prefill";
  qo.max_queue = options.max_queue;
  queue_ = std::make_unique<PrefillQueue>(
      [this, open_sender = std::move(open_sender)](const PrefillJob& job, CancelToken& cancel) {
        RunnerResult r = RunPrefillJob(engine_, open_sender, job, cancel);
        if (metrics_ == nullptr) return r;
        if (!r.finish) {
          metrics_->JobDone(job, r.outcome);
          return r;
        }
        r.finish = [this, &job, finish = std::move(r.finish)] {
          PrefillOutcome o = finish();
          metrics_->JobDone(job, o);
          return o;
        };
        return r;
      },
      qo);
  if (metrics_ != nullptr) metrics_->AddQueueGauges(*queue_);
}

PrefillWorker::~PrefillWorker() { queue_->Shutdown(absl::ZeroDuration()); }

}  // namespace tripod
