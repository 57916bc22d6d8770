// OpenAI-compatible response formatting: the exact JSON shapes of whole answers, SSE chunks and
// framing, logprobs in both shapes, errors, the model list, and the gRPC messages and statuses.
#include "scheduler/openai_response.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/model/gguf.h"
#include "nlohmann/json.hpp"
#include "scheduler/openai_json.h"
#include "scheduler/openai_request.h"
#include "tests/unit/test_model.h"

namespace tripod::scheduler {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::StartsWith;

class OpenAiResponseTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto gguf = GgufFile::Open(TestModelPath());
    ASSERT_TRUE(gguf.ok()) << gguf.status();
    auto tok = Tokenizer::FromGguf(**gguf);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = std::move(*tok).release();
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    tokenizer_ = nullptr;
  }

  // Tokens of `text` as the lifecycle would report them: each with the text it released (a
  // split character waits for its last byte), a log-probability of -0.5 * (i + 1), and `k`
  // alternatives (ids 10.., log-probabilities -1, -2, ...).
  static std::vector<GeneratedToken> TokensOf(const std::string& text, int k) {
    std::vector<GeneratedToken> out;
    const std::vector<int32_t> ids = tokenizer_->Encode(text, false);
    StreamingDecoder decoder(*tokenizer_);
    for (size_t i = 0; i < ids.size(); ++i) {
      GeneratedToken t;
      t.id = ids[i];
      t.text = decoder.Push(ids[i]);
      if (i + 1 == ids.size()) t.text += decoder.Flush();
      t.logprob = -0.5f * static_cast<float>(i + 1);
      for (int j = 0; j < k; ++j) t.top.push_back({10 + j, -1.0f - static_cast<float>(j)});
      out.push_back(t);
    }
    return out;
  }

  static ResponseContext Context(ApiKind kind, bool logprobs, int top, bool include_usage) {
    ResponseContext ctx;
    ctx.kind = kind;
    ctx.id = kind == ApiKind::kChatCompletion ? "chatcmpl-abc" : "cmpl-abc";
    ctx.model = "smol";
    ctx.created = 1700000000;
    ctx.logprobs = logprobs;
    ctx.top_logprobs = top;
    ctx.include_usage = include_usage;
    return ctx;
  }

  static CompletionEnd End() {
    CompletionEnd end;
    end.finish_reason = "length";
    end.usage = {12, 3, 8};
    end.times.queue_s = 0.001;
    end.times.prefill_s = 0.25;
    end.times.transfer_s = 0.0;
    end.times.first_token_s = 0.3;
    end.times.decode_s = 0.5;
    end.times.total_s = 1.0;
    end.times.route = "disaggregated";
    return end;  // draft_s stays -1: did not run
  }

  // The events of an SSE text: each "data: X\n\n" -> X.
  static std::vector<std::string> Events(const std::string& sse) {
    std::vector<std::string> out;
    size_t pos = 0;
    while (pos < sse.size()) {
      EXPECT_EQ(sse.compare(pos, 6, "data: "), 0) << sse.substr(pos);
      const size_t end = sse.find("\n\n", pos);
      EXPECT_NE(end, std::string::npos);
      if (end == std::string::npos) break;
      out.push_back(sse.substr(pos + 6, end - pos - 6));
      pos = end + 2;
    }
    return out;
  }

  static Tokenizer* tokenizer_;
};

Tokenizer* OpenAiResponseTest::tokenizer_ = nullptr;

// A string as it reads back from our JSON (invalid UTF-8 replaced by U+FFFD).
std::string AsJsonText(const std::string& s) {
  return json::parse(DumpJson(nlohmann::ordered_json(s))).get<std::string>();
}

void ExpectTiming(const json& t) {
  ASSERT_TRUE(t.is_object()) << t.dump();
  EXPECT_DOUBLE_EQ(t["queue_s"].get<double>(), 0.001);
  EXPECT_TRUE(t["draft_s"].is_null());  // did not run
  EXPECT_DOUBLE_EQ(t["prefill_s"].get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(t["transfer_s"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(t["first_token_s"].get<double>(), 0.3);
  EXPECT_DOUBLE_EQ(t["decode_s"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(t["total_s"].get<double>(), 1.0);
  EXPECT_EQ(t["route"], "disaggregated");
  EXPECT_TRUE(t["method"].is_null());  // none asked
  EXPECT_EQ(t.size(), 9u);
}

TEST(OpenAiTimingTest, MethodOutcomeInTheTripodObject) {
  StageTimes times;
  times.draft_s = 0.125;
  times.method.name = "speckv";
  times.method.budget = 256;
  times.method.applied = true;
  times.method.prompt_tokens = 1000;
  times.method.kv_entries = 256;
  times.method.kv_bytes_saved = 4096;
  const json t = json::parse(DumpJson(TimingJson(times)));
  EXPECT_DOUBLE_EQ(t["draft_s"].get<double>(), 0.125);
  const json& m = t["method"];
  EXPECT_EQ(m["name"], "speckv");
  EXPECT_EQ(m["budget"], 256);
  EXPECT_EQ(m["applied"], true);
  EXPECT_TRUE(m["fallback"].is_null());
  EXPECT_EQ(m["prompt_tokens"], 1000);
  EXPECT_EQ(m["kv_entries"], 256);
  EXPECT_EQ(m["kv_bytes_saved"], 4096);

  times.method.applied = false;
  times.method.fallback = "draft worker 127.0.0.1:5: timed out";
  times.method.kv_entries = 0;
  const json f = json::parse(DumpJson(TimingJson(times)))["method"];
  EXPECT_EQ(f["applied"], false);
  EXPECT_EQ(f["fallback"], "draft worker 127.0.0.1:5: timed out");
  EXPECT_TRUE(f["kv_entries"].is_null());
}

void ExpectUsage(const json& u) {
  EXPECT_EQ(u["prompt_tokens"], 12);
  EXPECT_EQ(u["completion_tokens"], 3);
  EXPECT_EQ(u["total_tokens"], 15);
  EXPECT_EQ(u["prompt_tokens_details"]["cached_tokens"], 8);
}

TEST_F(OpenAiResponseTest, TextCompletionBody) {
  const auto tokens = TokensOf(" Paris is nice", 0);
  const json b = json::parse(CompletionResponseBody(Context(ApiKind::kCompletion, false, 0, false),
                                                    tokens, End(), *tokenizer_));
  EXPECT_EQ(b["id"], "cmpl-abc");
  EXPECT_EQ(b["object"], "text_completion");
  EXPECT_EQ(b["created"], 1700000000);
  EXPECT_EQ(b["model"], "smol");
  ASSERT_EQ(b["choices"].size(), 1u);
  const json& c = b["choices"][0];
  EXPECT_EQ(c["index"], 0);
  EXPECT_EQ(c["text"], " Paris is nice");
  EXPECT_TRUE(c["logprobs"].is_null());
  EXPECT_EQ(c["finish_reason"], "length");
  EXPECT_FALSE(c.contains("message"));
  ExpectUsage(b["usage"]);
  ExpectTiming(b["tripod"]);
}

TEST_F(OpenAiResponseTest, ChatCompletionBody) {
  const auto tokens = TokensOf("Hello!", 0);
  CompletionEnd end = End();
  end.finish_reason = "stop";
  const json b = json::parse(CompletionResponseBody(
      Context(ApiKind::kChatCompletion, false, 0, false), tokens, end, *tokenizer_));
  EXPECT_EQ(b["id"], "chatcmpl-abc");
  EXPECT_EQ(b["object"], "chat.completion");
  const json& c = b["choices"][0];
  EXPECT_EQ(c["message"], json({{"role", "assistant"}, {"content", "Hello!"}}));
  EXPECT_TRUE(c["logprobs"].is_null());
  EXPECT_EQ(c["finish_reason"], "stop");
  EXPECT_FALSE(c.contains("text"));
  ExpectUsage(b["usage"]);
}

TEST_F(OpenAiResponseTest, CompletionLogprobsShape) {
  // "é" is two bytes but one code point: text_offset counts code points. A text-only event
  // (id -1) adds text but no entry.
  auto tokens = TokensOf("A café ok", 2);
  GeneratedToken tail;
  tail.text = "!";
  tokens.push_back(tail);
  const json b = json::parse(CompletionResponseBody(Context(ApiKind::kCompletion, true, 2, false),
                                                    tokens, End(), *tokenizer_));
  const json& lp = b["choices"][0]["logprobs"];
  ASSERT_TRUE(lp.is_object());
  EXPECT_EQ(lp.size(), 4u);
  const size_t n = tokens.size() - 1;
  ASSERT_EQ(lp["tokens"].size(), n);
  ASSERT_EQ(lp["token_logprobs"].size(), n);
  ASSERT_EQ(lp["top_logprobs"].size(), n);
  ASSERT_EQ(lp["text_offset"].size(), n);
  int64_t offset = 0;
  std::string joined;
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(lp["tokens"][i], AsJsonText(TokenPiece(*tokenizer_, tokens[i].id)));
    joined += tokens[i].text;
    EXPECT_FLOAT_EQ(lp["token_logprobs"][i].get<float>(), tokens[i].logprob);
    EXPECT_EQ(lp["text_offset"][i], offset);
    for (unsigned char ch : tokens[i].text) offset += (ch & 0xC0) != 0x80;
    const json& top = lp["top_logprobs"][i];
    ASSERT_TRUE(top.is_object());
    EXPECT_EQ(top.size(), 2u);
    EXPECT_FLOAT_EQ(top[TokenPiece(*tokenizer_, 10)].get<float>(), -1.0f);
    EXPECT_FLOAT_EQ(top[TokenPiece(*tokenizer_, 11)].get<float>(), -2.0f);
  }
  EXPECT_EQ(joined, "A café ok");
  EXPECT_EQ(b["choices"][0]["text"], "A café ok!");
  EXPECT_EQ(offset, 9);
}

TEST_F(OpenAiResponseTest, ChatLogprobsShape) {
  auto tokens = TokensOf("Hi there", 3);
  tokens[0].logprob = -std::numeric_limits<float>::infinity();  // JSON has no -inf
  // top_logprobs 1: alternatives beyond what the request asked for are not reported.
  const json b = json::parse(CompletionResponseBody(
      Context(ApiKind::kChatCompletion, true, 1, false), tokens, End(), *tokenizer_));
  const json& lp = b["choices"][0]["logprobs"];
  ASSERT_TRUE(lp.is_object());
  ASSERT_EQ(lp.size(), 1u);
  const json& content = lp["content"];
  ASSERT_EQ(content.size(), tokens.size());
  EXPECT_DOUBLE_EQ(content[0]["logprob"].get<double>(), -9999.0);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const json& e = content[i];
    const std::string piece = TokenPiece(*tokenizer_, tokens[i].id);
    EXPECT_EQ(e["token"], AsJsonText(piece));
    if (i > 0) {
      EXPECT_FLOAT_EQ(e["logprob"].get<float>(), tokens[i].logprob);
    }
    std::vector<int> bytes;
    for (unsigned char ch : piece) bytes.push_back(ch);
    EXPECT_EQ(e["bytes"].get<std::vector<int>>(), bytes);
    ASSERT_EQ(e["top_logprobs"].size(), 1u);
    const json& top = e["top_logprobs"][0];
    EXPECT_EQ(top["token"], AsJsonText(TokenPiece(*tokenizer_, 10)));
    EXPECT_FLOAT_EQ(top["logprob"].get<float>(), -1.0f);
    EXPECT_TRUE(top["bytes"].is_array());
    EXPECT_EQ(top.size(), 3u);
  }
}

TEST_F(OpenAiResponseTest, TokenThatSplitsACharacter) {
  // A byte-level token standing for one byte of a multi-byte character: `token` shows U+FFFD
  // (JSON must be UTF-8), `bytes` the true byte.
  int32_t lone = -1;
  for (int32_t id = 0; id < tokenizer_->vocab_size() && lone < 0; ++id) {
    const std::string p = TokenPiece(*tokenizer_, id);
    if (p.size() == 1 && static_cast<unsigned char>(p[0]) >= 0xC0) lone = id;
  }
  ASSERT_GE(lone, 0);
  GeneratedToken t;
  t.id = lone;
  t.logprob = -3.0f;
  const unsigned char byte = static_cast<unsigned char>(TokenPiece(*tokenizer_, lone)[0]);
  const json chat = json::parse(CompletionResponseBody(
      Context(ApiKind::kChatCompletion, true, 0, false), {&t, 1}, End(), *tokenizer_));
  const json& e = chat["choices"][0]["logprobs"]["content"][0];
  EXPECT_EQ(e["token"], "\xEF\xBF\xBD");
  EXPECT_EQ(e["bytes"], json::array({byte}));
  EXPECT_EQ(e["top_logprobs"], json::array());
  const json cmpl = json::parse(CompletionResponseBody(
      Context(ApiKind::kCompletion, true, 0, false), {&t, 1}, End(), *tokenizer_));
  EXPECT_EQ(cmpl["choices"][0]["logprobs"]["tokens"][0], "\xEF\xBF\xBD");
  EXPECT_EQ(cmpl["choices"][0]["logprobs"]["top_logprobs"][0], json::object());
}

TEST_F(OpenAiResponseTest, ChatStreamWithoutUsage) {
  SseStream s(Context(ApiKind::kChatCompletion, false, 0, false), *tokenizer_);
  std::string sse = s.Start();
  const auto tokens = TokensOf("Hello world", 0);
  sse += s.Tokens({tokens.data(), 1});
  sse += s.Tokens({tokens.data() + 1, tokens.size() - 1});
  GeneratedToken held;  // nothing released: no event
  held.id = 5;
  EXPECT_EQ(s.Tokens({&held, 1}), "");
  CompletionEnd end = End();
  end.finish_reason = "stop";
  const std::string fin = s.Finish(end);
  EXPECT_TRUE(fin.ends_with("\n\ndata: [DONE]\n\n"));
  sse += fin;
  const auto events = Events(sse);
  ASSERT_EQ(events.size(), 5u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json c = json::parse(events[i]);
    EXPECT_EQ(c["id"], "chatcmpl-abc");
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    EXPECT_EQ(c["created"], 1700000000);
    EXPECT_EQ(c["model"], "smol");
    EXPECT_FALSE(c.contains("usage"));  // OpenAI: no usage without include_usage
    ASSERT_EQ(c["choices"].size(), 1u);
    const json& ch = c["choices"][0];
    EXPECT_EQ(ch["index"], 0);
    if (i == 0) {
      EXPECT_EQ(ch["delta"], json({{"role", "assistant"}, {"content", ""}}));
      EXPECT_TRUE(ch["finish_reason"].is_null());
    } else if (i + 2 < events.size()) {
      EXPECT_EQ(ch["delta"].size(), 1u);
      text += ch["delta"]["content"].get<std::string>();
      EXPECT_TRUE(ch["finish_reason"].is_null());
      EXPECT_TRUE(ch["logprobs"].is_null());
      EXPECT_FALSE(c.contains("tripod"));
    } else {
      EXPECT_EQ(ch["delta"], json::object());
      EXPECT_EQ(ch["finish_reason"], "stop");
      ExpectTiming(c["tripod"]);
    }
  }
  EXPECT_EQ(text, "Hello world");
}

TEST_F(OpenAiResponseTest, CompletionStreamWithUsageAndLogprobs) {
  SseStream s(Context(ApiKind::kCompletion, true, 1, true), *tokenizer_);
  EXPECT_EQ(s.Start(), "");  // completions have no role chunk
  const auto tokens = TokensOf("naïve text", 1);
  std::string sse;
  for (const GeneratedToken& t : tokens) sse += s.Tokens({&t, 1});
  GeneratedToken empty;  // a token that released no text still reports its log-probability
  empty.id = 7;
  empty.logprob = -0.25f;
  empty.top = {{7, -0.25f}};
  sse += s.Tokens({&empty, 1});
  sse += s.Finish(End());
  const auto events = Events(sse);
  ASSERT_EQ(events.size(), tokens.size() + 4);  // tokens, empty, finish, usage, [DONE]
  int64_t offset = 0;
  for (size_t i = 0; i < tokens.size() + 1; ++i) {
    const json c = json::parse(events[i]);
    EXPECT_EQ(c["object"], "text_completion");
    EXPECT_TRUE(c.contains("usage"));
    EXPECT_TRUE(c["usage"].is_null());
    const json& ch = c["choices"][0];
    const std::string text = i < tokens.size() ? tokens[i].text : "";
    EXPECT_EQ(ch["text"], text);
    const json& lp = ch["logprobs"];
    ASSERT_EQ(lp["tokens"].size(), 1u);
    EXPECT_EQ(lp["text_offset"][0], offset);  // continues across chunks
    EXPECT_EQ(lp["top_logprobs"][0].size(), 1u);
    for (unsigned char b : text) offset += (b & 0xC0) != 0x80;
  }
  const json fin = json::parse(events[tokens.size() + 1]);
  EXPECT_EQ(fin["choices"][0]["text"], "");
  EXPECT_EQ(fin["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(fin["usage"].is_null());
  ExpectTiming(fin["tripod"]);
  const json usage = json::parse(events[tokens.size() + 2]);
  EXPECT_EQ(usage["choices"], json::array());
  EXPECT_EQ(usage["id"], "cmpl-abc");
  ExpectUsage(usage["usage"]);
  ExpectTiming(usage["tripod"]);
  EXPECT_EQ(events.back(), "[DONE]");
}

TEST_F(OpenAiResponseTest, ChatStreamLogprobsPerChunk) {
  SseStream s(Context(ApiKind::kChatCompletion, true, 0, false), *tokenizer_);
  const auto tokens = TokensOf("ab cd", 0);
  const auto events = Events(s.Tokens(tokens));  // coalesced: one chunk
  ASSERT_EQ(events.size(), 1u);
  const json c = json::parse(events[0]);
  EXPECT_EQ(c["choices"][0]["delta"]["content"], "ab cd");
  EXPECT_EQ(c["choices"][0]["logprobs"]["content"].size(), tokens.size());
}

TEST(OpenAiErrorTest, ErrorBodyAndSseErrorEvent) {
  ApiError e = InvalidRequest("'n' must be 1", "n");
  json b = json::parse(ErrorBody(e));
  EXPECT_EQ(b, json::parse(R"({"error":{"message":"'n' must be 1","type":"invalid_request_error",
                                         "param":"n","code":null}})"));
  ApiError busy;
  busy.http_status = 503;
  busy.type = "server_error";
  busy.message = "no decode worker";
  busy.code = "no_workers";
  const std::string sse = SseErrorEvent(busy);
  ASSERT_THAT(sse, StartsWith("data: "));
  ASSERT_TRUE(sse.ends_with("\n\n"));
  EXPECT_EQ(sse.find('\n'), sse.size() - 2);  // one line: a newline would split the event
  const json ev = json::parse(sse.substr(6));
  EXPECT_EQ(ev["error"]["message"], "no decode worker");
  EXPECT_TRUE(ev["error"]["param"].is_null());
  EXPECT_EQ(ev["error"]["code"], "no_workers");
  EXPECT_EQ(ev["error"]["type"], "server_error");
  EXPECT_EQ(std::string(kSseDone), "data: [DONE]\n\n");
}

TEST(OpenAiErrorTest, ModelsList) {
  const ModelCard cards[] = {{"smol", 1700000000, 8192}};
  const json b = json::parse(ModelsListBody(cards));
  EXPECT_EQ(b["object"], "list");
  ASSERT_EQ(b["data"].size(), 1u);
  const json& m = b["data"][0];
  EXPECT_EQ(m["id"], "smol");
  EXPECT_EQ(m["object"], "model");
  EXPECT_EQ(m["created"], 1700000000);
  EXPECT_EQ(m["owned_by"], "tripod");
  EXPECT_EQ(m["max_model_len"], 8192);
}

TEST(OpenAiErrorTest, IdsAndContext) {
  const std::string a = NewResponseId(ApiKind::kCompletion);
  const std::string b = NewResponseId(ApiKind::kCompletion);
  EXPECT_THAT(a, StartsWith("cmpl-"));
  EXPECT_EQ(a.size(), 5u + 32u);
  EXPECT_NE(a, b);
  EXPECT_THAT(NewResponseId(ApiKind::kChatCompletion), StartsWith("chatcmpl-"));
  auto r = ParseCompletionBody(
      R"({"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":true,
          "top_logprobs":4,"stream":true,"stream_options":{"include_usage":true}})",
      ApiKind::kChatCompletion);
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(r));
  const ResponseContext ctx = MakeResponseContext(std::get<CompletionRequest>(r), "smol", 5);
  EXPECT_EQ(ctx.kind, ApiKind::kChatCompletion);
  EXPECT_THAT(ctx.id, StartsWith("chatcmpl-"));
  EXPECT_EQ(ctx.model, "smol");
  EXPECT_EQ(ctx.created, 5);
  EXPECT_TRUE(ctx.logprobs);
  EXPECT_EQ(ctx.top_logprobs, 4);
  EXPECT_TRUE(ctx.include_usage);
}

TEST(OpenAiErrorTest, GrpcStatusMapping) {
  const std::vector<std::pair<int, grpc::StatusCode>> table = {
      {400, grpc::StatusCode::INVALID_ARGUMENT},
      {401, grpc::StatusCode::UNAUTHENTICATED},
      {404, grpc::StatusCode::NOT_FOUND},
      {413, grpc::StatusCode::OUT_OF_RANGE},
      {429, grpc::StatusCode::RESOURCE_EXHAUSTED},
      {503, grpc::StatusCode::UNAVAILABLE},
      {500, grpc::StatusCode::INTERNAL}};
  for (const auto& [http, code] : table) {
    EXPECT_EQ(GrpcCodeForHttpStatus(http), code) << http;
    EXPECT_EQ(HttpStatusForGrpcCode(code), http) << http;
  }
  EXPECT_EQ(GrpcCodeForHttpStatus(422), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(GrpcCodeForHttpStatus(502), grpc::StatusCode::INTERNAL);
  EXPECT_EQ(HttpStatusForGrpcCode(grpc::StatusCode::DATA_LOSS), 500);

  ApiError e;
  e.http_status = 429;
  e.type = "rate_limit_error";
  e.message = "queue full";
  e.code = "queue_full";
  const grpc::Status st = ToGrpcStatus(e);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(json::parse(st.error_message())["error"]["message"], "queue full");
  const ApiError back = FromGrpcStatus(st);
  EXPECT_EQ(back.http_status, 429);
  EXPECT_EQ(back.type, "rate_limit_error");
  EXPECT_EQ(back.message, "queue full");
  EXPECT_EQ(back.param, "");
  EXPECT_EQ(back.code, "queue_full");
  // A plain message (not our JSON) is kept as is, typed by its code.
  const ApiError plain = FromGrpcStatus(grpc::Status(grpc::StatusCode::UNAVAILABLE, "down"));
  EXPECT_EQ(plain.http_status, 503);
  EXPECT_EQ(plain.type, "server_error");
  EXPECT_EQ(plain.message, "down");
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "x")).type,
            "authentication_error");
}

TEST_F(OpenAiResponseTest, GrpcMessages) {
  const ResponseContext ctx = Context(ApiKind::kCompletion, true, 2, false);
  auto tokens = TokensOf("Yes sir", 2);
  GeneratedToken tail;
  tail.text = ".";
  tokens.push_back(tail);
  tripod::v1::CompletionChunk chunk;
  FillCompletionChunk(ctx, tokens, *tokenizer_, &chunk);
  EXPECT_EQ(chunk.id(), "cmpl-abc");
  EXPECT_EQ(chunk.text(), "Yes sir.");
  ASSERT_EQ(chunk.logprobs_size(), static_cast<int>(tokens.size() - 1));
  EXPECT_EQ(chunk.logprobs(0).id(), tokens[0].id);
  EXPECT_EQ(chunk.logprobs(0).token(), TokenPiece(*tokenizer_, tokens[0].id));
  EXPECT_FLOAT_EQ(chunk.logprobs(0).logprob(), tokens[0].logprob);
  ASSERT_EQ(chunk.logprobs(0).top_size(), 2);
  EXPECT_EQ(chunk.logprobs(0).top(1).id(), 11);
  EXPECT_FALSE(chunk.has_usage());
  EXPECT_EQ(chunk.finish_reason(), "");

  tripod::v1::CompletionChunk last;
  FillFinalChunk(ctx, End(), &last);
  EXPECT_EQ(last.finish_reason(), "length");
  EXPECT_EQ(last.usage().total_tokens(), 15);
  EXPECT_EQ(last.usage().cached_tokens(), 8);
  EXPECT_DOUBLE_EQ(last.timing().prefill_s(), 0.25);
  EXPECT_DOUBLE_EQ(last.timing().draft_s(), 0.0);  // did not run
  EXPECT_EQ(last.timing().route(), "disaggregated");
  EXPECT_FALSE(last.timing().has_method());  // none asked

  tripod::v1::CompletionResponse resp;
  FillCompletionResponse(ctx, tokens, End(), *tokenizer_, &resp);
  EXPECT_EQ(resp.id(), "cmpl-abc");
  EXPECT_EQ(resp.model(), "smol");
  EXPECT_EQ(resp.created(), 1700000000);
  EXPECT_EQ(resp.text(), "Yes sir.");
  ASSERT_EQ(resp.token_ids_size(), static_cast<int>(tokens.size() - 1));
  EXPECT_EQ(resp.token_ids(0), tokens[0].id);
  EXPECT_EQ(resp.logprobs_size(), resp.token_ids_size());
  EXPECT_EQ(resp.usage().prompt_tokens(), 12);
  EXPECT_DOUBLE_EQ(resp.timing().total_s(), 1.0);

  tripod::v1::CompletionChunk quiet;  // no logprobs asked: none sent
  FillCompletionChunk(Context(ApiKind::kCompletion, false, 0, false), tokens, *tokenizer_, &quiet);
  EXPECT_EQ(quiet.logprobs_size(), 0);
}

GeneratedToken TextOnly(const std::string& text, int choice = 0) {
  GeneratedToken t;
  t.text = text;
  t.choice = choice;
  return t;
}

// gRPC's stream with tools: each call whole once its block closes, numbered within its choice,
// the content before it as text, the rest at the end with finish_reason "tool_calls"; the whole
// answer reads the same text alike.
TEST_F(OpenAiResponseTest, GrpcStreamSendsToolCallsWholeWithTheirIndex) {
  ResponseContext ctx = Context(ApiKind::kChatCompletion, false, 0, false);
  ctx.parse_tool_calls = true;
  ctx.max_tool_calls = 8;
  const std::vector<std::string> pieces = {
      "Sure.", "<tool_", "call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>",
      "\n<tool_call>\n{\"name\": \"g\", \"arguments\": {}}"};
  GrpcChunkStream stream(ctx, *tokenizer_);
  std::vector<v1::CompletionChunk> sent;
  for (const std::string& piece : pieces) {
    const GeneratedToken t[] = {TextOnly(piece, 1)};
    v1::CompletionChunk c;
    if (stream.Tokens(t, 1, &c)) sent.push_back(c);
  }
  CompletionEnd end = End();
  end.finish_reason = "stop";
  const v1::CompletionChunk last = stream.Finish(end, 1);
  ASSERT_EQ(sent.size(), 2u);  // "Sure.", then the first call; the rest was held
  EXPECT_EQ(sent[0].text(), "Sure.");
  EXPECT_EQ(sent[0].index(), 1);
  EXPECT_EQ(sent[0].tool_calls_size(), 0);
  ASSERT_EQ(sent[1].tool_calls_size(), 1);
  EXPECT_EQ(sent[1].text(), "");
  EXPECT_EQ(sent[1].tool_calls(0).name(), "f");
  EXPECT_EQ(sent[1].tool_calls(0).arguments(), "{\"a\": 1}");
  EXPECT_EQ(sent[1].tool_calls(0).index(), 0);
  EXPECT_EQ(sent[1].tool_calls(0).id().rfind("call_", 0), 0u);
  ASSERT_EQ(last.tool_calls_size(), 1);  // the unterminated block, parsed at the end
  EXPECT_EQ(last.tool_calls(0).name(), "g");
  EXPECT_EQ(last.tool_calls(0).index(), 1);
  EXPECT_EQ(last.index(), 1);
  EXPECT_EQ(last.finish_reason(), "tool_calls");
  EXPECT_EQ(last.usage().prompt_tokens(), 12);

  ChoiceOutput whole;
  for (const std::string& piece : pieces) whole.tokens.push_back(TextOnly(piece));
  whole.finish_reason = "stop";
  v1::CompletionResponse resp;
  FillCompletionResponse(ctx, std::span<const ChoiceOutput>(&whole, 1), end, *tokenizer_, nullptr,
                         &resp);
  ASSERT_EQ(resp.choices_size(), 1);
  const v1::Choice& c = resp.choices(0);
  EXPECT_EQ(c.text(), "Sure.");
  ASSERT_EQ(c.tool_calls_size(), 2);
  EXPECT_EQ(c.tool_calls(0).name(), "f");
  EXPECT_EQ(c.tool_calls(1).name(), "g");
  EXPECT_EQ(c.tool_calls(1).index(), 1);
  EXPECT_EQ(c.finish_reason(), "tool_calls");
  EXPECT_EQ(resp.text(), "Sure.");  // choice 0's in the single-choice fields
  EXPECT_EQ(resp.finish_reason(), "tool_calls");

  // "length" stays "length", calls or not (the output was cut).
  GrpcChunkStream cut(ctx, *tokenizer_);
  const GeneratedToken call[] = {TextOnly(pieces[2])};
  v1::CompletionChunk ignored;
  cut.Tokens(call, 0, &ignored);
  EXPECT_EQ(cut.FinishChoice(0, "length").finish_reason(), "length");
}

// Echo over gRPC: every choice's text begins with the prompt's (its first chunk in a stream),
// and the prompt's log-probabilities come once, the first token's unset.
TEST_F(OpenAiResponseTest, GrpcEchoAndPromptLogprobs) {
  const ResponseContext ctx = Context(ApiKind::kCompletion, true, 1, false);
  PromptEcho echo;
  echo.echo = true;
  echo.echo_logprobs = true;
  echo.text = "Yes sir";
  echo.ids = tokenizer_->Encode("Yes sir", false);
  ASSERT_GE(echo.ids.size(), 2u);
  for (size_t i = 1; i < echo.ids.size(); ++i) {
    PromptLogprob lp;
    lp.position = static_cast<int>(i);
    lp.id = echo.ids[i];
    lp.logprob = -0.25f * static_cast<float>(i);
    lp.rank = 2;
    lp.top = {{10, -0.1f}, {11, -0.2f}};
    echo.logprobs.push_back(lp);
  }
  GrpcChunkStream stream(ctx, *tokenizer_);
  const std::vector<v1::CompletionChunk> first = stream.Prompt(echo, 2);
  ASSERT_EQ(first.size(), 2u);
  EXPECT_EQ(first[0].index(), 0);
  EXPECT_EQ(first[1].index(), 1);
  EXPECT_EQ(first[0].text(), "Yes sir");
  EXPECT_EQ(first[1].text(), "Yes sir");
  EXPECT_EQ(first[1].prompt_logprobs_size(), 0);  // once, on choice 0's
  ASSERT_EQ(first[0].prompt_logprobs_size(), static_cast<int>(echo.ids.size()));
  EXPECT_FALSE(first[0].prompt_logprobs(0).has_logprob());
  EXPECT_EQ(first[0].prompt_logprobs(0).id(), echo.ids[0]);
  EXPECT_TRUE(first[0].prompt_logprobs(1).has_logprob());
  EXPECT_FLOAT_EQ(first[0].prompt_logprobs(1).logprob(), -0.25f);
  EXPECT_EQ(first[0].prompt_logprobs(1).rank(), 2);
  ASSERT_EQ(first[0].prompt_logprobs(1).top_size(), 1);  // logprobs 1: one alternative
  EXPECT_EQ(first[0].prompt_logprobs(1).top(0).id(), 10);

  std::vector<ChoiceOutput> choices(2);
  choices[0].tokens = TokensOf(" ok", 0);
  choices[1].index = 1;
  choices[1].tokens = TokensOf(" no", 0);
  v1::CompletionResponse resp;
  FillCompletionResponse(ctx, choices, End(), *tokenizer_, &echo, &resp);
  ASSERT_EQ(resp.choices_size(), 2);
  EXPECT_EQ(resp.choices(0).text(), "Yes sir ok");
  EXPECT_EQ(resp.choices(1).text(), "Yes sir no");
  EXPECT_EQ(resp.choices(1).index(), 1);
  EXPECT_EQ(resp.text(), "Yes sir ok");
  EXPECT_EQ(resp.choices(0).logprobs_size(), resp.choices(0).token_ids_size());
  EXPECT_EQ(resp.prompt_logprobs_size(), static_cast<int>(echo.ids.size()));
  EXPECT_EQ(resp.usage().prompt_tokens(), 12);  // the prompt once

  PromptEcho none;  // nothing asked: no prompt chunk
  EXPECT_TRUE(stream.Prompt(none, 2).empty());
}

// A SentencePiece word piece keeps its leading space in logprobs, though Decode of the piece
// alone drops it (it would be the start of the text).
TEST(OpenAiTokenPieceTest, SentencePieceKeepsLeadingSpace) {
  TokenizerVocab v;
  v.model = "llama";
  v.tokens = {"<unk>", "<s>", "</s>"};
  v.token_types = {2, 3, 3};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    v.tokens.push_back(name);
    v.token_types.push_back(6);
  }
  for (const char* p : {"\xE2\x96\x81", "t", "h", "e", "\xE2\x96\x81the"}) {
    v.tokens.push_back(p);
    v.token_types.push_back(1);
  }
  v.scores.assign(v.tokens.size(), 0.0f);
  v.bos_id = 1;
  v.eos_id = 2;
  v.unk_id = 0;
  auto tok = Tokenizer::FromVocab(v);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const int32_t the = static_cast<int32_t>(v.tokens.size()) - 1;
  const int32_t ids[1] = {the};
  EXPECT_EQ((*tok)->Decode(ids), "the");
  EXPECT_EQ(TokenPiece(**tok, the), " the");
  EXPECT_EQ(TokenPiece(**tok, the - 1), "e");
}

}  // namespace
}  // namespace tripod::scheduler
