// n and best_of: the counts accepted and refused (each refusal naming its param), the server's
// limit, the pick of the best candidates, and the answers' shapes with several choices (whole
// and streamed: each choice's index, its own finish_reason, usage once).
#include "scheduler/choices.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "nlohmann/json.hpp"
#include "scheduler/openai_request.h"
#include "scheduler/openai_response.h"
#include "tests/unit/test_tokenizer.h"

namespace tripod::scheduler {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

CompletionRequest Parse(const json& extra, ApiKind kind = ApiKind::kCompletion) {
  json body = {{"model", "m"}};
  if (kind == ApiKind::kCompletion) {
    body["prompt"] = "hi";
  } else {
    body["messages"] = {{{"role", "user"}, {"content", "hi"}}};
  }
  body.update(extra);
  auto r = ParseCompletionBody(body.dump(), kind);
  EXPECT_TRUE(std::holds_alternative<CompletionRequest>(r)) << body.dump();
  return std::holds_alternative<CompletionRequest>(r) ? std::get<CompletionRequest>(r)
                                                      : CompletionRequest{};
}

TEST(ChoicesTest, CountsAccepted) {
  CompletionRequest r = Parse(json::object());
  EXPECT_EQ(r.n, 1);
  EXPECT_EQ(r.best_of, 1);
  r = Parse({{"n", 3}});
  EXPECT_EQ(r.n, 3);
  EXPECT_EQ(r.best_of, 3);  // best_of defaults to n
  r = Parse({{"n", 2}, {"best_of", 5}});
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(r.best_of, 5);
  r = Parse({{"n", 4}, {"stream", true}}, ApiKind::kChatCompletion);
  EXPECT_EQ(r.n, 4);
  r = Parse({{"n", 2.0}, {"best_of", nullptr}});  // an integral float; null: absent
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(r.best_of, 2);
}

TEST(ChoicesTest, LimitAndGrpc) {
  CompletionRequest r = Parse({{"n", 16}});
  EXPECT_FALSE(CheckChoiceLimit(r, 16).has_value());
  std::optional<ApiError> e = CheckChoiceLimit(r, 8);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->param, "n");
  EXPECT_EQ(e->http_status, 400);
  EXPECT_THAT(e->message, HasSubstr("at most 8"));
  r = Parse({{"n", 2}, {"best_of", 9}});
  e = CheckChoiceLimit(r, 8);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->param, "best_of");

  // gRPC takes the same counts, and the same limit applies.
  tripod::v1::CompletionRequest p;
  p.set_prompt("hi");
  p.set_n(2);
  p.set_best_of(9);
  auto g = CompletionRequestFromProto(p);
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(g));
  EXPECT_EQ(std::get<CompletionRequest>(g).n, 2);
  EXPECT_EQ(std::get<CompletionRequest>(g).best_of, 9);
  e = CheckChoiceLimit(std::get<CompletionRequest>(g), 8);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->param, "best_of");
}

ChoiceOutput Candidate(int index, std::vector<float> logprobs, std::string finish = "length") {
  ChoiceOutput c;
  c.index = index;
  for (float lp : logprobs) {
    GeneratedToken t;
    t.id = 100 + index;
    t.text = "x";
    t.logprob = lp;
    t.choice = index;
    c.tokens.push_back(t);
  }
  GeneratedToken text_only;  // carries no token: not counted
  text_only.text = "!";
  text_only.logprob = -100;
  c.tokens.push_back(text_only);
  c.finish_reason = std::move(finish);
  return c;
}

TEST(ChoicesTest, BestChoicesByCumulativeLogprob) {
  EXPECT_DOUBLE_EQ(CumulativeLogprob(Candidate(0, {-1, -0.5})), -1.5);
  std::vector<ChoiceOutput> c = {Candidate(0, {-1, -1}), Candidate(1, {-0.5, -0.25}, "stop"),
                                 Candidate(2, {-3}), Candidate(3, {-0.75})};
  std::vector<ChoiceOutput> best = BestChoices(c, 1);
  ASSERT_EQ(best.size(), 1u);
  EXPECT_EQ(best[0].index, 0);  // re-indexed
  EXPECT_EQ(best[0].tokens[0].id, 101);
  EXPECT_EQ(best[0].finish_reason, "stop");
  best = BestChoices(c, 3);
  ASSERT_EQ(best.size(), 3u);
  EXPECT_EQ(best[0].tokens[0].id, 101);  // -0.75 (tie with 3: the lower index first)
  EXPECT_EQ(best[1].tokens[0].id, 103);  // -0.75
  EXPECT_EQ(best[2].tokens[0].id, 100);  // -2
  for (int i = 0; i < 3; ++i) EXPECT_EQ(best[i].index, i);
  best = BestChoices(c, 4);  // n == best_of: as generated
  for (int i = 0; i < 4; ++i) EXPECT_EQ(best[i].tokens[0].id, 100 + i);
}

class ChoicesResponseTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tokenizer_ = LoadTestTokenizer().release();
    ASSERT_NE(tokenizer_, nullptr);
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    tokenizer_ = nullptr;
  }
  static ResponseContext Context(ApiKind kind, bool logprobs) {
    ResponseContext ctx;
    ctx.kind = kind;
    ctx.id = "cmpl-1";
    ctx.model = "m";
    ctx.logprobs = logprobs;
    ctx.include_usage = true;
    return ctx;
  }
  static GeneratedToken Token(const std::string& text, int choice) {
    GeneratedToken t;
    const std::vector<int32_t> ids = tokenizer_->Encode(text, false);
    t.id = ids.at(0);
    t.text = text;
    t.logprob = -0.5f;
    t.choice = choice;
    return t;
  }
  static Tokenizer* tokenizer_;
};
Tokenizer* ChoicesResponseTest::tokenizer_ = nullptr;

TEST_F(ChoicesResponseTest, WholeAnswerListsEveryChoice) {
  std::vector<ChoiceOutput> choices(2);
  choices[0] = {0, {Token("Hello", 0)}, "length"};
  choices[1] = {1, {Token("Bye", 1)}, "stop"};
  CompletionEnd end;
  end.finish_reason = "stop";
  end.usage = {5, 2, 0};
  for (ApiKind kind : {ApiKind::kCompletion, ApiKind::kChatCompletion}) {
    const json body =
        json::parse(CompletionResponseBody(Context(kind, true), choices, end, *tokenizer_));
    ASSERT_EQ(body["choices"].size(), 2u);
    for (int i = 0; i < 2; ++i) {
      const json& c = body["choices"][i];
      EXPECT_EQ(c["index"], i);
      EXPECT_EQ(c["finish_reason"], i == 0 ? "length" : "stop");
      const std::string text =
          kind == ApiKind::kChatCompletion ? c["message"]["content"] : c["text"];
      EXPECT_EQ(text, i == 0 ? "Hello" : "Bye");
      EXPECT_FALSE(c["logprobs"].is_null());
    }
    EXPECT_EQ(body["usage"]["prompt_tokens"], 5);
    EXPECT_EQ(body["usage"]["completion_tokens"], 2);
  }
}

// The events of an SSE text as JSON ("[DONE]" left out).
std::vector<json> Events(const std::string& sse) {
  std::vector<json> out;
  size_t at = 0;
  while ((at = sse.find("data: ", at)) != std::string::npos) {
    const size_t end = sse.find("\n\n", at);
    const std::string payload = sse.substr(at + 6, end - at - 6);
    if (payload != "[DONE]") out.push_back(json::parse(payload));
    at = end;
  }
  return out;
}

TEST_F(ChoicesResponseTest, StreamTagsEachChoice) {
  SseStream sse(Context(ApiKind::kChatCompletion, false), *tokenizer_);
  std::string all = sse.Start(2);
  const GeneratedToken a[] = {Token("Hi", 0)}, b[] = {Token("Yo", 1)};
  all += sse.Tokens(b, 1);
  all += sse.Tokens(a, 0);
  all += sse.FinishChoice(1, "stop");
  CompletionEnd end;
  end.finish_reason = "length";
  end.usage = {3, 2, 0};
  all += sse.Finish(end, 0);
  const std::vector<json> ev = Events(all);
  ASSERT_EQ(ev.size(), 7u);  // 2 role chunks, 2 deltas, 2 finishes, usage
  EXPECT_EQ(ev[0]["choices"][0]["index"], 0);
  EXPECT_EQ(ev[1]["choices"][0]["index"], 1);
  EXPECT_EQ(ev[2]["choices"][0]["index"], 1);
  EXPECT_EQ(ev[2]["choices"][0]["delta"]["content"], "Yo");
  EXPECT_EQ(ev[3]["choices"][0]["index"], 0);
  EXPECT_EQ(ev[4]["choices"][0]["index"], 1);
  EXPECT_EQ(ev[4]["choices"][0]["finish_reason"], "stop");
  EXPECT_FALSE(ev[4].contains("tripod"));
  EXPECT_EQ(ev[5]["choices"][0]["index"], 0);
  EXPECT_EQ(ev[5]["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(ev[5].contains("tripod"));
  EXPECT_TRUE(ev[6]["choices"].empty());
  EXPECT_EQ(ev[6]["usage"]["completion_tokens"], 2);
  EXPECT_NE(all.find("data: [DONE]"), std::string::npos);

  // Completions: each choice's text_offset counts its own text.
  ResponseContext ctx = Context(ApiKind::kCompletion, true);
  SseStream text(ctx, *tokenizer_);
  const json first = Events(text.Tokens(a, 0))[0];
  const json other = Events(text.Tokens(b, 1))[0];
  const json second = Events(text.Tokens(a, 0))[0];
  EXPECT_EQ(first["choices"][0]["logprobs"]["text_offset"][0], 0);
  EXPECT_EQ(other["choices"][0]["logprobs"]["text_offset"][0], 0);
  EXPECT_EQ(second["choices"][0]["logprobs"]["text_offset"][0], 2);
}

}  // namespace
}  // namespace tripod::scheduler
