// DecodeMetrics: what a Generate call, a refusal, a Reserve and a transfer record, under the
// names the scheduler uses, with role="decode". (The engine's gauges and counters are checked
// through a running service in decode_service_test.cc.)
#include "decode_node/decode_metrics.h"

#include <gtest/gtest.h>

#include <string>

#include "common/metrics/metrics.h"

namespace tripod {
namespace {

TEST(DecodeMetrics, RecordsUnderTheSharedNamesWithTheRole) {
  metrics::Registry r;
  DecodeMetrics m(r);
  GenerateTimes t;
  t.queue_s = 0.01;
  t.ttft_s = 0.2;
  t.tpot_s = 0.03;
  t.decode_s = 0.15;
  t.e2e_s = 0.35;
  m.GenerateDone("length", 40, 6, 16, t);
  m.GenerateDone("cancelled", 7, 0, 0, GenerateTimes{});
  for (int i = 0; i < 5; ++i) m.InterToken(0.03);
  m.GenerateRejected(absl::NotFoundError("no such transfer"));
  m.ReserveDone(absl::OkStatus());
  m.ReserveDone(absl::ResourceExhaustedError("full"));
  m.ChunkAccepted(1000);
  m.ChunkAccepted(24);
  m.TransferReceived(0.05);
  m.TransferEnded({1, TransferState::kAdopted, "adopted", absl::OkStatus(), absl::Seconds(1)});
  m.TransferEnded({2, TransferState::kFailed, "expired", absl::DeadlineExceededError("late"),
                   absl::Seconds(30)});

  const std::string text = r.Exposition();
  for (const std::string line : {
           "tripod:request_success_total{finish_reason=\"length\",role=\"decode\"} 1\n",
           "tripod:request_success_total{finish_reason=\"cancelled\",role=\"decode\"} 1\n",
           "tripod:request_rejected_total{code=\"not_found\",role=\"decode\"} 1\n",
           "tripod:prompt_tokens_total{role=\"decode\"} 47\n",
           "tripod:generation_tokens_total{role=\"decode\"} 6\n",
           "tripod:prefix_cache_hit_tokens_total{role=\"decode\"} 16\n",
           "tripod:time_to_first_token_seconds_count{role=\"decode\"} 1\n",
           "tripod:inter_token_latency_seconds_count{role=\"decode\"} 5\n",
           "tripod:time_per_output_token_seconds_count{role=\"decode\"} 1\n",
           "tripod:request_queue_time_seconds_count{role=\"decode\"} 1\n",
           "tripod:request_decode_time_seconds_count{role=\"decode\"} 1\n",
           "tripod:e2e_request_latency_seconds_count{role=\"decode\"} 1\n",
           "tripod:kv_reservations_total{outcome=\"ok\",role=\"decode\"} 1\n",
           "tripod:kv_reservations_total{outcome=\"resource_exhausted\",role=\"decode\"} 1\n",
           "tripod:kv_transfer_chunks_total{role=\"decode\"} 2\n",
           "tripod:kv_transfer_bytes_total{role=\"decode\"} 1024\n",
           "tripod:kv_transfer_seconds_count{role=\"decode\"} 1\n",
           "tripod:kv_transfers_adopted_total{role=\"decode\"} 1\n",
           "tripod:kv_reservation_held_seconds_count{role=\"decode\"} 1\n",
           "tripod:kv_transfer_failures_total{reason=\"expired\",role=\"decode\"} 1\n",
       }) {
    EXPECT_NE(text.find(line), std::string::npos) << line << text;
  }
  EXPECT_EQ(text.find("tripod_decode_"), std::string::npos) << "no old names left";
  // The process's own metrics stay unlabelled.
  EXPECT_NE(text.find("\nprocess_open_fds "), std::string::npos);
}

}  // namespace
}  // namespace tripod
