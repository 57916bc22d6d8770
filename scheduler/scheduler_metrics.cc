#include "scheduler/scheduler_metrics.h"

#include "absl/strings/str_cat.h"
#include "common/metrics/metric_scheme.h"

namespace tripod::scheduler {
namespace {

const metrics::Labels kRole = {{"role", "scheduler"}};

metrics::Labels With(const std::string& name, const std::string& value) {
  return metrics::RoleWith(kRole, name, value);
}

constexpr char kRequests[] = "tripod:request_success_total";
constexpr char kRequestsHelp[] =
    "Requests ended, by finish reason (stop, length, cancelled, error)";
constexpr char kRejected[] = "tripod:request_rejected_total";
constexpr char kRejectedHelp[] = "Requests refused before they ran, by HTTP status";
constexpr char kMethods[] = "tripod:method_requests_total";
constexpr char kMethodsHelp[] =
    "Requests that asked for a compression method, by method and outcome (applied, fallback)";
constexpr char kRetries[] = "tripod:prefill_retries_total";
constexpr char kRetriesHelp[] =
    "Prefills retried on another prefill worker or run locally on the decode worker";

}  // namespace

SchedulerMetrics::SchedulerMetrics(metrics::Registry& r)
    : registry_(r),
      ttft_(r.AddHistogram("tripod:time_to_first_token_seconds",
                           "Time from a request's arrival to its first token",
                           metrics::LatencyBuckets(), kRole)),
      itl_(r.AddHistogram("tripod:inter_token_latency_seconds",
                          "Time between two tokens of a request as the scheduler sees them",
                          metrics::TokenGapBuckets(), kRole)),
      e2e_(r.AddHistogram("tripod:e2e_request_latency_seconds",
                          "Time from a request's arrival to its last token",
                          metrics::LatencyBuckets(), kRole)),
      queue_(r.AddHistogram("tripod:request_queue_time_seconds",
                            "Time a request waited in the scheduler's queue",
                            metrics::LatencyBuckets(), kRole)),
      prefill_(r.AddHistogram("tripod:request_prefill_time_seconds",
                              "Prefill time as the prefill worker measured it (queue + compute)",
                              metrics::LatencyBuckets(), kRole)),
      decode_(r.AddHistogram("tripod:request_decode_time_seconds",
                             "Decode time as the decode worker measured it (first to last token)",
                             metrics::LatencyBuckets(), kRole)),
      prompt_tokens_(
          r.AddCounter("tripod:prompt_tokens_total", "Prompt tokens of requests ended", kRole)),
      generation_tokens_(r.AddCounter("tripod:generation_tokens_total",
                                      "Tokens generated for requests ended", kRole)),
      cached_tokens_(r.AddCounter("tripod:prefix_cache_hit_tokens_total",
                                  "Prompt tokens whose KV came from a decode worker's prefix cache",
                                  kRole)),
      kv_bytes_(r.AddCounter("tripod:kv_transfer_bytes_total",
                             "KV payload bytes prefill workers sent for this scheduler's requests",
                             kRole)),
      draft_(r.AddHistogram("tripod:request_draft_time_seconds",
                            "Time of the draft hop (Draft.Score) as the scheduler measured it",
                            metrics::LatencyBuckets(), kRole)),
      kv_bytes_saved_(r.AddCounter("tripod:kv_transfer_bytes_saved_total",
                                   "KV payload bytes trimming kept from being sent", kRole)),
      prompt_tokens_dropped_(r.AddCounter("tripod:prompt_tokens_dropped_total",
                                          "Prompt tokens SpecPC dropped before prefill", kRole)),
      decode_reroutes_(r.AddCounter(
          "tripod:decode_reroutes_total",
          "Requests moved to another decode worker after theirs failed its KV reservation", kRole)),
      migrations_(r.AddCounter("tripod:request_migrations_total",
                               "Streams moved to another decode worker after theirs died, which "
                               "continued them from the tokens already streamed",
                               kRole)) {
  for (const char* f : {"stop", "length", "cancelled", "error"}) {
    r.AddCounter(kRequests, kRequestsHelp, With("finish_reason", f));
  }
  for (const char* w : {"another_worker", "local"})
    r.AddCounter(kRetries, kRetriesHelp, With("to", w));
  r.AddProcessMetrics();
}

void SchedulerMetrics::RequestStarted(double queue_s) { queue_.Observe(queue_s); }
void SchedulerMetrics::FirstToken(double ttft_s) { ttft_.Observe(ttft_s); }
void SchedulerMetrics::InterToken(double itl_s) { itl_.Observe(itl_s); }

void SchedulerMetrics::RequestEnded(const std::string& finish, const UsageCounts& usage,
                                    const StageTimes& times) {
  registry_.AddCounter(kRequests, kRequestsHelp, With("finish_reason", finish)).Inc();
  prompt_tokens_.Inc(usage.prompt_tokens);
  generation_tokens_.Inc(usage.completion_tokens);
  cached_tokens_.Inc(usage.cached_tokens);
  e2e_.Observe(times.total_s);
  if (times.prefill_s >= 0) prefill_.Observe(times.prefill_s);
  if (times.decode_s >= 0) decode_.Observe(times.decode_s);
  if (times.draft_s >= 0) draft_.Observe(times.draft_s);
  const MethodReport& m = times.method;
  if (!m.name.empty()) {
    metrics::Labels labels = With("method", m.name);
    labels.emplace_back("outcome", m.applied ? "applied" : "fallback");
    registry_.AddCounter(kMethods, kMethodsHelp, labels).Inc();
    kv_bytes_saved_.Inc(static_cast<double>(m.kv_bytes_saved));
    if (m.applied && usage.prompt_tokens > m.prompt_tokens) {
      prompt_tokens_dropped_.Inc(usage.prompt_tokens - m.prompt_tokens);
    }
  }
}

void SchedulerMetrics::Rejected(int http_status) {
  registry_.AddCounter(kRejected, kRejectedHelp, With("status", absl::StrCat(http_status))).Inc();
}

void SchedulerMetrics::PrefillRetried(const std::string& to) {
  registry_.AddCounter(kRetries, kRetriesHelp, With("to", to)).Inc();
}

void SchedulerMetrics::DecodeRerouted() { decode_reroutes_.Inc(); }
void SchedulerMetrics::Migrated() { migrations_.Inc(); }

void SchedulerMetrics::KvBytes(double bytes) { kv_bytes_.Inc(bytes); }

void SchedulerMetrics::AddGauges(std::function<double()> running, std::function<double()> waiting,
                                 std::function<double(int role)> healthy_workers) {
  registry_.AddCallbackGauge("tripod:num_requests_running",
                             "Requests sent to workers and not yet ended", kRole,
                             std::move(running));
  registry_.AddCallbackGauge("tripod:num_requests_waiting", "Requests in the scheduler's queue",
                             kRole, std::move(waiting));
  for (const auto& [name, role] :
       std::vector<std::pair<std::string, int>>{{"prefill", 1}, {"decode", 2}, {"draft", 3}}) {
    registry_.AddCallbackGauge("tripod:workers_healthy", "Workers in routing, by worker role",
                               With("worker_role", name),
                               [healthy_workers, role = role] { return healthy_workers(role); });
  }
}

}  // namespace tripod::scheduler
