// The dispatcher and a request's path through real workers in this process (in_process_workers.h).
// Checks: the decode-only and the disaggregated paths give the same greedy tokens; a cancelled
// request frees its blocks on the decode worker; the queue admits in order and refuses past its
// bound (429); shutdown ends queued requests with 503; many requests at once all complete; the
// draft hop applies each method, with requests in flight together and cancelled while drafting
// (the ThreadSanitizer preset runs this).
#include "scheduler/dispatcher.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "scheduler/request_status.h"
#include "tests/unit/scheduler/in_process_workers.h"

namespace tripod::scheduler {
namespace {

class DispatcherTest : public InProcessWorkersTest {};

TEST_F(DispatcherTest, DisaggregatedEqualsDecodeOnlyGreedy) {
  DispatcherOptions o;
  o.direct_prefill_tokens = 8;
  MakeDispatcher(o);
  const std::vector<int32_t> prompt = SomeIds(45, 3);
  Outcome disagg, local;
  absl::Status refused;
  auto h1 =
      dispatcher_->Submit(Greedy(prompt, 6, PopChoice::Kind::kOff), disagg.Callbacks(), &refused);
  ASSERT_NE(h1, nullptr) << refused;
  ASSERT_TRUE(disagg.WaitDone());
  // A prompt under the threshold would go straight to decode: the same prompt with no prefill
  // worker in the registry takes that path.
  dispatcher_.reset();
  registry_->Stop();
  MakeDispatcher(o, /*with_prefill=*/false);
  auto h2 =
      dispatcher_->Submit(Greedy(prompt, 6, PopChoice::Kind::kOff), local.Callbacks(), &refused);
  ASSERT_NE(h2, nullptr) << refused;
  ASSERT_TRUE(local.WaitDone());
  MutexLock l1(&disagg.mu);
  MutexLock l2(&local.mu);
  ASSERT_TRUE(disagg.end.has_value()) << disagg.error->message();
  ASSERT_TRUE(local.end.has_value()) << local.error->message();
  EXPECT_EQ(disagg.end->times.route, "disaggregated");
  EXPECT_EQ(local.end->times.route, "decode_only");
  EXPECT_EQ(disagg.tokens.size(), 6u);
  EXPECT_EQ(disagg.tokens, local.tokens);
  EXPECT_EQ(disagg.end->usage.prompt_tokens, 45);
  EXPECT_EQ(disagg.end->usage.completion_tokens, 6);
  EXPECT_EQ(disagg.end->finish_reason, "length");
  EXPECT_GT(disagg.end->times.prefill_s, 0);
  EXPECT_TRUE(DecodeIdle());
}

TEST_F(DispatcherTest, CancelMidStreamFreesTheDecodeWorker) {
  MakeDispatcher(DispatcherOptions{});
  Outcome out;
  absl::Status refused;
  auto h = dispatcher_->Submit(Greedy(SomeIds(60, 4), 5000, PopChoice::Kind::kDefault),
                               out.Callbacks(), &refused);
  ASSERT_NE(h, nullptr);
  ASSERT_TRUE(out.WaitTokens(3));
  h->Cancel();
  h->Cancel();  // idempotent
  EXPECT_TRUE(DecodeIdle());
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (dispatcher_->running() > 0 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(dispatcher_->running(), 0);
  MutexLock l(&out.mu);
  EXPECT_FALSE(out.end.has_value());  // a client that left hears nothing more
  EXPECT_FALSE(out.error.has_value());
}

TEST_F(DispatcherTest, QueueAdmitsInOrderAndRefusesPastItsBound) {
  DispatcherOptions o;
  o.max_inflight = 1;
  o.max_queue = 1;
  MakeDispatcher(o);
  Outcome a, b, c;
  absl::Status refused;
  auto ha = dispatcher_->Submit(Greedy(SomeIds(20, 5), 40, PopChoice::Kind::kDefault),
                                a.Callbacks(), &refused);
  auto hb = dispatcher_->Submit(Greedy(SomeIds(20, 6), 4, PopChoice::Kind::kDefault), b.Callbacks(),
                                &refused);
  ASSERT_NE(ha, nullptr);
  ASSERT_NE(hb, nullptr);
  EXPECT_EQ(dispatcher_->waiting(), 1);
  auto hc = dispatcher_->Submit(Greedy(SomeIds(20, 7), 4, PopChoice::Kind::kDefault), c.Callbacks(),
                                &refused);
  EXPECT_EQ(hc, nullptr);
  EXPECT_EQ(ToApiError(refused).http_status, 429);
  EXPECT_EQ(ToApiError(refused).type, "rate_limit_error");
  ASSERT_TRUE(a.WaitDone());
  ASSERT_TRUE(b.WaitDone());
  MutexLock la(&a.mu);
  MutexLock lb(&b.mu);
  ASSERT_TRUE(a.end.has_value() && b.end.has_value());
  EXPECT_GT(b.end->times.queue_s, 0);  // b waited for a
  EXPECT_EQ(b.end->usage.completion_tokens, 4);
}

TEST_F(DispatcherTest, ShutdownEndsQueuedRequestsWith503) {
  DispatcherOptions o;
  o.max_inflight = 1;
  MakeDispatcher(o);
  Outcome a, b;
  absl::Status refused;
  auto ha = dispatcher_->Submit(Greedy(SomeIds(20, 8), 5000, PopChoice::Kind::kDefault),
                                a.Callbacks(), &refused);
  auto hb = dispatcher_->Submit(Greedy(SomeIds(20, 9), 4, PopChoice::Kind::kDefault), b.Callbacks(),
                                &refused);
  ASSERT_TRUE(ha && hb);
  ASSERT_TRUE(a.WaitTokens(1));
  dispatcher_->StartDraining();
  EXPECT_EQ(dispatcher_->Submit(Greedy(SomeIds(5, 1), 1, PopChoice::Kind::kDefault),
                                RequestCallbacks{}, &refused),
            nullptr);
  EXPECT_EQ(ToApiError(refused).http_status, 503);
  dispatcher_->Shutdown(std::chrono::milliseconds(10000));
  EXPECT_EQ(dispatcher_->running(), 0);
  ASSERT_TRUE(b.WaitDone(absl::Seconds(1)));
  MutexLock l(&b.mu);
  ASSERT_TRUE(b.error.has_value());
  EXPECT_EQ(ToApiError(*b.error).http_status, 503);
  EXPECT_TRUE(DecodeIdle());
}

TEST_F(DispatcherTest, ManyAtOnceAllComplete) {
  DispatcherOptions o;
  o.direct_prefill_tokens = 16;
  o.max_inflight = 6;
  MakeDispatcher(o);
  constexpr int kRequests = 12;
  std::vector<std::unique_ptr<Outcome>> outs;
  for (int i = 0; i < kRequests; ++i) outs.push_back(std::make_unique<Outcome>());
  std::vector<std::shared_ptr<RequestHandle>> handles(kRequests);
  std::vector<std::thread> threads;
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back([&, i] {
      absl::Status refused;
      // Half short (decode only), half long (through the prefill worker).
      handles[i] = dispatcher_->Submit(
          Greedy(SomeIds(i % 2 == 0 ? 6 : 40, 20 + i), 3, PopChoice::Kind::kDefault),
          outs[i]->Callbacks(), &refused);
      EXPECT_NE(handles[i], nullptr) << refused;
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(outs[i]->WaitDone()) << i;
    MutexLock l(&outs[i]->mu);
    ASSERT_TRUE(outs[i]->end.has_value()) << i << ": " << outs[i]->error->message();
    EXPECT_EQ(outs[i]->tokens.size(), 3u);
  }
  EXPECT_TRUE(DecodeIdle());
  const std::string text = scheduler_registry_.Exposition();
  EXPECT_NE(
      text.find("tripod:request_success_total{finish_reason=\"length\",role=\"scheduler\"} 12"),
      std::string::npos)
      << text;
}

TEST_F(DispatcherTest, DraftHopAppliesEveryMethodConcurrentlyAndCancelsCleanly) {
  DispatcherOptions o;
  o.direct_prefill_tokens = 8;
  MakeDispatcher(o);
  // The registry's first round has run: the draft worker is in routing.
  ASSERT_EQ(registry_->Healthy(v1::ROLE_DRAFT).size(), 1u);
  const std::vector<DraftMethod> methods = {DraftMethod::kSpecKv, DraftMethod::kSpecPc,
                                            DraftMethod::kDraftMap, DraftMethod::kSnapKv,
                                            DraftMethod::kStreamingLlm};
  std::vector<Outcome> outs(methods.size());
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (size_t i = 0; i < methods.size(); ++i) {
    PreparedRequest r = Greedy(SomeIds(90, 10 + static_cast<int>(i)), 4, PopChoice::Kind::kOff);
    r.method.method = methods[i];
    r.method.budget_tokens = 40;
    absl::Status refused;
    handles.push_back(dispatcher_->Submit(std::move(r), outs[i].Callbacks(), &refused));
    ASSERT_NE(handles.back(), nullptr) << refused;
  }
  // One more, cancelled at once: while queued or drafting, it ends without a word.
  Outcome gone;
  {
    PreparedRequest r = Greedy(SomeIds(300, 99), 4, PopChoice::Kind::kOff);
    r.method.method = DraftMethod::kSpecKv;
    r.method.budget_tokens = 64;
    absl::Status refused;
    auto h = dispatcher_->Submit(std::move(r), gone.Callbacks(), &refused);
    ASSERT_NE(h, nullptr);
    h->Cancel();
  }
  for (size_t i = 0; i < methods.size(); ++i) {
    SCOPED_TRACE(DraftMethodName(methods[i]));
    ASSERT_TRUE(outs[i].WaitDone());
    MutexLock l(&outs[i].mu);
    ASSERT_TRUE(outs[i].end.has_value()) << outs[i].error->message();
    const MethodReport& m = outs[i].end->times.method;
    EXPECT_EQ(m.name, DraftMethodName(methods[i]));
    EXPECT_TRUE(m.applied) << m.fallback;
    EXPECT_EQ(m.budget, 40);
    EXPECT_EQ(outs[i].tokens.size(), 4u);
    EXPECT_EQ(outs[i].end->usage.prompt_tokens, 90);
    if (methods[i] == DraftMethod::kSpecPc) {
      EXPECT_EQ(m.prompt_tokens, 40);
    } else {
      EXPECT_EQ(m.kv_entries, 40);
      EXPECT_GT(m.kv_bytes_saved, 0);
    }
    EXPECT_EQ(outs[i].end->times.draft_s >= 0, NeedsDraft(methods[i]));
  }
  const absl::Time until = absl::Now() + absl::Seconds(30);
  while (dispatcher_->running() > 0 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(dispatcher_->running(), 0);
  EXPECT_TRUE(DecodeIdle());
  MutexLock l(&gone.mu);
  EXPECT_FALSE(gone.end.has_value());
  EXPECT_FALSE(gone.error.has_value());
}

TEST_F(DispatcherTest, NoDecodeWorkerIs503) {
  WorkerRegistryOptions ro;
  ro.decode = {"127.0.0.1:1"};  // nothing listens there
  ro.timeout = std::chrono::milliseconds(300);
  registry_ = std::make_unique<WorkerRegistry>(ro);
  registry_->Start();
  dispatcher_ = std::make_unique<Dispatcher>(*registry_, nullptr, DispatcherOptions{});
  absl::Status refused;
  EXPECT_EQ(dispatcher_->Submit(Greedy({1, 2, 3}, 1, PopChoice::Kind::kDefault), RequestCallbacks{},
                                &refused),
            nullptr);
  EXPECT_EQ(ToApiError(refused).http_status, 503);
}

}  // namespace
}  // namespace tripod::scheduler
