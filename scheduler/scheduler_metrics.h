// The scheduler's Prometheus metrics, named after vLLM's with the prefix `tripod:` and the label
// role="scheduler": time to first token, inter-token latency, end-to-end latency, queue time,
// prefill and decode time (histograms, seconds), prompt and generation tokens, requests by
// finish reason, running and waiting requests, KV bytes moved, prefill retries and fallbacks,
// workers in routing; the compression methods' draft time, requests by method and outcome, KV
// bytes saved by trimming and prompt tokens dropped; and the process's own. Every duration is
// measured on this process's clock (prefill and decode time as the workers measured them on
// theirs).
#pragma once

#include <functional>
#include <string>

#include "common/metrics/metrics.h"
#include "scheduler/completion_events.h"

namespace tripod::scheduler {

class SchedulerMetrics {
 public:
  explicit SchedulerMetrics(metrics::Registry& registry);

  void RequestStarted(double queue_s);
  void FirstToken(double ttft_s);
  void InterToken(double itl_s);
  // finish: stop | length | cancelled (the client left) | error | rejected (a 4xx/5xx before
  // anything ran; `status` is its HTTP status).
  void RequestEnded(const std::string& finish, const UsageCounts& usage, const StageTimes& times);
  void Rejected(int http_status);
  void PrefillRetried(const std::string& why);  // to another prefill worker or local
  void DecodeRerouted();  // a decode worker failed its Reserve: another one took the request
  void Migrated();        // a stream moved to another decode worker after its own died
  void KvBytes(double bytes);

  // Gauges read at scrape time.
  void AddGauges(std::function<double()> running, std::function<double()> waiting,
                 std::function<double(int role)> healthy_workers);

  metrics::Registry& registry() { return registry_; }

 private:
  metrics::Registry& registry_;
  metrics::Histogram& ttft_;
  metrics::Histogram& itl_;
  metrics::Histogram& e2e_;
  metrics::Histogram& queue_;
  metrics::Histogram& prefill_;
  metrics::Histogram& decode_;
  metrics::Counter& prompt_tokens_;
  metrics::Counter& generation_tokens_;
  metrics::Counter& cached_tokens_;
  metrics::Counter& kv_bytes_;
  metrics::Histogram& draft_;
  metrics::Counter& kv_bytes_saved_;
  metrics::Counter& prompt_tokens_dropped_;
  metrics::Counter& decode_reroutes_;
  metrics::Counter& migrations_;
};

}  // namespace tripod::scheduler
