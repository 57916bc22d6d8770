// Least-load routing and the workers' health bookkeeping (no processes: Health answers are
// recorded by hand).
#include "scheduler/router.h"

#include <gtest/gtest.h>

#include "scheduler/worker_registry.h"

namespace tripod::scheduler {
namespace {

std::shared_ptr<Worker> DecodeWorker(const std::string& address, int running, int queued,
                                     int free_blocks, int block_tokens = 16) {
  auto w = std::make_shared<Worker>(address, v1::ROLE_DECODE);
  v1::HealthResponse h;
  h.set_role(v1::ROLE_DECODE);
  h.set_running(running);
  h.set_queued(queued);
  h.set_free_kv_blocks(free_blocks);
  h.set_total_kv_blocks(1000);
  h.set_block_tokens(block_tokens);
  EXPECT_TRUE(w->RecordCheck(true, h, "", 2));  // unseen -> healthy: a change
  return w;
}

TEST(RouterTest, PicksTheLeastLoadedDecodeWorkerThatFits) {
  auto busy = DecodeWorker("a:1", 5, 2, 900);
  auto idle = DecodeWorker("b:1", 1, 0, 900);
  auto full = DecodeWorker("c:1", 0, 0, 3);  // 3 blocks of 16: a 100-token prompt does not fit
  for (uint64_t rot = 0; rot < 3; ++rot) {
    EXPECT_EQ(PickDecode({busy, idle, full}, 100, rot), idle);
    EXPECT_EQ(PickDecode({busy, idle, full}, 40, rot), full);  // fits now, and is idlest
  }
}

TEST(RouterTest, OwnInflightCountsWhenReportsAreStale) {
  auto a = DecodeWorker("a:1", 0, 0, 900);
  auto b = DecodeWorker("b:1", 0, 0, 900);
  a->AddInflight(3);
  EXPECT_EQ(WorkerLoad(*a), 3);
  EXPECT_EQ(PickDecode({a, b}, 10, 0), b);
  b->AddInflight(4);
  EXPECT_EQ(PickDecode({a, b}, 10, 0), a);
}

TEST(RouterTest, NothingFitsGoesToTheRoomiest) {
  auto a = DecodeWorker("a:1", 0, 0, 2);
  auto b = DecodeWorker("b:1", 9, 9, 5);
  EXPECT_EQ(PickDecode({a, b}, 1000, 0), b);
  EXPECT_EQ(PickDecode({}, 10, 0), nullptr);
}

TEST(RouterTest, EqualWorkersShareByRotation) {
  auto a = DecodeWorker("a:1", 0, 0, 100);
  auto b = DecodeWorker("b:1", 0, 0, 100);
  EXPECT_NE(PickDecode({a, b}, 10, 0), PickDecode({a, b}, 10, 1));
}

TEST(RouterTest, DecodeSkipsTheExcludedWorker) {
  auto idle = DecodeWorker("a:1", 0, 0, 900);
  auto busy = DecodeWorker("b:1", 7, 3, 2);  // loaded, and too small: chosen only when alone
  for (uint64_t rot = 0; rot < 2; ++rot) {
    EXPECT_EQ(PickDecode({idle, busy}, 100, rot), idle);
    EXPECT_EQ(PickDecode({idle, busy}, 100, rot, idle.get()), busy);
    EXPECT_EQ(PickDecode({idle}, 100, rot, idle.get()), nullptr);
  }
}

TEST(RouterTest, PrefillSkipsTheExcludedWorker) {
  auto p1 = std::make_shared<Worker>("p:1", v1::ROLE_PREFILL);
  auto p2 = std::make_shared<Worker>("p:2", v1::ROLE_PREFILL);
  EXPECT_EQ(PickPrefill({p1, p2}, p1.get(), "", 0), p2);
  EXPECT_EQ(PickPrefill({p1}, p1.get(), "", 0), nullptr);
  p1->AddInflight(2);
  EXPECT_EQ(PickPrefill({p1, p2}, nullptr, "", 0), p2);
}

v1::HealthResponse PrefillHealth(bool full, std::vector<int> skipped) {
  v1::HealthResponse h;
  h.set_role(v1::ROLE_PREFILL);
  h.mutable_model()->set_n_layers(30);
  h.set_full_weights(full);
  for (int l : skipped) h.add_skipped_layers(l);
  return h;
}

TEST(RouterTest, PlansAPrunedWorkerCanRun) {
  std::vector<int> last10;
  for (int l = 20; l < 30; ++l) last10.push_back(l);
  const v1::HealthResponse pruned = PrefillHealth(false, last10);
  EXPECT_TRUE(CanRunPlan(pruned, ""));       // its own plan
  EXPECT_TRUE(CanRunPlan(pruned, "1/3"));    // floor(30 / 3) = 10: layers 20-29
  EXPECT_TRUE(CanRunPlan(pruned, "0.34"));   // floor(10.2) = 10
  EXPECT_FALSE(CanRunPlan(pruned, "0"));     // POP off needs the skipped layers' weights
  EXPECT_FALSE(CanRunPlan(pruned, "0.25"));  // 7 layers
  EXPECT_FALSE(CanRunPlan(pruned, "x/3"));
  const v1::HealthResponse full = PrefillHealth(true, {});
  EXPECT_TRUE(CanRunPlan(full, "0"));
  EXPECT_TRUE(CanRunPlan(full, "1/3"));
  auto w = std::make_shared<Worker>("p:1", v1::ROLE_PREFILL);
  w->RecordCheck(true, pruned, "", 2);
  EXPECT_EQ(PickPrefill({w}, nullptr, "0", 0), nullptr);
  EXPECT_EQ(PickPrefill({w}, nullptr, "1/3", 0), w);
}

TEST(WorkerHealthTest, LeavesAfterMissesAndReturnsAtOnce) {
  auto w = DecodeWorker("a:1", 0, 0, 10);
  EXPECT_TRUE(w->healthy());
  EXPECT_FALSE(w->RecordCheck(false, {}, "timeout", 2));  // one miss: still in
  EXPECT_TRUE(w->healthy());
  EXPECT_TRUE(w->RecordCheck(false, {}, "timeout", 2));  // two in a row: out
  EXPECT_FALSE(w->healthy());
  EXPECT_EQ(w->last_error(), "timeout");
  v1::HealthResponse h;
  EXPECT_TRUE(w->RecordCheck(true, h, "", 2));
  EXPECT_TRUE(w->healthy());
  w->MarkFailed("connection refused");
  EXPECT_FALSE(w->healthy());
}

TEST(ResolveAllTest, LoopbackNameAndBadNames) {
  std::string error;
  std::vector<std::string> a = ResolveAll("localhost:7000", &error);
  EXPECT_TRUE(error.empty()) << error;
  ASSERT_FALSE(a.empty());
  for (const std::string& s : a) EXPECT_TRUE(s.ends_with(":7000")) << s;
  error.clear();
  EXPECT_TRUE(ResolveAll("no-such-host.invalid:1", &error).empty());
  EXPECT_FALSE(error.empty());
  error.clear();
  EXPECT_TRUE(ResolveAll("missing-port", &error).empty());
  EXPECT_FALSE(error.empty());
}

}  // namespace
}  // namespace tripod::scheduler
