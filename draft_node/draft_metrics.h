// The draft worker's Prometheus metrics, with the prefix `tripod:` and the label role="draft", as
// the other workers': requests by outcome, prompt and lookahead tokens, queue, draft and
// end-to-end time (histograms, seconds), waiting and running requests; and the process's.
#pragma once

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "common/metrics/metrics.h"
#include "draft_node/draft_engine.h"

namespace tripod {

class DraftMetrics {
 public:
  explicit DraftMetrics(metrics::Registry& registry);
  // Gauges read at scrape time from the worker's counts.
  void AddQueueGauges(std::function<int()> queued, std::function<int()> running,
                      std::function<bool()> draining);
  // One Draft.Score call ended with `status`.
  void RequestDone(const absl::Status& status);
  // A request the engine ran to the end.
  void RanRequest(const DraftRequest& request, const DraftResult& result, double queue_s,
                  double total_s);

 private:
  metrics::Registry& registry_;
  metrics::Counter& prompt_tokens_;
  metrics::Counter& lookahead_tokens_;
  metrics::Histogram& queue_;
  metrics::Histogram& draft_;
  metrics::Histogram& lookahead_;
  metrics::Histogram& e2e_;
};

}  // namespace tripod
