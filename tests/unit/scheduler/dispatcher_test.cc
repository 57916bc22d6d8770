// The dispatcher and a request's path through real workers in this process: a decode worker
// (DecodeService over a DecodeEngine) and a prefill worker (PrefillService, full weights, fp32)
// behind real gRPC servers on 127.0.0.1:0, found by a WorkerRegistry. Checks: the decode-only and
// the disaggregated paths give the same greedy tokens; a cancelled request frees its blocks on the
// decode worker; the queue admits in order and refuses past its bound (429); shutdown ends queued
// requests with 503; many requests at once all complete (the ThreadSanitizer preset runs this).
// Every wait is bounded.
#include "scheduler/dispatcher.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/metrics/metrics.h"
#include "common/rpc/protocol.h"
#include "common/util/mutex.h"
#include "decode_node/decode_engine.h"
#include "decode_node/decode_metrics.h"
#include "decode_node/decode_service.h"
#include "prefill_node/prefill_engine.h"
#include "prefill_node/prefill_service.h"
#include "prefill_node/prefill_worker.h"
#include "tests/unit/test_model.h"

namespace tripod::scheduler {
namespace {

std::vector<int32_t> SomeIds(int n, int seed) {
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = 100 + (seed * 7919 + i * 104729) % 40000;
  return ids;
}

// What one request reported, in order.
struct Outcome {
  Mutex mu;
  CondVar cv;
  std::vector<int32_t> tokens ABSL_GUARDED_BY(mu);
  std::optional<CompletionEnd> end ABSL_GUARDED_BY(mu);
  std::optional<ApiError> error ABSL_GUARDED_BY(mu);

  RequestCallbacks Callbacks() {
    RequestCallbacks cb;
    cb.on_token = [this](const GeneratedToken& t) {
      MutexLock l(&mu);
      if (t.id >= 0) tokens.push_back(t.id);
      cv.SignalAll();
    };
    cb.on_end = [this](const CompletionEnd& e) {
      MutexLock l(&mu);
      end = e;
      cv.SignalAll();
    };
    cb.on_error = [this](const ApiError& e) {
      MutexLock l(&mu);
      error = e;
      cv.SignalAll();
    };
    return cb;
  }
  bool WaitDone(absl::Duration timeout = absl::Seconds(120)) {
    MutexLock l(&mu);
    const absl::Time until = absl::Now() + timeout;
    while (!end.has_value() && !error.has_value() && absl::Now() < until) {
      cv.WaitWithDeadline(&mu, until);
    }
    return end.has_value() || error.has_value();
  }
  bool WaitTokens(size_t n, absl::Duration timeout = absl::Seconds(120)) {
    MutexLock l(&mu);
    const absl::Time until = absl::Now() + timeout;
    while (tokens.size() < n && !end && !error && absl::Now() < until) {
      cv.WaitWithDeadline(&mu, until);
    }
    return tokens.size() >= n;
  }
};

class DispatcherTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    DecodeEngineOptions d;
    d.model_path = TestModelPath();
    d.precision = "fp32";
    d.kv_budget_bytes = size_t{64} << 20;
    d.max_tokens_per_step = 128;
    auto e = DecodeEngine::Create(d);
    ASSERT_TRUE(e.ok()) << e.status();
    decode_engine_ = e->release();
    decode_engine_->Start();
    PrefillOptions p;
    p.model_path = TestModelPath();
    p.precision = "fp32";
    p.pop.ratio = 0;  // full weights: runs any plan
    p.chunk = 32;
    auto pe = PrefillEngine::Create(p);
    ASSERT_TRUE(pe.ok()) << pe.status();
    prefill_engine_ = pe->release();
  }
  static void TearDownTestSuite() {
    decode_engine_->Stop();
    delete decode_engine_;
    delete prefill_engine_;
  }

  void SetUp() override {
    v1::ModelIdentity model;
    model.set_file_name("test.gguf");
    model.set_n_layers(prefill_engine_->model().config.n_layers);
    decode_metrics_ = std::make_unique<DecodeMetrics>(decode_registry_);
    DecodeServiceOptions so;
    so.poll = absl::Milliseconds(10);
    decode_service_ = std::make_unique<DecodeService>(*decode_engine_, *decode_metrics_, model, so);
    decode_server_ = StartServer(decode_service_.get(), &decode_port_);
    PrefillWorkerOptions wo;
    prefill_worker_ = std::make_unique<PrefillWorker>(*prefill_engine_, &prefill_registry_, wo);
    prefill_service_ = std::make_unique<PrefillService>(*prefill_worker_, model);
    prefill_server_ = StartServer(prefill_service_.get(), &prefill_port_);
  }

  void TearDown() override {
    dispatcher_.reset();
    if (registry_ != nullptr) registry_->Stop();
    registry_.reset();
    decode_service_->CancelAll("test over");
    prefill_worker_->queue().Shutdown(absl::ZeroDuration());
    for (auto* s : {decode_server_.get(), prefill_server_.get()}) {
      s->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
      s->Wait();
    }
  }

  static std::unique_ptr<grpc::Server> StartServer(grpc::Service* service, int* port) {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), port);
    b.RegisterService(service);
    b.SetMaxReceiveMessageSize(8 << 20);
    auto s = b.BuildAndStart();
    EXPECT_NE(s, nullptr);
    return s;
  }

  void MakeDispatcher(DispatcherOptions o, bool with_prefill = true) {
    WorkerRegistryOptions ro;
    ro.decode = {absl::StrCat("127.0.0.1:", decode_port_)};
    if (with_prefill) ro.prefill = {absl::StrCat("127.0.0.1:", prefill_port_)};
    ro.interval = std::chrono::milliseconds(100);
    registry_ = std::make_unique<WorkerRegistry>(ro);
    registry_->Start();
    metrics_ = std::make_unique<SchedulerMetrics>(scheduler_registry_);
    dispatcher_ = std::make_unique<Dispatcher>(*registry_, metrics_.get(), o);
  }

  PreparedRequest Greedy(std::vector<int32_t> prompt, int max_tokens, PopChoice::Kind pop) {
    PreparedRequest r;
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    r.pop.kind = pop;
    return r;
  }

  bool DecodeIdle() {
    const absl::Time until = absl::Now() + absl::Seconds(30);
    while (absl::Now() < until) {
      const v1::HealthResponse h = decode_service_->HealthNow();
      if (h.free_kv_blocks() == h.total_kv_blocks() && h.running() == 0 && h.reservations() == 0) {
        return true;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  }

  static DecodeEngine* decode_engine_;
  static PrefillEngine* prefill_engine_;
  metrics::Registry decode_registry_, prefill_registry_, scheduler_registry_;
  std::unique_ptr<DecodeMetrics> decode_metrics_;
  std::unique_ptr<DecodeService> decode_service_;
  std::unique_ptr<grpc::Server> decode_server_;
  int decode_port_ = 0;
  std::unique_ptr<PrefillWorker> prefill_worker_;
  std::unique_ptr<PrefillService> prefill_service_;
  std::unique_ptr<grpc::Server> prefill_server_;
  int prefill_port_ = 0;
  std::unique_ptr<WorkerRegistry> registry_;
  std::unique_ptr<SchedulerMetrics> metrics_;
  std::unique_ptr<Dispatcher> dispatcher_;
};
DecodeEngine* DispatcherTest::decode_engine_ = nullptr;
PrefillEngine* DispatcherTest::prefill_engine_ = nullptr;

TEST_F(DispatcherTest, DisaggregatedEqualsDecodeOnlyGreedy) {
  DispatcherOptions o;
  o.direct_prefill_tokens = 8;
  MakeDispatcher(o);
  const std::vector<int32_t> prompt = SomeIds(45, 3);
  Outcome disagg, local;
  ApiError refused;
  auto h1 =
      dispatcher_->Submit(Greedy(prompt, 6, PopChoice::Kind::kOff), disagg.Callbacks(), &refused);
  ASSERT_NE(h1, nullptr) << refused.message;
  ASSERT_TRUE(disagg.WaitDone());
  // A prompt under the threshold would go straight to decode: the same prompt with no prefill
  // worker in the registry takes that path.
  dispatcher_.reset();
  registry_->Stop();
  MakeDispatcher(o, /*with_prefill=*/false);
  auto h2 =
      dispatcher_->Submit(Greedy(prompt, 6, PopChoice::Kind::kOff), local.Callbacks(), &refused);
  ASSERT_NE(h2, nullptr) << refused.message;
  ASSERT_TRUE(local.WaitDone());
  MutexLock l1(&disagg.mu);
  MutexLock l2(&local.mu);
  ASSERT_TRUE(disagg.end.has_value()) << disagg.error->message;
  ASSERT_TRUE(local.end.has_value()) << local.error->message;
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
  ApiError refused;
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
  ApiError refused;
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
  EXPECT_EQ(refused.http_status, 429);
  EXPECT_EQ(refused.type, "rate_limit_error");
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
  ApiError refused;
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
  EXPECT_EQ(refused.http_status, 503);
  dispatcher_->Shutdown(std::chrono::milliseconds(10000));
  EXPECT_EQ(dispatcher_->running(), 0);
  ASSERT_TRUE(b.WaitDone(absl::Seconds(1)));
  MutexLock l(&b.mu);
  ASSERT_TRUE(b.error.has_value());
  EXPECT_EQ(b.error->http_status, 503);
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
      ApiError refused;
      // Half short (decode only), half long (through the prefill worker).
      handles[i] = dispatcher_->Submit(
          Greedy(SomeIds(i % 2 == 0 ? 6 : 40, 20 + i), 3, PopChoice::Kind::kDefault),
          outs[i]->Callbacks(), &refused);
      EXPECT_NE(handles[i], nullptr) << refused.message;
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(outs[i]->WaitDone()) << i;
    MutexLock l(&outs[i]->mu);
    ASSERT_TRUE(outs[i]->end.has_value()) << i << ": " << outs[i]->error->message;
    EXPECT_EQ(outs[i]->tokens.size(), 3u);
  }
  EXPECT_TRUE(DecodeIdle());
  const std::string text = scheduler_registry_.Exposition();
  EXPECT_NE(
      text.find("tripod:request_success_total{finish_reason=\"length\",role=\"scheduler\"} 12"),
      std::string::npos)
      << text;
}

TEST_F(DispatcherTest, NoDecodeWorkerIs503) {
  WorkerRegistryOptions ro;
  ro.decode = {"127.0.0.1:1"};  // nothing listens there
  ro.timeout = std::chrono::milliseconds(300);
  registry_ = std::make_unique<WorkerRegistry>(ro);
  registry_->Start();
  dispatcher_ = std::make_unique<Dispatcher>(*registry_, nullptr, DispatcherOptions{});
  ApiError refused;
  EXPECT_EQ(dispatcher_->Submit(Greedy({1, 2, 3}, 1, PopChoice::Kind::kDefault), RequestCallbacks{},
                                &refused),
            nullptr);
  EXPECT_EQ(refused.http_status, 503);
}

}  // namespace
}  // namespace tripod::scheduler
