// The decode worker's Prometheus metrics (prefix tripod_decode_): Generate calls by finish
// reason, prompt / generated / prefix-cached tokens, time to first token, time per output token
// and queue time, Reserve calls by outcome, KV transfer chunks and bytes, transfers ended by
// reason, the engine's and the transfers' gauges, and the process's own.
#pragma once

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "common/metrics/metrics.h"
#include "decode_node/decode_engine.h"
#include "decode_node/kv_transfers.h"

namespace tripod {

class DecodeMetrics {
 public:
  // Registers the metrics, and the process's, on `registry` (which must outlive this).
  explicit DecodeMetrics(metrics::Registry& registry);
  // Gauges read at scrape time from the engine, the transfers and the draining flag; each must
  // outlive the registry's scrapes.
  void AddGauges(const DecodeEngine& engine, const KvTransfers& transfers,
                 std::function<bool()> draining);

  // A Generate call ended: finish is stop | length | cancelled | error, or rejected when it was
  // refused before anything streamed. ttft_s / tpot_s < 0: not measured.
  void GenerateDone(const std::string& finish, int prompt_tokens, int completion_tokens,
                    int cached_tokens, double ttft_s, double tpot_s, double queue_s);
  void ReserveDone(const absl::Status& status);
  void ChunkAccepted(size_t payload_bytes);
  void TransferEnded(const TransferEnd& end);

  // "ok", "resource_exhausted", ...: the status code's name in lower case.
  static std::string OutcomeLabel(const absl::Status& status);

 private:
  metrics::Registry& registry_;
  metrics::Counter& prompt_tokens_;
  metrics::Counter& generated_tokens_;
  metrics::Counter& cached_tokens_;
  metrics::Histogram& ttft_seconds_;
  metrics::Histogram& tpot_seconds_;
  metrics::Histogram& queue_seconds_;
  metrics::Counter& chunks_;
  metrics::Counter& bytes_;
  metrics::Counter& adopted_;
  metrics::Histogram& transfer_seconds_;
};

}  // namespace tripod
