// PrefillMetrics; see prefill_metrics.h.
#include "prefill_node/prefill_metrics.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "common/metrics/metric_scheme.h"

namespace tripod {
namespace {

const metrics::Labels kRole = {{"role", "prefill"}};

metrics::Labels With(const std::string& name, const std::string& value) {
  return metrics::RoleWith(kRole, name, value);
}

constexpr char kRequests[] = "tripod:prefill_requests_total";
constexpr char kRequestsHelp[] = "Prefill.Run calls by outcome (the status code, lower case)";
constexpr char kFailures[] = "tripod:kv_transfer_failures_total";
constexpr char kFailuresHelp[] =
    "KV transfers of jobs that ran and did not end OK (the decode side refused or went away, the "
    "job was cancelled or failed), by status code (lower case)";

}  // namespace

// Per K/V-only layer, for m tokens at positions 0..m-1 (d = d_model, q = n_heads * head_dim,
// f = d_ff, h = n_heads, hd = head_dim; a multiply-add is 2 FLOPs):
//   m * (2*d*q [Q projection] + 2*q*d [attention output] + 3 * 2*d*f [gate, up, down])
//   + 2 * 2*h*hd * m*(m+1)/2 [QK^T and PV over the causal triangle].
// The K and V projections are still spent (the layer's KV is what the decode side needs), as are
// norms and RoPE (not counted anywhere: prefill_flops.h); a kSkip layer (POP's nokv and shortgpt
// controls) saves them too, m * 2*d*2*kv. Equals PrefillFlops(full) - PrefillFlops(plan).
double PopFlopsSaved(const ModelConfig& c, const ForwardPlan& plan, int n_tokens) {
  const double d = c.d_model, q = c.q_dim(), f = c.d_ff;
  const double m = n_tokens;
  const double linear = m * (2 * d * q + 2 * q * d + 3 * 2 * d * f);
  const double attention = 2 * 2 * c.n_heads * static_cast<double>(c.head_dim) * (m * (m + 1) / 2);
  const double kv = m * 2 * d * 2 * c.kv_dim();
  return plan.count(LayerMode::kKvOnly) * (linear + attention) +
         plan.count(LayerMode::kSkip) * (linear + attention + kv);
}

PrefillMetrics::PrefillMetrics(metrics::Registry& r, const ModelConfig& config)
    : registry_(r),
      config_(config),
      prompt_tokens_(r.AddCounter("tripod:prompt_tokens_total",
                                  "Prompt tokens of the requests that ran", kRole)),
      queue_(r.AddHistogram("tripod:request_queue_time_seconds",
                            "Time from acceptance to the start of compute",
                            metrics::LatencyBuckets(), kRole)),
      prefill_(r.AddHistogram("tripod:request_prefill_time_seconds",
                              "Forward time of a request (the KV hand-over under it)",
                              metrics::LatencyBuckets(), kRole)),
      e2e_(r.AddHistogram("tripod:e2e_request_latency_seconds",
                          "Time from acceptance to the decode side's acknowledgement",
                          metrics::LatencyBuckets(), kRole)),
      layers_skipped_(
          r.AddCounter("tripod:pop_layers_skipped_total",
                       "Layers POP ran K/V-only, summed over the requests that ended OK", kRole)),
      flops_saved_(r.AddCounter(
          "tripod:prefill_flops_saved_total",
          "FLOPs the K/V-only layers did not spend (Q and output projections, FFN, attention) over "
          "the prompt tokens but the last, for requests that ended OK",
          kRole)),
      bytes_(r.AddCounter("tripod:kv_transfer_bytes_total",
                          "KV payload bytes sent to decode workers", kRole)),
      chunks_(r.AddCounter("tripod:kv_transfer_chunks_total",
                           "KV data chunks sent to decode workers", kRole)),
      transfer_(
          r.AddHistogram("tripod:kv_transfer_seconds",
                         "Time from the first KV message handed to the stream to the decode side's "
                         "acknowledgement (under the compute)",
                         metrics::ExponentialBuckets(0.001, 2, 16), kRole)),
      tail_(r.AddHistogram(
          "tripod:kv_transfer_tail_seconds",
          "Time from the end of compute to the decode side's acknowledgement (the transfer not "
          "hidden under compute)",
          metrics::ExponentialBuckets(0.0005, 2, 16), kRole)) {
  // The usual outcomes, so that their series exist (at zero) before the first of each.
  for (absl::StatusCode code :
       {absl::StatusCode::kOk, absl::StatusCode::kCancelled, absl::StatusCode::kInvalidArgument,
        absl::StatusCode::kDeadlineExceeded, absl::StatusCode::kResourceExhausted,
        absl::StatusCode::kFailedPrecondition, absl::StatusCode::kUnavailable,
        absl::StatusCode::kInternal}) {
    r.AddCounter(kRequests, kRequestsHelp,
                 With("outcome", metrics::StatusLabel(absl::Status(code, "x"))));
  }
  for (absl::StatusCode code : {absl::StatusCode::kCancelled, absl::StatusCode::kDeadlineExceeded,
                                absl::StatusCode::kUnavailable, absl::StatusCode::kInternal}) {
    r.AddCounter(kFailures, kFailuresHelp,
                 With("reason", metrics::StatusLabel(absl::Status(code, "x"))));
  }
  r.AddProcessMetrics();
}

void PrefillMetrics::AddQueueGauges(const PrefillQueue& queue) {
  metrics::Registry& r = registry_;
  r.AddCallbackGauge("tripod:num_requests_waiting", "Requests waiting for the engine", kRole,
                     [&queue] { return static_cast<double>(queue.queued()); });
  r.AddCallbackGauge("tripod:num_requests_running", "Requests the engine is running (0 or 1)",
                     kRole, [&queue] { return static_cast<double>(queue.running()); });
  r.AddCallbackGauge("tripod:draining", "1 while the worker shuts down", kRole,
                     [&queue] { return queue.draining() ? 1.0 : 0.0; });
}

void PrefillMetrics::RequestDone(const absl::Status& status) {
  registry_.AddCounter(kRequests, kRequestsHelp, With("outcome", metrics::StatusLabel(status)))
      .Inc();
}

void PrefillMetrics::JobDone(const PrefillJob& job, const PrefillOutcome& o) {
  prompt_tokens_.Inc(static_cast<double>(job.prompt.size()));
  queue_.Observe(o.queue_s);
  prefill_.Observe(o.compute_s);
  e2e_.Observe(o.total_s);
  bytes_.Inc(static_cast<double>(o.bytes_sent));
  chunks_.Inc(o.chunks_sent);
  if (!o.status.ok()) {
    registry_.AddCounter(kFailures, kFailuresHelp, With("reason", metrics::StatusLabel(o.status)))
        .Inc();
    return;
  }
  // prefilled_tokens: the prompt but its last token (the decode side runs that one in full).
  layers_skipped_.Inc(job.plan.count(LayerMode::kKvOnly));
  flops_saved_.Inc(PopFlopsSaved(config_, job.plan, o.prefilled_tokens));
  transfer_.Observe(o.transfer_s);
  tail_.Observe(o.tail_s);
}

}  // namespace tripod
