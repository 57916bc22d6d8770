// PrefillMetrics: the FLOPs POP saves (against prefill_flops.h's count), and the names and
// labels of what a job records.
#include "prefill_node/prefill_metrics.h"

#include <gtest/gtest.h>

#include <string>

#include "common/metrics/metrics.h"
#include "prefill_node/prefill_flops.h"

namespace tripod {
namespace {

ModelConfig SmallConfig() {
  ModelConfig c;
  c.n_layers = 4;
  c.d_model = 64;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.d_ff = 160;
  return c;
}

TEST(PopFlopsSaved, IsTheFullPrefillsFlopsLessThePlans) {
  const ModelConfig c = SmallConfig();
  const ForwardPlan pop = ForwardPlan::PopPrefill(c.n_layers, {1, 3});
  // POP, and a plan with a kSkip layer as POP's nokv and shortgpt controls run (it saves its K/V
  // projection too).
  ForwardPlan skipping = pop;
  skipping.layers[3] = LayerMode::kSkip;
  for (const ForwardPlan& plan : {pop, skipping}) {
    for (int m : {0, 1, 7, 300}) {
      EXPECT_DOUBLE_EQ(PopFlopsSaved(c, plan, m),
                       PrefillFlops(c, ForwardPlan::Full(c.n_layers), m) - PrefillFlops(c, plan, m))
          << m << " tokens, plan " << plan.DebugString();
    }
  }
  EXPECT_EQ(PopFlopsSaved(c, ForwardPlan::Full(c.n_layers), 300), 0);
  // One layer, one token: Q and output projections, gate/up/down, one query-key pair.
  const double one = 2.0 * 64 * 64 + 2.0 * 64 * 64 + 3 * 2.0 * 64 * 160 + 2 * 2.0 * 4 * 16;
  EXPECT_DOUBLE_EQ(PopFlopsSaved(c, ForwardPlan::PopPrefill(c.n_layers, {2}), 1), one);
}

TEST(PrefillMetrics, JobsRecordUnderTheSharedNamesWithTheRole) {
  metrics::Registry r;
  const ModelConfig c = SmallConfig();
  PrefillMetrics m(r, c);
  PrefillJob job;
  job.prompt.assign(11, 5);
  job.plan = ForwardPlan::PopPrefill(c.n_layers, {1, 3});
  PrefillOutcome ok;
  ok.prefilled_tokens = 10;
  ok.bytes_sent = 4096;
  ok.chunks_sent = 3;
  ok.compute_s = 0.5;
  ok.transfer_s = 0.4;
  m.JobDone(job, ok);
  PrefillOutcome refused = ok;
  refused.status = absl::UnavailableError("decode worker gone");
  m.JobDone(job, refused);
  m.RequestDone(ok.status);
  m.RequestDone(refused.status);

  const std::string text = r.Exposition();
  for (const std::string line : {
           "tripod:prompt_tokens_total{role=\"prefill\"} 22\n",
           "tripod:pop_layers_skipped_total{role=\"prefill\"} 2\n",
           "tripod:kv_transfer_bytes_total{role=\"prefill\"} 8192\n",
           "tripod:kv_transfer_chunks_total{role=\"prefill\"} 6\n",
           "tripod:kv_transfer_seconds_count{role=\"prefill\"} 1\n",
           "tripod:kv_transfer_failures_total{reason=\"unavailable\",role=\"prefill\"} 1\n",
           "tripod:request_prefill_time_seconds_count{role=\"prefill\"} 2\n",
           "tripod:request_queue_time_seconds_count{role=\"prefill\"} 2\n",
           "tripod:prefill_requests_total{outcome=\"ok\",role=\"prefill\"} 1\n",
           "tripod:prefill_requests_total{outcome=\"unavailable\",role=\"prefill\"} 1\n",
       }) {
    EXPECT_NE(text.find(line), std::string::npos) << line << text;
  }
  // Only the job that ended OK saved anything.
  const std::string series = "tripod:prefill_flops_saved_total{role=\"prefill\"} ";
  const size_t at = text.find(series);
  ASSERT_NE(at, std::string::npos) << text;
  EXPECT_DOUBLE_EQ(std::stod(text.substr(at + series.size())), PopFlopsSaved(c, job.plan, 10));
  EXPECT_EQ(text.find("tripod_prefill_"), std::string::npos) << "no old names left";
}

}  // namespace
}  // namespace tripod
