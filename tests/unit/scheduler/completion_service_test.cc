// tripod.v1.Completion through the C++ stub: a real gRPC server holding CompletionService over a
// dispatcher and in-process workers (in_process_workers.h). Checks: Complete gives the tokens the
// dispatcher gives for the same prompt, and Generate's chunks add up to Complete's answer with
// the finish, usage and timing on the last; bad requests are the right status codes with the
// OpenAI-style JSON message (FromGrpcStatus reads it back); API keys are enforced on the
// `authorization` metadata; n > 1 choices come whole and streamed, tagged with their index; a
// client that cancels its stream, or whose deadline passes, frees the decode worker and its call
// is finished (the server shuts down).
#include "scheduler/completion_service.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "scheduler/openai_response.h"
#include "tests/unit/scheduler/in_process_workers.h"

namespace tripod::scheduler {
namespace {

class CompletionServiceTest : public InProcessWorkersTest {
 protected:
  void StartCompletion(const std::string& api_key = "") {
    auto m = LoadServedModel(TestModelPath(), "served", "");
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
    auto k = ApiKeys::Load(api_key, "");
    ASSERT_TRUE(k.ok()) << k.status();
    keys_ = std::move(*k);
    DispatcherOptions o;
    o.direct_prefill_tokens = 8;
    MakeDispatcher(o);
    service_ = std::make_unique<CompletionService>(model_.get(), dispatcher_.get(), &keys_);
    int port = 0;
    server_ = StartServer(service_.get(), &port);
    stub_ = v1::Completion::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    stub_.reset();
    if (server_ != nullptr) {
      server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
      server_->Wait();
    }
    InProcessWorkersTest::TearDown();
  }

  static v1::CompletionRequest Greedy(const std::vector<int32_t>& ids, int max_tokens) {
    v1::CompletionRequest r;
    r.set_model("served");
    r.mutable_prompt_ids()->mutable_ids()->Assign(ids.begin(), ids.end());
    r.set_max_tokens(max_tokens);
    r.set_temperature(0);
    r.set_ignore_eos(true);
    r.mutable_tripod()->set_pop("off");
    return r;
  }
  static std::unique_ptr<grpc::ClientContext> Context(const std::string& key = "") {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    if (!key.empty()) c->AddMetadata("authorization", "Bearer " + key);
    return c;
  }

  std::unique_ptr<ServedModel> model_;
  ApiKeys keys_;
  std::unique_ptr<CompletionService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Completion::Stub> stub_;
};

TEST_F(CompletionServiceTest, CompleteEqualsTheDispatcherAndGenerateAddsUpToIt) {
  StartCompletion();
  const std::vector<int32_t> prompt = SomeIds(45, 11);
  Outcome direct;
  absl::Status refused;
  PreparedRequest p;
  p.prompt = prompt;
  p.max_tokens = 6;
  p.sampling.temperature = 0;
  p.ignore_eos = true;
  p.pop.kind = PopChoice::Kind::kOff;
  ASSERT_NE(dispatcher_->Submit(p, direct.Callbacks(), &refused), nullptr) << refused;
  ASSERT_TRUE(direct.WaitDone());

  v1::CompletionResponse whole;
  auto ctx = Context();
  const grpc::Status s = stub_->Complete(ctx.get(), Greedy(prompt, 6), &whole);
  ASSERT_TRUE(s.ok()) << s.error_message();
  {
    MutexLock l(&direct.mu);
    ASSERT_TRUE(direct.end.has_value());
    EXPECT_EQ(std::vector<int32_t>(whole.token_ids().begin(), whole.token_ids().end()),
              direct.tokens);
  }
  EXPECT_EQ(whole.model(), "served");
  EXPECT_EQ(whole.finish_reason(), "length");
  EXPECT_EQ(whole.usage().prompt_tokens(), 45);
  EXPECT_EQ(whole.usage().completion_tokens(), 6);
  EXPECT_EQ(whole.usage().total_tokens(), 51);
  EXPECT_EQ(whole.timing().route(), "disaggregated");
  EXPECT_GT(whole.timing().prefill_s(), 0);
  EXPECT_FALSE(whole.text().empty());

  auto sctx = Context();
  std::unique_ptr<grpc::ClientReader<v1::CompletionChunk>> reader =
      stub_->Generate(sctx.get(), Greedy(prompt, 6));
  v1::CompletionChunk chunk, last;
  std::string text;
  int chunks = 0;
  while (reader->Read(&chunk)) {
    text += chunk.text();
    ++chunks;
    last = chunk;
  }
  const grpc::Status gs = reader->Finish();
  ASSERT_TRUE(gs.ok()) << gs.error_message();
  EXPECT_GE(chunks, 2);
  EXPECT_EQ(text, whole.text());
  EXPECT_EQ(last.finish_reason(), "length");
  EXPECT_EQ(last.usage().completion_tokens(), 6);
  EXPECT_GT(last.timing().total_s(), 0);
  EXPECT_TRUE(DecodeIdle());
}

TEST_F(CompletionServiceTest, BadRequestsAreStatusCodesWithTheJsonError) {
  StartCompletion();
  struct Case {
    std::function<void(v1::CompletionRequest*)> spoil;
    grpc::StatusCode code;
    std::string param;
  };
  const std::vector<Case> cases = {
      // Past --max_n (16), as over HTTP.
      {[](v1::CompletionRequest* r) { r->set_n(17); }, grpc::StatusCode::INVALID_ARGUMENT, "n"},
      {[](v1::CompletionRequest* r) { r->set_temperature(-1); }, grpc::StatusCode::INVALID_ARGUMENT,
       "temperature"},
      {[](v1::CompletionRequest* r) { r->set_max_tokens(1 << 20); },
       grpc::StatusCode::INVALID_ARGUMENT, "max_tokens"},
      {[](v1::CompletionRequest* r) { r->set_model("another"); }, grpc::StatusCode::NOT_FOUND,
       "model"},
      {[](v1::CompletionRequest* r) { r->mutable_prompt_ids()->clear_ids(); },
       grpc::StatusCode::INVALID_ARGUMENT, "prompt_ids"},
  };
  for (const Case& c : cases) {
    v1::CompletionRequest r = Greedy(SomeIds(10, 1), 2);
    c.spoil(&r);
    v1::CompletionResponse out;
    auto ctx = Context();
    const grpc::Status s = stub_->Complete(ctx.get(), r, &out);
    EXPECT_EQ(s.error_code(), c.code) << s.error_message();
    const ApiError e = FromGrpcStatus(s);
    EXPECT_EQ(e.param, c.param) << s.error_message();
    EXPECT_FALSE(e.message.empty());
    // Generate refuses the same way, before any chunk.
    auto sctx = Context();
    auto reader = stub_->Generate(sctx.get(), r);
    v1::CompletionChunk chunk;
    EXPECT_FALSE(reader->Read(&chunk));
    EXPECT_EQ(reader->Finish().error_code(), c.code);
  }
  EXPECT_TRUE(DecodeIdle());
}

// n > 1: greedy choices equal the single answer; Generate tags each chunk with its choice and
// ends each choice once, the last with usage (the prompt once).
TEST_F(CompletionServiceTest, ChoicesWholeAndStreamed) {
  StartCompletion();
  v1::CompletionRequest one = Greedy(SomeIds(20, 3), 5);
  v1::CompletionResponse single;
  auto c1 = Context();
  ASSERT_TRUE(stub_->Complete(c1.get(), one, &single).ok());
  v1::CompletionRequest three = one;
  three.set_n(3);
  v1::CompletionResponse whole;
  auto c3 = Context();
  const grpc::Status s = stub_->Complete(c3.get(), three, &whole);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(whole.choices_size(), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(whole.choices(i).index(), i);
    EXPECT_EQ(whole.choices(i).text(), single.text());
    EXPECT_EQ(std::vector<int32_t>(whole.choices(i).token_ids().begin(),
                                   whole.choices(i).token_ids().end()),
              std::vector<int32_t>(single.token_ids().begin(), single.token_ids().end()));
    EXPECT_EQ(whole.choices(i).finish_reason(), "length");
  }
  EXPECT_EQ(whole.text(), single.text());
  EXPECT_EQ(whole.usage().prompt_tokens(), 20);
  EXPECT_EQ(whole.usage().completion_tokens(), 15);

  auto cs = Context();
  auto reader = stub_->Generate(cs.get(), three);
  v1::CompletionChunk chunk;
  std::vector<std::string> texts(3);
  std::vector<int> ends(3, 0);
  v1::CompletionChunk last;
  while (reader->Read(&chunk)) {
    ASSERT_GE(chunk.index(), 0);
    ASSERT_LT(chunk.index(), 3);
    EXPECT_EQ(ends[chunk.index()], 0) << "a chunk after its choice's end";
    texts[chunk.index()] += chunk.text();
    if (!chunk.finish_reason().empty()) ++ends[chunk.index()];
    last = chunk;
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(texts, std::vector<std::string>(3, single.text()));
  EXPECT_EQ(ends, std::vector<int>(3, 1));
  EXPECT_EQ(last.usage().completion_tokens(), 15);
  EXPECT_TRUE(DecodeIdle());
}

TEST_F(CompletionServiceTest, ApiKeyOnTheAuthorizationMetadata) {
  StartCompletion("sesame");
  for (const std::string key : {"", "wrong"}) {
    v1::CompletionResponse out;
    auto ctx = Context(key);
    const grpc::Status s = stub_->Complete(ctx.get(), Greedy(SomeIds(5, 2), 2), &out);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << key;
    EXPECT_EQ(FromGrpcStatus(s).type, "authentication_error");
  }
  v1::CompletionResponse out;
  auto ctx = Context("sesame");
  const grpc::Status s = stub_->Complete(ctx.get(), Greedy(SomeIds(5, 2), 2), &out);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(out.usage().completion_tokens(), 2);
}

TEST_F(CompletionServiceTest, CancelledStreamFreesTheDecodeWorker) {
  StartCompletion();
  auto ctx = Context();
  auto reader = stub_->Generate(ctx.get(), Greedy(SomeIds(50, 5), 5000));
  v1::CompletionChunk chunk;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(reader->Read(&chunk)) << i;
  ctx->TryCancel();
  while (reader->Read(&chunk)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(DecodeIdle());
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (dispatcher_->running() > 0 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(dispatcher_->running(), 0);
}

TEST_F(CompletionServiceTest, DeadlinePassedOnCompleteFreesTheDecodeWorker) {
  StartCompletion();
  auto ctx = Context();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
  v1::CompletionResponse out;
  const grpc::Status s = stub_->Complete(ctx.get(), Greedy(SomeIds(50, 6), 5000), &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  EXPECT_TRUE(DecodeIdle());
  // TearDown's server shutdown waits for every reactor: the cancelled one was finished.
}

}  // namespace
}  // namespace tripod::scheduler
