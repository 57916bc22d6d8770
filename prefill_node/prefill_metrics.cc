// PrefillMetrics; see prefill_metrics.h.
#include "prefill_node/prefill_metrics.h"

#include "absl/strings/ascii.h"

namespace tripod {
namespace {

constexpr char kRequests[] = "tripod_prefill_requests_total";
constexpr char kRequestsHelp[] = "Prefill.Run calls by outcome (the status code, lower case)";

}  // namespace

std::string PrefillMetrics::OutcomeLabel(const absl::Status& status) {
  return absl::AsciiStrToLower(absl::StatusCodeToString(status.code()));
}

PrefillMetrics::PrefillMetrics(metrics::Registry& r)
    : registry_(r),
      prompt_tokens_(r.AddCounter("tripod_prefill_prompt_tokens_total",
                                  "Prompt tokens of the requests that ran")),
      compute_seconds_(r.AddHistogram("tripod_prefill_compute_seconds",
                                      "Forward time of a request (with the KV hand-over)",
                                      metrics::ExponentialBuckets(0.005, 2, 14))),
      queue_seconds_(r.AddHistogram("tripod_prefill_queue_seconds",
                                    "Time from acceptance to the start of compute",
                                    metrics::ExponentialBuckets(0.001, 2, 16))),
      transfer_bytes_(r.AddCounter("tripod_prefill_transfer_bytes_total",
                                   "KV payload bytes sent to decode workers")),
      transfer_chunks_(r.AddCounter("tripod_prefill_transfer_chunks_total",
                                    "KV data chunks sent to decode workers")),
      transfer_tail_seconds_(r.AddHistogram(
          "tripod_prefill_transfer_tail_seconds",
          "Time from the end of compute to the decode side's acknowledgement (the transfer not "
          "hidden under compute)",
          metrics::ExponentialBuckets(0.0005, 2, 16))) {
  // The usual outcomes, so that their series exist (at zero) before the first of each.
  for (absl::StatusCode code :
       {absl::StatusCode::kOk, absl::StatusCode::kCancelled, absl::StatusCode::kInvalidArgument,
        absl::StatusCode::kDeadlineExceeded, absl::StatusCode::kResourceExhausted,
        absl::StatusCode::kFailedPrecondition, absl::StatusCode::kUnavailable,
        absl::StatusCode::kInternal}) {
    r.AddCounter(kRequests, kRequestsHelp, {{"outcome", OutcomeLabel(absl::Status(code, "x"))}});
  }
  r.AddProcessMetrics();
}

void PrefillMetrics::AddQueueGauges(const PrefillQueue& queue) {
  metrics::Registry& r = registry_;
  r.AddCallbackGauge("tripod_prefill_queue_length", "Requests waiting for the engine", {},
                     [&queue] { return static_cast<double>(queue.queued()); });
  r.AddCallbackGauge("tripod_prefill_running", "Requests the engine is running (0 or 1)", {},
                     [&queue] { return static_cast<double>(queue.running()); });
  r.AddCallbackGauge("tripod_prefill_draining", "1 while the worker shuts down", {},
                     [&queue] { return queue.draining() ? 1.0 : 0.0; });
}

void PrefillMetrics::RequestDone(const absl::Status& status) {
  registry_.AddCounter(kRequests, kRequestsHelp, {{"outcome", OutcomeLabel(status)}}).Inc();
}

void PrefillMetrics::JobDone(int prompt_tokens, const PrefillOutcome& o) {
  prompt_tokens_.Inc(prompt_tokens);
  queue_seconds_.Observe(o.queue_s);
  compute_seconds_.Observe(o.compute_s);
  transfer_bytes_.Inc(static_cast<double>(o.bytes_sent));
  transfer_chunks_.Inc(o.chunks_sent);
  if (o.status.ok()) transfer_tail_seconds_.Observe(o.tail_s);
}

}  // namespace tripod
