// DecodeMetrics; see decode_metrics.h.
#include "decode_node/decode_metrics.h"

#include <utility>

#include "absl/strings/ascii.h"

namespace tripod {
namespace {

constexpr char kRequests[] = "tripod_decode_requests_total";
constexpr char kRequestsHelp[] =
    "Generate calls by finish reason (rejected: refused before anything streamed)";
constexpr char kReserves[] = "tripod_decode_reserve_requests_total";
constexpr char kReservesHelp[] = "Reserve calls by outcome (the status code, lower case)";
constexpr char kFailures[] = "tripod_decode_kv_transfer_failures_total";
constexpr char kFailuresHelp[] =
    "KV transfers that ended without being adopted, by reason (chunk_rejected, stream_ended, "
    "mismatch, expired, cancelled)";

}  // namespace

std::string DecodeMetrics::OutcomeLabel(const absl::Status& status) {
  return absl::AsciiStrToLower(absl::StatusCodeToString(status.code()));
}

DecodeMetrics::DecodeMetrics(metrics::Registry& r)
    : registry_(r),
      prompt_tokens_(r.AddCounter("tripod_decode_prompt_tokens_total",
                                  "Prompt tokens of the Generate calls that ran")),
      generated_tokens_(
          r.AddCounter("tripod_decode_generated_tokens_total", "Tokens generated and streamed")),
      cached_tokens_(r.AddCounter("tripod_decode_prefix_cached_tokens_total",
                                  "Prompt tokens whose KV came from the prefix cache")),
      ttft_seconds_(r.AddHistogram(
          "tripod_decode_ttft_seconds",
          "Time from accepting a Generate call (KV transfer wait included) to its first token",
          metrics::ExponentialBuckets(0.005, 2, 16))),
      tpot_seconds_(r.AddHistogram("tripod_decode_time_per_output_token_seconds",
                                   "Mean time between a request's tokens after the first",
                                   metrics::ExponentialBuckets(0.001, 2, 14))),
      queue_seconds_(r.AddHistogram(
          "tripod_decode_queue_seconds",
          "Time from accepting a Generate call to the first step its sequence ran in",
          metrics::ExponentialBuckets(0.001, 2, 16))),
      chunks_(r.AddCounter("tripod_decode_kv_transfer_chunks_total",
                           "KV data chunks accepted into reservations")),
      bytes_(r.AddCounter("tripod_decode_kv_transfer_bytes_total",
                          "KV payload bytes accepted into reservations")),
      adopted_(r.AddCounter("tripod_decode_kv_transfers_adopted_total",
                            "KV transfers that completed and were adopted by a request")),
      transfer_seconds_(r.AddHistogram("tripod_decode_kv_reservation_held_seconds",
                                       "Time from Reserve until a request adopted the KV",
                                       metrics::ExponentialBuckets(0.001, 2, 16))) {
  // The usual label values, so that their series exist (at zero) before the first of each.
  for (const char* f : {"stop", "length", "cancelled", "error", "rejected"}) {
    r.AddCounter(kRequests, kRequestsHelp, {{"finish", f}});
  }
  for (absl::StatusCode code :
       {absl::StatusCode::kOk, absl::StatusCode::kInvalidArgument,
        absl::StatusCode::kResourceExhausted, absl::StatusCode::kUnavailable}) {
    r.AddCounter(kReserves, kReservesHelp, {{"outcome", OutcomeLabel(absl::Status(code, "x"))}});
  }
  for (const char* reason :
       {"chunk_rejected", "stream_ended", "mismatch", "expired", "cancelled"}) {
    r.AddCounter(kFailures, kFailuresHelp, {{"reason", reason}});
  }
  r.AddProcessMetrics();
}

void DecodeMetrics::AddGauges(const DecodeEngine& engine, const KvTransfers& transfers,
                              std::function<bool()> draining) {
  metrics::Registry& r = registry_;
  const DecodeEngine* e = &engine;
  r.AddCallbackGauge("tripod_decode_running_sequences", "Sequences in the continuous batch", {},
                     [e] { return static_cast<double>(e->stats().running); });
  r.AddCallbackGauge("tripod_decode_waiting_sequences", "Sequences waiting to join the batch", {},
                     [e] { return static_cast<double>(e->stats().waiting); });
  r.AddCallbackGauge("tripod_decode_kv_free_blocks", "KV blocks free or evictable", {},
                     [e] { return static_cast<double>(e->stats().free_blocks); });
  r.AddCallbackGauge("tripod_decode_kv_blocks", "KV blocks in the cache", {},
                     [e] { return static_cast<double>(e->stats().total_blocks); });
  const KvTransfers* t = &transfers;
  r.AddCallbackGauge("tripod_decode_kv_reservations",
                     "KV reservations awaiting, receiving or holding a transfer", {},
                     [t] { return static_cast<double>(t->active()); });
  r.AddCallbackGauge("tripod_decode_draining", "1 while the worker shuts down", {},
                     [d = std::move(draining)] { return d() ? 1.0 : 0.0; });
}

void DecodeMetrics::GenerateDone(const std::string& finish, int prompt_tokens,
                                 int completion_tokens, int cached_tokens, double ttft_s,
                                 double tpot_s, double queue_s) {
  registry_.AddCounter(kRequests, kRequestsHelp, {{"finish", finish}}).Inc();
  if (finish == "rejected") return;
  prompt_tokens_.Inc(prompt_tokens);
  generated_tokens_.Inc(completion_tokens);
  cached_tokens_.Inc(cached_tokens);
  if (ttft_s >= 0) ttft_seconds_.Observe(ttft_s);
  if (tpot_s >= 0) tpot_seconds_.Observe(tpot_s);
  if (queue_s >= 0) queue_seconds_.Observe(queue_s);
}

void DecodeMetrics::ReserveDone(const absl::Status& status) {
  registry_.AddCounter(kReserves, kReservesHelp, {{"outcome", OutcomeLabel(status)}}).Inc();
}

void DecodeMetrics::ChunkAccepted(size_t payload_bytes) {
  chunks_.Inc();
  bytes_.Inc(static_cast<double>(payload_bytes));
}

void DecodeMetrics::TransferEnded(const TransferEnd& end) {
  if (end.state == TransferState::kAdopted) {
    adopted_.Inc();
    transfer_seconds_.Observe(absl::ToDoubleSeconds(end.age));
    return;
  }
  registry_.AddCounter(kFailures, kFailuresHelp, {{"reason", end.reason}}).Inc();
}

}  // namespace tripod
