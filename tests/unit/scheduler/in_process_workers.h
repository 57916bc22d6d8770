// A decode worker (DecodeService over a DecodeEngine), a prefill worker (PrefillService, full
// weights, fp32) and a draft worker (DraftService, a 4-layer self-draft) behind real gRPC servers
// on 127.0.0.1:0 in the test's process, found by a
// WorkerRegistry, with a Dispatcher over them: the fixture of the scheduler's tests that need
// workers (the dispatcher's, the Completion service's). Every wait is bounded.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/metrics/metrics.h"
#include "common/rpc/deferred_release.h"
#include "common/rpc/protocol.h"
#include "common/rpc/worker_server.h"
#include "common/util/mutex.h"
#include "decode_node/decode_engine.h"
#include "decode_node/decode_metrics.h"
#include "decode_node/decode_service.h"
#include "draft_node/draft_engine.h"
#include "draft_node/draft_metrics.h"
#include "draft_node/draft_service.h"
#include "draft_node/draft_worker.h"
#include "prefill_node/prefill_engine.h"
#include "prefill_node/prefill_service.h"
#include "prefill_node/prefill_worker.h"
#include "scheduler/dispatcher.h"
#include "scheduler/request_status.h"
#include "scheduler/scheduler_metrics.h"
#include "scheduler/worker_registry.h"
#include "tests/unit/test_model.h"

namespace tripod::scheduler {

inline std::vector<int32_t> SomeIds(int n, int seed) {
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = 100 + (seed * 7919 + i * 104729) % 40000;
  return ids;
}

// What one request reported, in order.
struct Outcome {
  Mutex mu;
  CondVar cv;
  std::vector<int32_t> tokens ABSL_GUARDED_BY(mu);
  // With n > 1 choices: the tokens by choice, each choice's on_choice_end, and how many choices
  // had ended when on_end came.
  std::map<int, std::vector<int32_t>> choice_tokens ABSL_GUARDED_BY(mu);
  std::map<int, std::vector<std::string>> choice_ends ABSL_GUARDED_BY(mu);
  size_t choices_ended_at_end ABSL_GUARDED_BY(mu) = 0;
  std::optional<CompletionEnd> end ABSL_GUARDED_BY(mu);
  std::optional<absl::Status> error ABSL_GUARDED_BY(mu);

  RequestCallbacks Callbacks() {
    RequestCallbacks cb;
    cb.on_token = [this](const GeneratedToken& t) {
      MutexLock l(&mu);
      if (t.id >= 0) tokens.push_back(t.id);
      if (t.id >= 0) choice_tokens[t.choice].push_back(t.id);
      cv.SignalAll();
    };
    cb.on_choice_end = [this](int choice, const std::string& finish) {
      MutexLock l(&mu);
      choice_ends[choice].push_back(finish);
    };
    cb.on_end = [this](const CompletionEnd& e) {
      MutexLock l(&mu);
      choices_ended_at_end = choice_ends.size();
      end = e;
      cv.SignalAll();
    };
    cb.on_error = [this](const absl::Status& e) {
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

class InProcessWorkersTest : public ::testing::Test {
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
    DraftEngineOptions r;
    r.model_path = TestModelPath();
    r.self_draft_layers = 4;
    r.precision = "fp32";
    r.prefill_chunk = 64;
    r.context_tokens = 1024;
    auto de = DraftEngine::Create(r);
    ASSERT_TRUE(de.ok()) << de.status();
    draft_engine_ = de->release();
  }
  static void TearDownTestSuite() {
    decode_engine_->Stop();
    delete decode_engine_;
    delete prefill_engine_;
    delete draft_engine_;
  }

  void SetUp() override {
    v1::ModelIdentity model;
    model.set_file_name("test.gguf");
    model.set_n_layers(prefill_engine_->model().config.n_layers);
    decode_metrics_ = std::make_unique<DecodeMetrics>(decode_registry_);
    DecodeServiceOptions so;
    decode_service_ = std::make_unique<DecodeService>(*decode_engine_, *decode_metrics_, model, so);
    decode_server_ = StartServer(decode_service_.get(), &decode_port_);
    PrefillWorkerOptions wo;
    prefill_worker_ = std::make_unique<PrefillWorker>(*prefill_engine_, &prefill_registry_, wo);
    prefill_service_ = std::make_unique<PrefillService>(*prefill_worker_, model);
    prefill_server_ = StartServer(prefill_service_.get(), &prefill_port_);
    draft_metrics_ = std::make_unique<DraftMetrics>(draft_registry_);
    draft_worker_ = std::make_unique<DraftWorker>(*draft_engine_, draft_metrics_.get(), 64);
    draft_service_ =
        std::make_unique<DraftService>(*draft_worker_, draft_metrics_.get(), model, model);
    draft_server_ = StartServer(draft_service_.get(), &draft_port_);
  }

  void TearDown() override {
    dispatcher_.reset();
    if (registry_ != nullptr) registry_->Stop();
    registry_.reset();
    // The calls' leftovers (contexts, workers) go on the release thread: gone before the servers.
    EXPECT_TRUE(FlushReleases(std::chrono::seconds(10)));
    decode_service_->CancelAll("test over");
    prefill_worker_->queue().Shutdown(absl::ZeroDuration());
    draft_worker_->Shutdown(absl::ZeroDuration());
    for (auto* s : {decode_server_.get(), prefill_server_.get(), draft_server_.get()}) {
      s->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
      s->Wait();
    }
  }

  static std::unique_ptr<grpc::Server> StartServer(grpc::Service* service, int* port) {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), port);
    b.RegisterService(service);
    ConfigureWorkerServer(b);  // as the workers' mains: 8 MiB messages, keepalive pings allowed
    auto s = b.BuildAndStart();
    EXPECT_NE(s, nullptr);
    return s;
  }

  void MakeDispatcher(DispatcherOptions o, bool with_prefill = true) {
    WorkerRegistryOptions ro;
    ro.decode = {absl::StrCat("127.0.0.1:", decode_port_)};
    if (with_prefill) ro.prefill = {absl::StrCat("127.0.0.1:", prefill_port_)};
    ro.draft = {absl::StrCat("127.0.0.1:", draft_port_)};
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

  static inline DecodeEngine* decode_engine_ = nullptr;
  static inline PrefillEngine* prefill_engine_ = nullptr;
  static inline DraftEngine* draft_engine_ = nullptr;
  metrics::Registry decode_registry_, prefill_registry_, draft_registry_, scheduler_registry_;
  std::unique_ptr<DecodeMetrics> decode_metrics_;
  std::unique_ptr<DecodeService> decode_service_;
  std::unique_ptr<grpc::Server> decode_server_;
  int decode_port_ = 0;
  std::unique_ptr<PrefillWorker> prefill_worker_;
  std::unique_ptr<PrefillService> prefill_service_;
  std::unique_ptr<grpc::Server> prefill_server_;
  int prefill_port_ = 0;
  std::unique_ptr<DraftMetrics> draft_metrics_;
  std::unique_ptr<DraftWorker> draft_worker_;
  std::unique_ptr<DraftService> draft_service_;
  std::unique_ptr<grpc::Server> draft_server_;
  int draft_port_ = 0;
  std::unique_ptr<WorkerRegistry> registry_;
  std::unique_ptr<SchedulerMetrics> metrics_;
  std::unique_ptr<Dispatcher> dispatcher_;
};

}  // namespace tripod::scheduler
