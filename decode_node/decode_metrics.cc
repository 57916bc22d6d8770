// DecodeMetrics; see decode_metrics.h.
#include "decode_node/decode_metrics.h"

#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "common/metrics/metric_scheme.h"

namespace tripod {
namespace {

const metrics::Labels kRole = {{"role", "decode"}};

metrics::Labels With(const std::string& name, const std::string& value) {
  return metrics::RoleWith(kRole, name, value);
}

constexpr char kRequests[] = "tripod:request_success_total";
constexpr char kRequestsHelp[] =
    "Requests ended, by finish reason (stop, length, cancelled, error)";
constexpr char kRejected[] = "tripod:request_rejected_total";
constexpr char kRejectedHelp[] =
    "Generate calls refused before anything streamed, by status code (lower case)";
constexpr char kReserves[] = "tripod:kv_reservations_total";
constexpr char kReservesHelp[] = "Reserve calls by outcome (the status code, lower case)";
constexpr char kFailures[] = "tripod:kv_transfer_failures_total";
constexpr char kFailuresHelp[] =
    "KV transfers that ended without being adopted, by reason (chunk_rejected, stream_ended, "
    "mismatch, expired, cancelled)";

}  // namespace

DecodeMetrics::DecodeMetrics(metrics::Registry& r)
    : registry_(r),
      prompt_tokens_(r.AddCounter("tripod:prompt_tokens_total",
                                  "Prompt tokens of the Generate calls that ran", kRole)),
      generation_tokens_(
          r.AddCounter("tripod:generation_tokens_total", "Tokens generated and streamed", kRole)),
      cached_tokens_(r.AddCounter("tripod:prefix_cache_hit_tokens_total",
                                  "Prompt tokens whose KV came from the prefix cache, counted "
                                  "once per request (at its first admission)",
                                  kRole)),
      ttft_(r.AddHistogram(
          "tripod:time_to_first_token_seconds",
          "Time from accepting a Generate call (KV transfer wait included) to its first token",
          metrics::LatencyBuckets(), kRole)),
      itl_(r.AddHistogram("tripod:inter_token_latency_seconds",
                          "Time between two tokens of a request as its stream wrote them",
                          metrics::TokenGapBuckets(), kRole)),
      tpot_(r.AddHistogram("tripod:time_per_output_token_seconds",
                           "Mean time between a request's tokens after the first, per request",
                           metrics::TokenGapBuckets(), kRole)),
      queue_(r.AddHistogram(
          "tripod:request_queue_time_seconds",
          "Time from accepting a Generate call (KV transfer wait included) to the first step its "
          "sequence ran in",
          metrics::LatencyBuckets(), kRole)),
      decode_(r.AddHistogram("tripod:request_decode_time_seconds",
                             "Time from a request's first token to its last",
                             metrics::LatencyBuckets(), kRole)),
      e2e_(r.AddHistogram("tripod:e2e_request_latency_seconds",
                          "Time from accepting a Generate call to its end",
                          metrics::LatencyBuckets(), kRole)),
      chunks_(r.AddCounter("tripod:kv_transfer_chunks_total",
                           "KV data chunks accepted into reservations", kRole)),
      bytes_(r.AddCounter("tripod:kv_transfer_bytes_total",
                          "KV payload bytes accepted into reservations", kRole)),
      transfer_(r.AddHistogram(
          "tripod:kv_transfer_seconds",
          "Time from a PushKv stream's first chunk to its end message (under the prefill's "
          "compute)",
          metrics::ExponentialBuckets(0.001, 2, 16), kRole)),
      adopted_(r.AddCounter("tripod:kv_transfers_adopted_total",
                            "KV transfers that completed and were adopted by a request", kRole)),
      held_(r.AddHistogram("tripod:kv_reservation_held_seconds",
                           "Time from Reserve until a request adopted the KV",
                           metrics::ExponentialBuckets(0.001, 2, 16), kRole)) {
  // The usual label values, so that their series exist (at zero) before the first of each.
  for (const char* f : {"stop", "length", "cancelled", "error"}) {
    r.AddCounter(kRequests, kRequestsHelp, With("finish_reason", f));
  }
  for (absl::StatusCode code :
       {absl::StatusCode::kInvalidArgument, absl::StatusCode::kNotFound,
        absl::StatusCode::kFailedPrecondition, absl::StatusCode::kUnavailable}) {
    r.AddCounter(kRejected, kRejectedHelp,
                 With("code", metrics::StatusLabel(absl::Status(code, "x"))));
  }
  for (absl::StatusCode code :
       {absl::StatusCode::kOk, absl::StatusCode::kInvalidArgument,
        absl::StatusCode::kResourceExhausted, absl::StatusCode::kUnavailable}) {
    r.AddCounter(kReserves, kReservesHelp,
                 With("outcome", metrics::StatusLabel(absl::Status(code, "x"))));
  }
  for (const char* reason :
       {"chunk_rejected", "stream_ended", "mismatch", "expired", "cancelled"}) {
    r.AddCounter(kFailures, kFailuresHelp, With("reason", reason));
  }
  r.AddProcessMetrics();
}

void DecodeMetrics::AddGauges(const DecodeEngine& engine, const KvTransfers& transfers,
                              std::function<bool()> draining) {
  metrics::Registry& r = registry_;
  const DecodeEngine* e = &engine;
  r.AddCallbackGauge("tripod:num_requests_running", "Sequences in the continuous batch", kRole,
                     [e] { return static_cast<double>(e->stats().running); });
  r.AddCallbackGauge("tripod:num_requests_waiting", "Sequences waiting to join the batch", kRole,
                     [e] { return static_cast<double>(e->stats().waiting); });
  // vLLM's definition: free blocks include evictable prefix-cache ones.
  r.AddCallbackGauge("tripod:kv_cache_usage_perc", "KV cache blocks in use, 0 to 1", kRole, [e] {
    const DecodeEngineStats s = e->stats();
    return s.total_blocks > 0 ? 1.0 - static_cast<double>(s.free_blocks) / s.total_blocks : 0.0;
  });
  r.AddCallbackGauge("tripod:kv_cache_free_blocks", "KV blocks free or evictable", kRole,
                     [e] { return static_cast<double>(e->stats().free_blocks); });
  r.AddCallbackGauge("tripod:kv_cache_blocks", "KV blocks in the cache", kRole,
                     [e] { return static_cast<double>(e->stats().total_blocks); });
  r.AddCallbackCounter("tripod:num_preemptions_total",
                       "Sequences preempted (blocks freed, recomputed later)", kRole,
                       [e] { return static_cast<double>(e->stats().preemptions); });
  // Tokens, as vLLM counts them: every admission that looks the prefix cache up (a preempted
  // sequence's again) queries its whole token list and hits the slots it attaches.
  r.AddCallbackCounter("tripod:prefix_cache_queries_total",
                       "Tokens looked up in the prefix cache at admission", kRole,
                       [e] { return static_cast<double>(e->stats().prefix_queries); });
  r.AddCallbackCounter("tripod:prefix_cache_hits_total",
                       "Tokens whose KV the prefix cache held at admission", kRole,
                       [e] { return static_cast<double>(e->stats().prefix_hit_slots); });
  r.AddCallbackCounter("tripod:decode_yielded_seconds_total",
                       "Seconds the decode loop held back steps for a neighbour's queued prompts "
                       "(--yield_to_prefill_ms)",
                       kRole, [e] { return e->stats().yielded_seconds; });
  const KvTransfers* t = &transfers;
  r.AddCallbackGauge("tripod:kv_reservations_active",
                     "KV reservations awaiting, receiving or holding a transfer", kRole,
                     [t] { return static_cast<double>(t->active()); });
  r.AddCallbackGauge("tripod:draining", "1 while the worker shuts down", kRole,
                     [d = std::move(draining)] { return d() ? 1.0 : 0.0; });
}

void DecodeMetrics::GenerateDone(const std::string& finish, int prompt_tokens,
                                 int completion_tokens, int cached_tokens,
                                 const GenerateTimes& times) {
  registry_.AddCounter(kRequests, kRequestsHelp, With("finish_reason", finish)).Inc();
  prompt_tokens_.Inc(prompt_tokens);
  generation_tokens_.Inc(completion_tokens);
  cached_tokens_.Inc(cached_tokens);
  if (times.queue_s >= 0) queue_.Observe(times.queue_s);
  if (times.ttft_s >= 0) ttft_.Observe(times.ttft_s);
  if (times.tpot_s >= 0) tpot_.Observe(times.tpot_s);
  if (times.decode_s >= 0) decode_.Observe(times.decode_s);
  if (times.e2e_s >= 0) e2e_.Observe(times.e2e_s);
}

void DecodeMetrics::GenerateRejected(const absl::Status& status) {
  registry_.AddCounter(kRejected, kRejectedHelp, With("code", metrics::StatusLabel(status))).Inc();
}

void DecodeMetrics::InterToken(double seconds) { itl_.Observe(seconds); }

void DecodeMetrics::ReserveDone(const absl::Status& status) {
  registry_.AddCounter(kReserves, kReservesHelp, With("outcome", metrics::StatusLabel(status)))
      .Inc();
}

void DecodeMetrics::ChunkAccepted(size_t payload_bytes) {
  chunks_.Inc();
  bytes_.Inc(static_cast<double>(payload_bytes));
}

void DecodeMetrics::TransferReceived(double seconds) { transfer_.Observe(seconds); }

void DecodeMetrics::TransferEnded(const TransferEnd& end) {
  if (end.state == TransferState::kAdopted) {
    adopted_.Inc();
    held_.Observe(absl::ToDoubleSeconds(end.age));
    return;
  }
  registry_.AddCounter(kFailures, kFailuresHelp, With("reason", end.reason)).Inc();
}

}  // namespace tripod
