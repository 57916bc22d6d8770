// The prefill worker's Prometheus metrics, named after vLLM's with the prefix `tripod:` and the
// label role="prefill" (the scheduler's and the decode worker's use the same names where the
// meaning is the same): requests by outcome, prompt tokens, queue, prefill and end-to-end time
// (histograms, seconds), running and waiting requests; and ours: POP layers skipped and the
// prefill FLOPs they saved, KV bytes and chunks sent, transfer time and its tail (the part not
// hidden under compute), transfers failed; and the process's own (unlabelled).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "common/compute/plan.h"
#include "common/metrics/metrics.h"
#include "common/model/model_config.h"
#include "prefill_node/prefill_queue.h"

namespace tripod {

// The FLOPs (multiply and add counted separately) that running `plan` over n_tokens tokens at
// positions 0..n_tokens-1 did not spend against the full model: POP's K/V-only layers still
// project K and V but skip the rest; kSkip layers (POP's nokv and shortgpt controls) skip all of
// it. See the formula in prefill_metrics.cc.
double PopFlopsSaved(const ModelConfig& config, const ForwardPlan& plan, int n_tokens);

class PrefillMetrics {
 public:
  // Registers the metrics, and the process's, on `registry`; `config` is the served model's
  // (for the FLOPs saved), copied.
  PrefillMetrics(metrics::Registry& registry, const ModelConfig& config);
  // The queue's gauges, read at scrape time: `queue` must outlive the registry's scrapes.
  void AddQueueGauges(const PrefillQueue& queue);

  // One Prefill.Run call ended with `status` (OK, the engine's or decode side's error, or a
  // refusal before it was queued).
  void RequestDone(const absl::Status& status);
  // A job that ran (whatever its status).
  void JobDone(const PrefillJob& job, const PrefillOutcome& outcome);

 private:
  metrics::Registry& registry_;
  const ModelConfig config_;
  metrics::Counter& prompt_tokens_;
  metrics::Histogram& queue_;
  metrics::Histogram& prefill_;
  metrics::Histogram& e2e_;
  metrics::Counter& layers_skipped_;
  metrics::Counter& flops_saved_;
  metrics::Counter& bytes_;
  metrics::Counter& chunks_;
  metrics::Histogram& transfer_;
  metrics::Histogram& tail_;
};

}  // namespace tripod
