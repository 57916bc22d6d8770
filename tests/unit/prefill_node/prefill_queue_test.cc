// PrefillQueue with a stand-in runner (no engine): FIFO on one thread, the queue bound, duplicate
// ids, cancelling a queued and a running job (the running one's cancel callback fires and its
// runner stops), and shutdown (grace for what finishes in time, cancel for the rest, no new jobs).
// Every wait is bounded.
#include "prefill_node/prefill_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "tests/unit/wait_for.h"

namespace tripod {
namespace {

constexpr absl::Duration kBound = absl::Seconds(20);

PrefillJob Job(uint64_t id) {
  PrefillJob j;
  j.request_id = id;
  j.prompt = {1, 2, 3};
  return j;
}

// A runner that records the order of jobs and holds each until released (or cancelled).
struct Gate {
  std::mutex mu;
  std::vector<uint64_t> order;  // guarded by mu
  int released = 0;             // jobs allowed to finish; guarded by mu
  std::atomic<int> started{0};
  std::atomic<bool> callback_ran{false};

  PrefillQueue::Runner Runner() {
    return [this](const PrefillJob& job, CancelToken& cancel) {
      ScopedOnCancel on_cancel(cancel, [this] { callback_ran = true; });
      int index;
      {
        std::lock_guard<std::mutex> lock(mu);
        index = static_cast<int>(order.size());
        order.push_back(job.request_id);
      }
      ++started;
      PrefillOutcome o;
      const absl::Time deadline = absl::Now() + kBound;
      while (true) {
        {
          std::lock_guard<std::mutex> lock(mu);
          if (released > index) break;
        }
        if (cancel.cancelled()) {
          o.status = absl::CancelledError("stopped");
          return o;
        }
        if (absl::Now() > deadline) {
          o.status = absl::DeadlineExceededError("test gate never opened");
          return o;
        }
        absl::SleepFor(absl::Milliseconds(1));
      }
      o.prefilled_tokens = static_cast<int>(job.prompt.size()) - 1;
      return o;
    };
  }
  void Release(int n) {
    std::lock_guard<std::mutex> lock(mu);
    released += n;
  }
  std::vector<uint64_t> Order() {
    std::lock_guard<std::mutex> lock(mu);
    return order;
  }
};

PrefillQueue::Options Opts(int max_queue) {
  PrefillQueue::Options o;
  o.max_queue = max_queue;
  o.pin_compute_threads = false;
  return o;
}

TEST(PrefillQueueTest, RunsInOrderAndBoundsTheQueue) {
  Gate gate;
  PrefillQueue q(gate.Runner(), Opts(2));
  auto a = q.Submit(Job(1));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(WaitFor([&] { return gate.started == 1; }));
  EXPECT_EQ(q.running(), 1);
  auto b = q.Submit(Job(2));
  auto c = q.Submit(Job(3));
  ASSERT_TRUE(b.ok() && c.ok());
  EXPECT_EQ(q.queued(), 2);
  auto d = q.Submit(Job(4));
  EXPECT_EQ(d.status().code(), absl::StatusCode::kResourceExhausted) << d.status();
  EXPECT_EQ(q.Submit(Job(2)).status().code(), absl::StatusCode::kResourceExhausted);
  gate.Release(3);
  for (auto* t : {&*a, &*b, &*c}) {
    ASSERT_TRUE((*t)->WaitUntil(absl::Now() + kBound));
    EXPECT_TRUE((*t)->outcome().status.ok());
    EXPECT_EQ((*t)->outcome().prefilled_tokens, 2);
  }
  EXPECT_EQ(gate.Order(), (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(q.queued(), 0);
  EXPECT_TRUE(WaitFor([&] { return q.running() == 0; }));
}

TEST(PrefillQueueTest, RefusesADuplicateId) {
  Gate gate;
  PrefillQueue q(gate.Runner(), Opts(4));
  ASSERT_TRUE(q.Submit(Job(7)).ok());
  EXPECT_EQ(q.Submit(Job(7)).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(q.Submit(Job(0)).ok());
  EXPECT_TRUE(q.Submit(Job(0)).ok()) << "id 0 is anonymous";
  gate.Release(3);
}

TEST(PrefillQueueTest, CancelsAQueuedAndARunningJob) {
  Gate gate;
  PrefillQueue q(gate.Runner(), Opts(4));
  auto running = q.Submit(Job(1));
  auto queued = q.Submit(Job(2));
  auto after = q.Submit(Job(3));
  ASSERT_TRUE(running.ok() && queued.ok() && after.ok());
  ASSERT_TRUE(WaitFor([&] { return gate.started == 1; }));

  // Queued: removed, ends at once, never runs.
  EXPECT_TRUE(q.Cancel(2));
  ASSERT_TRUE((*queued)->done());
  EXPECT_EQ((*queued)->outcome().status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(q.queued(), 1);
  EXPECT_FALSE(q.Cancel(2)) << "already gone";
  EXPECT_FALSE(q.Cancel(99));

  // Running: the flag and the callback; the runner stops.
  EXPECT_FALSE(gate.callback_ran);
  EXPECT_TRUE(q.Cancel(1));
  EXPECT_TRUE(gate.callback_ran);
  ASSERT_TRUE((*running)->WaitUntil(absl::Now() + kBound));
  EXPECT_EQ((*running)->outcome().status.code(), absl::StatusCode::kCancelled);

  // The next job runs as usual.
  gate.Release(3);
  ASSERT_TRUE((*after)->WaitUntil(absl::Now() + kBound));
  EXPECT_TRUE((*after)->outcome().status.ok());
  EXPECT_EQ(gate.Order(), (std::vector<uint64_t>{1, 3}));
}

TEST(PrefillQueueTest, ShutdownFinishesWithinGraceThenCancels) {
  {
    // In time: the queued job runs to the end during the grace period.
    Gate gate;
    PrefillQueue q(gate.Runner(), Opts(4));
    auto a = q.Submit(Job(1));
    auto b = q.Submit(Job(2));
    ASSERT_TRUE(a.ok() && b.ok());
    std::thread release([&] {
      absl::SleepFor(absl::Milliseconds(50));
      gate.Release(2);
    });
    q.Shutdown(kBound);
    release.join();
    EXPECT_TRUE((*a)->done() && (*a)->outcome().status.ok());
    EXPECT_TRUE((*b)->done() && (*b)->outcome().status.ok());
    EXPECT_EQ(q.Submit(Job(3)).status().code(), absl::StatusCode::kUnavailable);
  }
  {
    // Too slow: after the grace, the running job is cancelled and the queued one never runs.
    Gate gate;
    PrefillQueue q(gate.Runner(), Opts(4));
    auto a = q.Submit(Job(1));
    auto b = q.Submit(Job(2));
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_TRUE(WaitFor([&] { return gate.started == 1; }));
    q.Drain();
    EXPECT_TRUE(q.draining());
    EXPECT_EQ(q.Submit(Job(3)).status().code(), absl::StatusCode::kUnavailable);
    const absl::Time t0 = absl::Now();
    q.Shutdown(absl::Milliseconds(100));
    EXPECT_GE(absl::Now() - t0, absl::Milliseconds(100));
    EXPECT_LT(absl::Now() - t0, kBound);
    ASSERT_TRUE((*a)->done());
    EXPECT_EQ((*a)->outcome().status.code(), absl::StatusCode::kCancelled);
    ASSERT_TRUE((*b)->done());
    EXPECT_EQ((*b)->outcome().status.code(), absl::StatusCode::kCancelled);
    EXPECT_EQ(gate.Order(), (std::vector<uint64_t>{1}));
  }
}

// A runner whose even request ids end at once and odd ones hand back a finish that waits until
// `open` (or its cancel): the engine's part is done, the outcome is not.
struct Finishing {
  std::atomic<bool> open{false};
  std::atomic<int> started{0};

  PrefillQueue::Runner Runner() {
    return [this](const PrefillJob& job, CancelToken& cancel) {
      ++started;
      RunnerResult r;
      r.outcome.prefilled_tokens = 1;
      if (job.request_id % 2 == 0) return r;
      r.finish = [this, &cancel] {
        std::atomic<bool> cancelled{false};
        ScopedOnCancel on_cancel(cancel, [&cancelled] { cancelled = true; });
        PrefillOutcome o;
        const absl::Time deadline = absl::Now() + kBound;
        while (!open && !cancelled && absl::Now() < deadline) {
          absl::SleepFor(absl::Milliseconds(1));
        }
        if (cancelled) {
          o.status = absl::CancelledError("finish cancelled");
        } else {
          o.prefilled_tokens = 42;
        }
        return o;
      };
      return r;
    };
  }
};

TEST(PrefillQueueTest, AFinishRunsOffTheEngineWhileTheNextJobRuns) {
  Finishing f;
  PrefillQueue q(f.Runner(), Opts(4));
  auto slow = q.Submit(Job(1));
  auto fast = q.Submit(Job(2));
  ASSERT_TRUE(slow.ok() && fast.ok());
  ASSERT_TRUE((*fast)->WaitUntil(absl::Now() + kBound));  // not held up by job 1's finish
  EXPECT_EQ((*fast)->outcome().prefilled_tokens, 1);
  EXPECT_FALSE((*slow)->done());
  EXPECT_EQ(q.finishing(), 1);
  EXPECT_EQ(q.running(), 0);
  EXPECT_EQ(q.Submit(Job(1)).status().code(), absl::StatusCode::kAlreadyExists);
  f.open = true;
  ASSERT_TRUE((*slow)->WaitUntil(absl::Now() + kBound));
  EXPECT_TRUE((*slow)->outcome().status.ok());
  EXPECT_EQ((*slow)->outcome().prefilled_tokens, 42);
  EXPECT_TRUE(WaitFor([&] { return q.finishing() == 0; }));
}

TEST(PrefillQueueTest, CancelAndShutdownReachFinishingJobs) {
  Finishing f;
  PrefillQueue q(f.Runner(), Opts(4));
  auto a = q.Submit(Job(1));
  auto b = q.Submit(Job(3));
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(WaitFor([&] { return q.finishing() == 2; }));
  EXPECT_TRUE(q.Cancel(1));
  ASSERT_TRUE((*a)->WaitUntil(absl::Now() + kBound));
  EXPECT_EQ((*a)->outcome().status.code(), absl::StatusCode::kCancelled);
  EXPECT_FALSE((*b)->done());
  q.Shutdown(absl::ZeroDuration());  // cancels job 3's finish and joins its thread
  ASSERT_TRUE((*b)->done());
  EXPECT_EQ((*b)->outcome().status.code(), absl::StatusCode::kCancelled);
}

TEST(PrefillQueueTest, TheEngineWaitsBeyondMaxFinishing) {
  Finishing f;
  PrefillQueue::Options o = Opts(4);
  o.max_finishing = 1;
  PrefillQueue q(f.Runner(), o);
  auto a = q.Submit(Job(1));
  auto b = q.Submit(Job(2));
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(WaitFor([&] { return q.finishing() == 1; }));
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(f.started.load(), 1);  // job 2 waits for job 1's finish
  EXPECT_FALSE((*b)->done());
  f.open = true;
  ASSERT_TRUE((*b)->WaitUntil(absl::Now() + kBound));
  EXPECT_EQ(f.started.load(), 2);
  ASSERT_TRUE((*a)->WaitUntil(absl::Now() + kBound));
}

TEST(CancelTokenTest, CallbackRunsOnceAndNotAfterUnregistering) {
  CancelToken t;
  int runs = 0;
  {
    ScopedOnCancel s(t, [&] { ++runs; });
    t.Cancel();
    t.Cancel();
  }
  EXPECT_EQ(runs, 1);
  EXPECT_TRUE(t.cancelled());
  t.OnCancel([&] { ++runs; });  // already cancelled: at once
  EXPECT_EQ(runs, 2);
  t.OnCancel(nullptr);
  CancelToken u;
  {
    ScopedOnCancel s(u, [&] { ++runs; });
  }
  u.Cancel();
  EXPECT_EQ(runs, 2);
}

}  // namespace
}  // namespace tripod
