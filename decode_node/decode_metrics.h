// The decode worker's Prometheus metrics, named after vLLM's with the prefix `tripod:` and the
// label role="decode" (the scheduler's and the prefill worker's use the same names where the
// meaning is the same): time to first token, inter-token latency, time per output token,
// end-to-end, queue and decode time (histograms, seconds), prompt, generation and prefix-cached
// tokens, requests by finish reason and refused ones, running and waiting requests, KV cache
// usage, preemptions, prefix-cache queries and hits; and ours: KV transfer bytes, chunks and
// time, transfers adopted and failed, reservations; and the process's own (unlabelled).
#pragma once

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "common/kv_transfer/kv_transfers.h"
#include "common/metrics/metrics.h"
#include "decode_node/decode_engine.h"

namespace tripod {

// A Generate call's times as the decode worker measured them (seconds; < 0: not measured).
struct GenerateTimes {
  double queue_s = -1;   // accepted -> the sequence first ran (the KV transfer wait included)
  double ttft_s = -1;    // accepted -> first token
  double tpot_s = -1;    // mean gap between the tokens after the first
  double decode_s = -1;  // first -> last token
  double e2e_s = -1;     // accepted -> the end
};

class DecodeMetrics {
 public:
  // Registers the metrics, and the process's, on `registry` (which must outlive this).
  explicit DecodeMetrics(metrics::Registry& registry);
  // Gauges and counters read at scrape time from the engine, the transfers and the draining
  // flag; each must outlive the registry's scrapes.
  void AddGauges(const DecodeEngine& engine, const KvTransfers& transfers,
                 std::function<bool()> draining);

  // A Generate call that was accepted ended: finish is stop | length | cancelled | error.
  void GenerateDone(const std::string& finish, int prompt_tokens, int completion_tokens,
                    int cached_tokens, const GenerateTimes& times);
  // A Generate call refused before anything streamed.
  void GenerateRejected(const absl::Status& status);
  // The gap between two consecutive tokens of a request as its stream wrote them.
  void InterToken(double seconds);
  void ReserveDone(const absl::Status& status);
  void ChunkAccepted(size_t payload_bytes);
  // A PushKv stream that completed: first chunk read to the end message accepted.
  void TransferReceived(double seconds);
  void TransferEnded(const TransferEnd& end);

 private:
  metrics::Registry& registry_;
  metrics::Counter& prompt_tokens_;
  metrics::Counter& generation_tokens_;
  metrics::Counter& cached_tokens_;
  metrics::Histogram& ttft_;
  metrics::Histogram& itl_;
  metrics::Histogram& tpot_;
  metrics::Histogram& queue_;
  metrics::Histogram& decode_;
  metrics::Histogram& e2e_;
  metrics::Counter& chunks_;
  metrics::Counter& bytes_;
  metrics::Histogram& transfer_;
  metrics::Counter& adopted_;
  metrics::Histogram& held_;
};

}  // namespace tripod
