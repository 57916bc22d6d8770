// The prefill worker's Prometheus metrics (prefix tripod_prefill_): requests by outcome, prompt
// tokens, compute and queue time, KV bytes and chunks sent, the transfer's tail (the part not
// hidden under compute), the queue's length and the running request, and the process's own.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "common/metrics/metrics.h"
#include "prefill_node/prefill_queue.h"

namespace tripod {

class PrefillMetrics {
 public:
  // Registers the metrics, and the process's, on `registry`.
  explicit PrefillMetrics(metrics::Registry& registry);
  // The queue's gauges, read at scrape time: `queue` must outlive the registry's scrapes.
  void AddQueueGauges(const PrefillQueue& queue);

  // One Prefill.Run call ended with `status` (OK, the engine's or decode side's error, or a
  // refusal before it was queued).
  void RequestDone(const absl::Status& status);
  // A job that ran (whatever its status).
  void JobDone(int prompt_tokens, const PrefillOutcome& outcome);

  // "ok", "cancelled", "invalid_argument", ...: the status code's name in lower case.
  static std::string OutcomeLabel(const absl::Status& status);

 private:
  metrics::Registry& registry_;
  metrics::Counter& prompt_tokens_;
  metrics::Histogram& compute_seconds_;
  metrics::Histogram& queue_seconds_;
  metrics::Counter& transfer_bytes_;
  metrics::Counter& transfer_chunks_;
  metrics::Histogram& transfer_tail_seconds_;
};

}  // namespace tripod
