// PrefillWorker: what a prefill process serves, without the wire: the engine, its queue (jobs run
// on the queue's engine thread, KV streamed to decode workers over cached channels) and the
// metrics of every job. The gRPC service (prefill_service.h) is a thin adapter over it.
// Thread-safe, but for engine(), whose Run belongs to the engine thread.
#pragma once

#include <memory>

#include "common/kv_transfer/kv_sender_factory.h"
#include "common/metrics/metrics.h"
#include "prefill_node/channel_cache.h"
#include "prefill_node/prefill_engine.h"
#include "prefill_node/prefill_job.h"
#include "prefill_node/prefill_metrics.h"
#include "prefill_node/prefill_queue.h"

namespace tripod {

struct PrefillWorkerOptions {
  int max_queue = 64;
  TransferOptions transfer;
};

class PrefillWorker {
 public:
  // `engine` and `registry` must outlive the worker; `registry` may be null (no metrics). Its
  // queue gauges read the worker: no scrapes once the worker is gone.
  PrefillWorker(PrefillEngine& engine, metrics::Registry* registry,
                const PrefillWorkerOptions& options);
  ~PrefillWorker();  // shuts the queue down at once (cancelling what runs)

  const PrefillEngine& engine() const { return engine_; }
  PrefillQueue& queue() { return *queue_; }
  const PrefillQueue& queue() const { return *queue_; }
  PrefillMetrics* metrics() { return metrics_.get(); }

 private:
  PrefillEngine& engine_;
  ChannelCache channels_;
  std::unique_ptr<PrefillMetrics> metrics_;
  std::unique_ptr<PrefillQueue> queue_;
};

}  // namespace tripod
