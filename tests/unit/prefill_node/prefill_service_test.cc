// PrefillService end to end in one process: a real gRPC server for tripod.v1.Prefill over a
// PrefillWorker (bundled model, POP 1/3, fp32, 16-token chunks), and a real decode side
// (fake_decode.h) that receives the KV. Checks: the KV that lands equals the engine's snapshot
// byte for byte, the response's counts and timing; a one-token prompt sends the end message
// alone; bad requests and an old protocol are refused with the right codes; the decode side's
// refusal comes back with its code and message; a deadline that passes cancels the job and its
// stream; Health and Cancel; the metrics count outcomes. Every wait is bounded.
#include "prefill_node/prefill_service.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/metrics/metrics.h"
#include "common/rpc/protocol.h"
#include "prefill_node/prefill_metrics.h"
#include "tests/unit/common/kv_transfer/fake_decode.h"
#include "tests/unit/test_model.h"

namespace tripod::prefill_service_test {
namespace {

std::vector<int32_t> SomeIds(int n, int seed) {
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = 100 + (seed * 7919 + i * 104729) % 40000;
  return ids;
}

class PrefillServiceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    PrefillOptions o;
    o.model_path = TestModelPath();
    o.precision = "fp32";
    o.pop.ratio = 1.0 / 3;
    o.chunk = 16;
    auto e = PrefillEngine::Create(o);
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = e->release();
  }
  static void TearDownTestSuite() {
    delete engine_;
    engine_ = nullptr;
  }

  void SetUp() override {
    ASSERT_NE(engine_, nullptr);
    PrefillWorkerOptions wo;
    wo.max_queue = 4;
    worker_ = std::make_unique<PrefillWorker>(*engine_, &registry_, wo);
    v1::ModelIdentity model;
    model.set_file_name("test.gguf");
    service_ = std::make_unique<PrefillService>(*worker_, model);
    service_->set_poll_interval(absl::Milliseconds(5));
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(service_.get());
    server_ = b.BuildAndStart();
    ASSERT_NE(port, 0);
    stub_ = v1::Prefill::NewStub(NewWorkerChannel("127.0.0.1:" + std::to_string(port)));
  }
  void TearDown() override {
    worker_->queue().Shutdown(absl::ZeroDuration());
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  }

  KvLayout Layout() const {
    const ModelConfig& c = engine_->model().config;
    return KvLayout{c.n_layers, c.n_kv_heads, c.head_dim, engine_->kv_dtype()};
  }
  v1::PrefillRequest Request(const std::vector<int32_t>& prompt, const FakeDecode& decode,
                             uint64_t transfer_id, uint64_t id = 1) {
    v1::PrefillRequest r;
    r.set_request_id(id);
    for (int32_t t : prompt) r.add_prompt(t);
    r.set_decode_address(decode.address());
    r.set_transfer_id(transfer_id);
    return r;
  }
  grpc::Status Call(const v1::PrefillRequest& req, v1::PrefillResponse* resp,
                    std::chrono::milliseconds timeout = std::chrono::milliseconds(60000)) {
    auto ctx = NewClientContext(timeout);
    return stub_->Run(ctx.get(), req, resp);
  }
  bool WaitIdle() {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (worker_->queue().running() + worker_->queue().queued() > 0) {
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return true;
  }

  static PrefillEngine* engine_;
  metrics::Registry registry_;
  std::unique_ptr<PrefillWorker> worker_;
  std::unique_ptr<PrefillService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Prefill::Stub> stub_;
};
PrefillEngine* PrefillServiceTest::engine_ = nullptr;

TEST_F(PrefillServiceTest, KvLandsOnTheDecodeSideAsTheEngineMadeIt) {
  const std::vector<int32_t> prompt = SomeIds(41, 1);
  FakeDecode decode(21, Layout(), 40);
  v1::PrefillResponse resp;
  const grpc::Status s = Call(Request(prompt, decode, 21), &resp);
  ASSERT_TRUE(s.ok()) << s.error_code() << " " << s.error_message();
  EXPECT_EQ(resp.prefilled_tokens(), 40);
  EXPECT_EQ(resp.plan_key(), engine_->plan().KvKey());
  EXPECT_EQ(resp.bytes_sent(), 40u * Layout().bytes_per_token());
  // Three prompt chunks, each: 20 kept layers one by one, the 10 stacked ones in one message.
  EXPECT_EQ(resp.chunks_sent(), 3u * 21u);
  EXPECT_EQ(decode.seqs().size(), resp.chunks_sent() + 1);
  EXPECT_GT(resp.compute_s(), 0);
  EXPECT_GT(resp.transfer_s(), 0);
  EXPECT_GE(resp.tail_s(), 0);
  EXPECT_GE(resp.queue_s(), 0);
  EXPECT_GE(resp.total_s(), resp.compute_s());
  EXPECT_GE(resp.total_s(), resp.tail_s());
  EXPECT_TRUE(decode.completed());

  ASSERT_TRUE(WaitIdle());
  auto snap = engine_->Run(prompt);  // the worker is idle: the engine is free for this thread
  ASSERT_TRUE(snap.ok()) << snap.status();
  const KvSnapshot got = decode.Received();
  ASSERT_EQ(got.k.size(), snap->kv.k.size());
  EXPECT_EQ(std::memcmp(got.k.data(), snap->kv.k.data(), got.k.size()), 0);
  EXPECT_EQ(std::memcmp(got.v.data(), snap->kv.v.data(), got.v.size()), 0);

  const std::string text = registry_.Exposition();
  EXPECT_NE(text.find("tripod:prefill_requests_total{outcome=\"ok\",role=\"prefill\"} 1"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("tripod:prompt_tokens_total{role=\"prefill\"} 41"), std::string::npos);
  EXPECT_NE(text.find("tripod:pop_layers_skipped_total{role=\"prefill\"} 10"), std::string::npos);
  EXPECT_NE(text.find(absl::StrCat("tripod:kv_transfer_bytes_total{role=\"prefill\"} ",
                                   resp.bytes_sent())),
            std::string::npos);
  EXPECT_NE(text.find("tripod:kv_transfer_seconds_count{role=\"prefill\"} 1"), std::string::npos);
  EXPECT_NE(text.find("tripod:request_prefill_time_seconds_count{role=\"prefill\"} 1"),
            std::string::npos);
  EXPECT_NE(text.find("tripod:num_requests_waiting{role=\"prefill\"} 0"), std::string::npos);
  // 10 K/V-only layers over the 40 tokens the prefill ran.
  const double saved = PopFlopsSaved(engine_->model().config, engine_->plan(), 40);
  EXPECT_GT(saved, 0);
  const std::string series = "tripod:prefill_flops_saved_total{role=\"prefill\"} ";
  const size_t at = text.find(series);
  ASSERT_NE(at, std::string::npos) << text;
  EXPECT_DOUBLE_EQ(std::stod(text.substr(at + series.size())), saved);
}

TEST_F(PrefillServiceTest, OneTokenPromptSendsOnlyTheEnd) {
  FakeDecode decode(22, Layout(), 0);
  v1::PrefillResponse resp;
  const grpc::Status s = Call(Request({42}, decode, 22), &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.prefilled_tokens(), 0);
  EXPECT_EQ(resp.chunks_sent(), 0u);
  EXPECT_EQ(resp.bytes_sent(), 0u);
  EXPECT_EQ(decode.seqs(), std::vector<uint32_t>{0});
  EXPECT_TRUE(decode.completed());
}

TEST_F(PrefillServiceTest, RefusesBadRequests) {
  FakeDecode decode(23, Layout(), 40);
  const std::vector<int32_t> prompt = SomeIds(41, 2);
  v1::PrefillResponse resp;
  auto code = [&](const v1::PrefillRequest& r) { return Call(r, &resp).error_code(); };
  v1::PrefillRequest r = Request({}, decode, 23);
  EXPECT_EQ(code(r), grpc::StatusCode::INVALID_ARGUMENT);
  r = Request({1, engine_->model().config.vocab_size}, decode, 23);
  EXPECT_EQ(code(r), grpc::StatusCode::INVALID_ARGUMENT);
  r = Request(std::vector<int32_t>(engine_->model().config.context_length + 1, 5), decode, 23);
  EXPECT_EQ(code(r), grpc::StatusCode::INVALID_ARGUMENT);
  r = Request(prompt, decode, 23);
  r.clear_decode_address();
  EXPECT_EQ(code(r), grpc::StatusCode::INVALID_ARGUMENT);
  r = Request(prompt, decode, 0);
  EXPECT_EQ(code(r), grpc::StatusCode::INVALID_ARGUMENT);
  r = Request(prompt, decode, 23);
  r.mutable_trimming()->set_method(v1::TRIM_SPECKV);  // without a budget
  EXPECT_EQ(code(r), grpc::StatusCode::INVALID_ARGUMENT);
  r.mutable_trimming()->set_method(static_cast<v1::TrimMethod>(99));
  r.mutable_trimming()->set_budget(8);
  EXPECT_EQ(code(r), grpc::StatusCode::INVALID_ARGUMENT);
  // Plans: another ratio on this pruned worker; a bad ratio; the worker's own, named explicitly.
  r = Request(prompt, decode, 23);
  r.mutable_plan()->set_pop_ratio("0");
  const grpc::Status other = Call(r, &resp);
  EXPECT_EQ(other.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(other.error_message().find("F20 K10"), std::string::npos) << other.error_message();
  r.mutable_plan()->set_pop_ratio("abc");
  EXPECT_EQ(code(r), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(decode.calls(), 0) << "nothing refused may reach the decode side";
  for (int l = 20; l < 30; ++l) r.mutable_plan()->mutable_skipped_layers()->add_layers(l);
  EXPECT_EQ(code(r), grpc::StatusCode::OK);

  // A caller without the protocol's metadata.
  grpc::ClientContext bare;
  const grpc::Status old = stub_->Run(&bare, Request(prompt, decode, 23), &resp);
  EXPECT_EQ(old.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(old.error_message().find("protocol"), std::string::npos);

  const std::string text = registry_.Exposition();
  EXPECT_NE(
      text.find("tripod:prefill_requests_total{outcome=\"invalid_argument\",role=\"prefill\"} 8"),
      std::string::npos)
      << text;
}

TEST_F(PrefillServiceTest, DecodeRefusalPassesThrough) {
  FakeDecode decode(24, Layout(), 40);
  FakeDecode::Behavior b;
  b.refuse_at_seq = 5;
  b.refusal = grpc::Status(grpc::StatusCode::OUT_OF_RANGE, "transfer 24 chunk 5: overflows");
  decode.set_behavior(b);
  v1::PrefillResponse resp;
  const grpc::Status s = Call(Request(SomeIds(41, 3), decode, 24), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_EQ(s.error_message(), "transfer 24 chunk 5: overflows");
  EXPECT_TRUE(WaitIdle());
}

TEST_F(PrefillServiceTest, DeadlineCancelsTheJobAndItsStream) {
  FakeDecode decode(25, Layout(), 40);
  FakeDecode::Behavior b;
  b.hold = true;                    // never reads:
  b.ack_delay = absl::Seconds(30);  // and would never acknowledge
  decode.set_behavior(b);
  v1::PrefillResponse resp;
  const absl::Time t0 = absl::Now();
  const grpc::Status s =
      Call(Request(SomeIds(41, 4), decode, 25), &resp, std::chrono::milliseconds(500));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  EXPECT_LT(absl::Now() - t0, absl::Seconds(10));
  ASSERT_TRUE(WaitIdle()) << "the job did not stop";
  decode.Release();
  ASSERT_TRUE(decode.WaitDone(absl::Seconds(30)));
  EXPECT_FALSE(decode.completed());
}

TEST_F(PrefillServiceTest, HealthAndCancel) {
  v1::HealthResponse h;
  {
    auto ctx = NewClientContext(std::chrono::milliseconds(10000));
    ASSERT_TRUE(stub_->Health(ctx.get(), v1::HealthRequest(), &h).ok());
  }
  EXPECT_EQ(h.role(), v1::ROLE_PREFILL);
  EXPECT_EQ(h.protocol_version(), kProtocolVersion);
  EXPECT_EQ(h.plan_key(), engine_->plan().KvKey());
  EXPECT_EQ(h.plan(), "F20 K10");
  EXPECT_EQ(h.model().file_name(), "test.gguf");
  EXPECT_EQ(h.queued(), 0);
  EXPECT_EQ(h.running(), 0);
  EXPECT_FALSE(h.draining());
  v1::CancelRequest c;
  c.set_request_id(12345);
  v1::CancelResponse cr;
  auto ctx = NewClientContext(std::chrono::milliseconds(10000));
  ASSERT_TRUE(stub_->Cancel(ctx.get(), c, &cr).ok());
  EXPECT_FALSE(cr.found());
  worker_->queue().Drain();
  EXPECT_TRUE(service_->HealthNow().draining());
}

}  // namespace
}  // namespace tripod::prefill_service_test
