// The shared JobQueue over a minimal job (the prefill worker's use is prefill_queue_test.cc, the
// draft worker's draft_worker_test.cc): leaving the queue only while waiting, the drain protocol
// (in-flight counts queued, running and finishing jobs; draining refuses; cancel-all ends them),
// and the messages that name the worker. Every wait is bounded.
#include "common/rpc/job_queue.h"

#include <atomic>
#include <functional>
#include <string>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/unit/wait_for.h"

namespace tripod {
namespace {

constexpr absl::Duration kBound = absl::Seconds(20);

struct TestJob {
  uint64_t request_id = 0;
  std::chrono::steady_clock::time_point accepted;
};
struct TestOutcome {
  absl::Status status;
  double queue_s = 0, total_s = 0;
};
using TestQueue = JobQueue<TestJob, TestOutcome>;

TestJob Job(uint64_t id) {
  TestJob j;
  j.request_id = id;
  return j;
}

TestQueue::Options Opts() {
  TestQueue::Options o;
  o.name = "test";
  o.max_queue = 4;
  o.pin_compute_threads = false;
  return o;
}

// Holds each job on the engine until `open` (or its cancel); `finish` holds it off the engine.
struct Gate {
  std::atomic<bool> open{false};
  std::atomic<bool> with_finish{false};
  std::atomic<int> started{0};

  TestQueue::Runner Runner() {
    return [this](const TestJob&, CancelToken& cancel) -> TestQueue::RunResult {
      ++started;
      auto hold = [this, &cancel]() -> TestOutcome {
        TestOutcome o;
        if (!WaitFor([&] { return open.load() || cancel.cancelled(); })) {
          o.status = absl::DeadlineExceededError("the gate never opened");
        } else if (cancel.cancelled()) {
          o.status = absl::CancelledError("stopped");
        }
        return o;
      };
      if (!with_finish) return hold();
      TestQueue::RunResult r;
      r.finish = hold;
      return r;
    };
  }
};

TEST(JobQueueTest, CancelIfQueuedRemovesOnlyAWaitingJob) {
  Gate gate;
  TestQueue q(gate.Runner(), Opts());
  auto a = q.Submit(Job(1));
  auto b = q.Submit(Job(2));
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(WaitFor([&] { return q.running() == 1; }));
  EXPECT_FALSE(q.CancelIfQueued(**a));  // running: left alone
  EXPECT_TRUE(q.CancelIfQueued(**b));
  ASSERT_TRUE((*b)->done());
  EXPECT_EQ((*b)->outcome().status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ((*b)->outcome().status.message(), "test request 2 cancelled while queued");
  EXPECT_FALSE(q.CancelIfQueued(**b));  // gone already
  gate.open = true;
  ASSERT_TRUE((*a)->WaitUntil(absl::Now() + kBound));
  EXPECT_TRUE((*a)->outcome().status.ok()) << (*a)->outcome().status;
  EXPECT_EQ(gate.started.load(), 1);
}

TEST(JobQueueTest, DrainsQueuedRunningAndFinishingJobs) {
  Gate gate;
  gate.with_finish = true;
  TestQueue::Options o = Opts();
  o.max_finishing = 1;  // the engine takes the third job only once the first has finished
  TestQueue q(gate.Runner(), o);
  Drainable& work = q;
  auto a = q.Submit(Job(1));
  ASSERT_TRUE(WaitFor([&] { return q.finishing() == 1; }));
  auto b = q.Submit(Job(2));
  auto c = q.Submit(Job(0));  // anonymous jobs may be many
  auto d = q.Submit(Job(0));
  ASSERT_TRUE(b.ok() && c.ok() && d.ok());
  EXPECT_EQ(work.InFlight(), 4);  // one finishing, three queued (the engine waits on max_finishing)
  work.StartDraining();
  const absl::Status refused = q.Submit(Job(5)).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(refused.message(), "test worker is shutting down: no new requests");
  EXPECT_EQ(work.InFlight(), 4);  // draining refuses new work; what was accepted goes on
  work.CancelAll();
  EXPECT_EQ(work.InFlight(), 0);
  for (auto* t : {&a, &b, &c, &d}) {
    ASSERT_TRUE((**t)->done());
    EXPECT_EQ((**t)->outcome().status.code(), absl::StatusCode::kCancelled);
  }
  EXPECT_EQ((*b)->outcome().status.message(),
            "test request 2 cancelled: the test worker is shutting down");
}

TEST(JobQueueTest, RefusalsNameTheWorker) {
  Gate gate;
  TestQueue::Options o = Opts();
  o.max_queue = 1;
  TestQueue q(gate.Runner(), o);
  ASSERT_TRUE(q.Submit(Job(1)).ok());
  ASSERT_TRUE(WaitFor([&] { return q.running() == 1; }));
  const absl::Status dup = q.Submit(Job(1)).status();
  EXPECT_EQ(dup.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(dup.message(), "test request 1 is already queued or running");
  ASSERT_TRUE(q.Submit(Job(2)).ok());
  const absl::Status full = q.Submit(Job(3)).status();
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(full.message(), "test queue full: 1 requests waiting (max_queue 1)");
  gate.open = true;
  q.Shutdown(kBound);
  EXPECT_EQ(q.InFlight(), 0);
}

}  // namespace
}  // namespace tripod
