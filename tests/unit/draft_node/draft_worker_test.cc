// DraftWorker's admission around a running request: one that is cancelled, or whose deadline
// passes, while it waits for the engine leaves with CANCELLED / DEADLINE_EXCEEDED; a full queue
// refuses with RESOURCE_EXHAUSTED; after Shutdown new requests get UNAVAILABLE; the running one
// completes. A running request whose client goes away or whose deadline passes stops at the
// engine's next chunk. And DraftRequestFromWire's defaults and refusals.
#include "draft_node/draft_worker.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "draft_node/draft_service.h"
#include "gtest/gtest.h"
#include "tests/unit/test_model.h"

namespace tripod {
namespace {

std::vector<int32_t> Prompt(int n) {
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = 200 + (i * 13) % 700;
  return ids;
}

TEST(DraftWorkerTest, WaitersLeaveOnCancelDeadlineAndShutdown) {
  DraftEngineOptions o;
  o.model_path = TestModelPath();
  o.context_tokens = 1024;
  std::unique_ptr<DraftEngine> engine = *DraftEngine::Create(o);
  DraftWorker worker(*engine, nullptr, /*max_queue=*/2);
  DraftRequest big;
  big.prompt = Prompt(600);
  std::atomic<bool> done{false};
  absl::Status big_status;
  std::thread runner([&] {
    big_status = worker.Run(big, absl::InfiniteFuture(), nullptr).status();
    done = true;
  });
  while (worker.running() == 0 && !done) std::this_thread::yield();
  EXPECT_FALSE(done) << "the first request ended before the others could wait";

  DraftRequest small;
  small.prompt = Prompt(10);
  absl::StatusOr<DraftOutcome> r = worker.Run(small, absl::InfiniteFuture(), [] { return true; });
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();
  r = worker.Run(small, absl::Now() + absl::Milliseconds(30), nullptr);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  // Two waiters fill the queue (each gives up after a while); a third is refused at once.
  std::vector<std::thread> waiters;
  std::atomic<int> waited_out{0};
  for (int i = 0; i < 2; ++i) {
    waiters.emplace_back([&] {
      absl::StatusOr<DraftOutcome> w = worker.Run(small, absl::InfiniteFuture(), nullptr);
      if (w.ok()) waited_out++;
    });
  }
  while (worker.queued() < 2 && !done) std::this_thread::yield();
  if (!done) {
    r = worker.Run(small, absl::InfiniteFuture(), nullptr);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  }
  for (std::thread& t : waiters) t.join();
  runner.join();
  EXPECT_TRUE(big_status.ok()) << big_status;
  EXPECT_EQ(waited_out.load(), 2);
  worker.Shutdown(absl::Seconds(5));
  EXPECT_TRUE(worker.draining());
  r = worker.Run(small, absl::InfiniteFuture(), nullptr);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_EQ(worker.queued(), 0);
  EXPECT_EQ(worker.running(), 0);
}

TEST(DraftWorkerTest, ARunningRequestStopsWhenItsCallerGivesUp) {
  DraftEngineOptions o;
  o.model_path = TestModelPath();
  o.context_tokens = 1024;
  o.prefill_chunk = 16;  // 63 chunks: many checks
  std::unique_ptr<DraftEngine> engine = *DraftEngine::Create(o);
  DraftWorker worker(*engine, nullptr, /*max_queue=*/2);
  DraftRequest big;
  big.prompt = Prompt(1000);
  // The client goes away once the request runs: CANCELLED, with prompt tokens left undone.
  std::atomic<bool> gone{false};
  std::thread leaver([&] {
    while (worker.running() == 0) std::this_thread::yield();
    gone = true;
  });
  absl::StatusOr<DraftOutcome> r =
      worker.Run(big, absl::InfiniteFuture(), [&] { return gone.load(); });
  leaver.join();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "of 1000 prompt tokens")) << r.status();
  EXPECT_EQ(worker.running(), 0);
  // A deadline that passes while it runs: DEADLINE_EXCEEDED (before, the map was finished and
  // returned late, the engine busy all along).
  r = worker.Run(big, absl::Now() + absl::Milliseconds(50), nullptr);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_EQ(worker.running(), 0);
  // And the engine is whole: the next request runs to its map.
  DraftRequest small;
  small.prompt = Prompt(40);
  small.specpc.budget = 10;
  small.specpc.window = 4;
  small.specpc.pool_kernel = 3;
  small.specpc.neighbourhood = 2;
  r = worker.Run(small, absl::InfiniteFuture(), nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->result.keep.size(), 10u);
  worker.Shutdown(absl::Seconds(5));
}

TEST(DraftWorkerTest, WireRequestsGetDefaultsAndNegativeFieldsAreRefused) {
  v1::ScoreRequest w;
  w.add_prompt(5);
  w.add_prompt(6);
  w.set_budget(3);
  absl::StatusOr<DraftRequest> r = DraftRequestFromWire(w);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->prompt, (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(r->specpc.budget, 3);
  EXPECT_EQ(r->specpc.window, 64);
  EXPECT_EQ(r->specpc.pool_kernel, 32);
  EXPECT_EQ(r->specpc.neighbourhood, 32);
  EXPECT_EQ(r->first_layer, -1);
  w.set_first_layer(0);  // present: l_0 = 0 is a real choice, not the default
  EXPECT_EQ(DraftRequestFromWire(w)->first_layer, 0);
  w.set_window(-4);
  r = DraftRequestFromWire(w);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("window must not be negative"), std::string::npos);
}

}  // namespace
}  // namespace tripod
