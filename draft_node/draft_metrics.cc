#include "draft_node/draft_metrics.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "common/metrics/metric_scheme.h"

namespace tripod {
namespace {

const metrics::Labels kRole = {{"role", "draft"}};
constexpr char kRequests[] = "tripod:draft_requests_total";
constexpr char kRequestsHelp[] = "Draft.Score calls by outcome (the status code, lower case)";

}  // namespace

DraftMetrics::DraftMetrics(metrics::Registry& r)
    : registry_(r),
      prompt_tokens_(r.AddCounter("tripod:prompt_tokens_total",
                                  "Prompt tokens of the requests that ran", kRole)),
      lookahead_tokens_(r.AddCounter("tripod:draft_lookahead_tokens_total",
                                     "Lookahead tokens the draft generated", kRole)),
      queue_(r.AddHistogram("tripod:request_queue_time_seconds",
                            "Time from acceptance to the start of compute",
                            metrics::LatencyBuckets(), kRole)),
      draft_(r.AddHistogram("tripod:request_draft_time_seconds",
                            "The draft's forward passes over the prompt and their scoring",
                            metrics::LatencyBuckets(), kRole)),
      lookahead_(r.AddHistogram("tripod:request_lookahead_time_seconds",
                                "The draft's greedy lookahead tokens", metrics::LatencyBuckets(),
                                kRole)),
      e2e_(r.AddHistogram("tripod:e2e_request_latency_seconds",
                          "Time from acceptance to the importance map", metrics::LatencyBuckets(),
                          kRole)) {
  for (absl::StatusCode code :
       {absl::StatusCode::kOk, absl::StatusCode::kCancelled, absl::StatusCode::kInvalidArgument,
        absl::StatusCode::kDeadlineExceeded, absl::StatusCode::kResourceExhausted,
        absl::StatusCode::kUnavailable, absl::StatusCode::kOutOfRange}) {
    r.AddCounter(
        kRequests, kRequestsHelp,
        metrics::RoleWith(kRole, "outcome", metrics::StatusLabel(absl::Status(code, "x"))));
  }
  r.AddProcessMetrics();
}

void DraftMetrics::AddQueueGauges(std::function<int()> queued, std::function<int()> running,
                                  std::function<bool()> draining) {
  registry_.AddCallbackGauge("tripod:num_requests_waiting", "Requests waiting for the engine",
                             kRole, [f = std::move(queued)] { return static_cast<double>(f()); });
  registry_.AddCallbackGauge("tripod:num_requests_running",
                             "Requests the engine is running (0 or 1)", kRole,
                             [f = std::move(running)] { return static_cast<double>(f()); });
  registry_.AddCallbackGauge("tripod:draining", "1 while the worker shuts down", kRole,
                             [f = std::move(draining)] { return f() ? 1.0 : 0.0; });
}

void DraftMetrics::RequestDone(const absl::Status& status) {
  registry_
      .AddCounter(kRequests, kRequestsHelp,
                  metrics::RoleWith(kRole, "outcome", metrics::StatusLabel(status)))
      .Inc();
}

void DraftMetrics::RanRequest(const DraftRequest& request, const DraftResult& result,
                              double queue_s, double total_s) {
  prompt_tokens_.Inc(static_cast<double>(request.prompt.size()));
  lookahead_tokens_.Inc(static_cast<double>(result.lookahead.size()));
  queue_.Observe(queue_s);
  draft_.Observe(result.prefill_s);
  lookahead_.Observe(result.lookahead_s);
  e2e_.Observe(total_s);
}

}  // namespace tripod
