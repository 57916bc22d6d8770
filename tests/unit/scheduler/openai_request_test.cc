// OpenAI-compatible request parsing: every field's accepted and refused forms, the param named
// in each error, defaults, and the gRPC path sharing the same checks.
#include "scheduler/openai_request.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <variant>
#include <vector>

#include "nlohmann/json.hpp"

namespace tripod::scheduler {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

// A minimal valid body of each kind with `extra` merged in (null values in extra delete keys).
std::string Body(ApiKind kind, const json& extra) {
  json b = kind == ApiKind::kChatCompletion
               ? json{{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}}
               : json{{"model", "m"}, {"prompt", "hello"}};
  for (auto it = extra.begin(); it != extra.end(); ++it) {
    if (it.value().is_null()) {
      b.erase(it.key());
    } else {
      b[it.key()] = it.value();
    }
  }
  return b.dump();
}

CompletionRequest ParseOk(ApiKind kind, const json& extra) {
  auto r = ParseCompletionBody(Body(kind, extra), kind);
  if (auto* e = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << "refused " << extra.dump() << ": " << e->message << " (" << e->param << ")";
    return {};
  }
  return std::get<CompletionRequest>(r);
}

ApiError ParseErr(ApiKind kind, const std::string& body) {
  auto r = ParseCompletionBody(body, kind);
  if (auto* e = std::get_if<ApiError>(&r)) return *e;
  ADD_FAILURE() << "accepted " << body;
  return {};
}

constexpr ApiKind kCmpl = ApiKind::kCompletion;
constexpr ApiKind kChat = ApiKind::kChatCompletion;

TEST(OpenAiRequestTest, MinimalCompletionDefaults) {
  CompletionRequest r = ParseOk(kCmpl, json::object());
  EXPECT_EQ(r.kind, kCmpl);
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.prompt_text, "hello");
  EXPECT_FALSE(r.prompt_is_ids);
  EXPECT_EQ(r.max_tokens, -1);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 1.0f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 1.0f);
  EXPECT_EQ(r.sampling.top_k, 0);
  EXPECT_FALSE(r.has_seed);
  EXPECT_FALSE(r.logprobs);
  EXPECT_EQ(r.sampling.top_logprobs, 0);
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.include_usage);
  EXPECT_TRUE(r.stop.empty());
  EXPECT_EQ(r.pop.kind, PopChoice::Kind::kDefault);
  EXPECT_EQ(r.method.method, DraftMethod::kNone);
  EXPECT_EQ(r.method.budget_tokens, 0);
  EXPECT_EQ(r.method.budget_fraction, 0);
}

TEST(OpenAiRequestTest, EveryFieldSet) {
  CompletionRequest r =
      ParseOk(kCmpl, {{"max_tokens", 7},
                      {"temperature", 0.5},
                      {"top_p", 0.9},
                      {"top_k", 40},
                      {"min_p", 0.05},
                      {"repetition_penalty", 1.1},
                      {"presence_penalty", -1.5},
                      {"frequency_penalty", 2},
                      {"stop", {"\n", "END"}},
                      {"seed", 42},
                      {"n", 1},
                      {"best_of", 1},
                      {"logprobs", 3},
                      {"echo", false},
                      {"user", "u-1"},
                      {"stream", true},
                      {"stream_options", {{"include_usage", true}}},
                      {"ignore_eos", true},
                      {"tripod", {{"pop", "1/3"}, {"method", "speckv"}, {"budget", 64}}}});
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.9f);
  EXPECT_EQ(r.sampling.top_k, 40);
  EXPECT_FLOAT_EQ(r.sampling.min_p, 0.05f);
  EXPECT_FLOAT_EQ(r.sampling.repetition_penalty, 1.1f);
  EXPECT_FLOAT_EQ(r.sampling.presence_penalty, -1.5f);
  EXPECT_FLOAT_EQ(r.sampling.frequency_penalty, 2.0f);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"\n", "END"}));
  EXPECT_TRUE(r.has_seed);
  EXPECT_EQ(r.sampling.seed, 42u);
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.sampling.top_logprobs, 3);
  EXPECT_EQ(r.user, "u-1");
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.ignore_eos);
  EXPECT_EQ(r.pop.kind, PopChoice::Kind::kRatio);
  EXPECT_EQ(r.pop.ratio, "1/3");
  EXPECT_EQ(r.method.method, DraftMethod::kSpecKv);
  EXPECT_EQ(r.method.budget_tokens, 64);
}

TEST(OpenAiRequestTest, LogitBiasIsSortedByTokenId) {
  auto r = ParseCompletionBody(
      Body(kChat, {{"logit_bias", {{"50256", -100}, {"7", 2.5}, {"300", 100}}}}), kChat);
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(r)) << std::get<ApiError>(r).message;
  EXPECT_EQ(std::get<CompletionRequest>(r).sampling.logit_bias,
            (std::vector<TokenBias>{{7, 2.5f}, {300, 100.0f}, {50256, -100.0f}}));
  json many = json::object();
  for (int i = 0; i <= 1024; ++i) many[std::to_string(i)] = 1;
  auto too_many = ParseCompletionBody(Body(kCmpl, {{"logit_bias", many}}), kCmpl);
  ASSERT_TRUE(std::holds_alternative<ApiError>(too_many));
  EXPECT_EQ(std::get<ApiError>(too_many).param, "logit_bias");
  // The gRPC door: the same checks.
  tripod::v1::CompletionRequest p;
  p.set_prompt("x");
  (*p.mutable_logit_bias())[9] = -5;
  (*p.mutable_logit_bias())[3] = 1;
  auto g = CompletionRequestFromProto(p);
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(g)) << std::get<ApiError>(g).message;
  EXPECT_EQ(std::get<CompletionRequest>(g).sampling.logit_bias,
            (std::vector<TokenBias>{{3, 1.0f}, {9, -5.0f}}));
  (*p.mutable_logit_bias())[-1] = 1;
  auto bad = CompletionRequestFromProto(p);
  ASSERT_TRUE(std::holds_alternative<ApiError>(bad));
  EXPECT_EQ(std::get<ApiError>(bad).param, "logit_bias");
}

TEST(OpenAiRequestTest, StopTokenIdsAndMinTokens) {
  auto r = ParseCompletionBody(
      Body(kCmpl, {{"stop_token_ids", {50, 7, 50, 2.0}}, {"min_tokens", 3}}), kCmpl);
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(r)) << std::get<ApiError>(r).message;
  EXPECT_EQ(std::get<CompletionRequest>(r).stop_token_ids, (std::vector<int32_t>{2, 7, 50}));
  EXPECT_EQ(std::get<CompletionRequest>(r).min_tokens, 3);
  tripod::v1::CompletionRequest p;
  p.set_prompt("x");
  p.add_stop_token_ids(9);
  p.set_min_tokens(2);
  auto g = CompletionRequestFromProto(p);
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(g)) << std::get<ApiError>(g).message;
  EXPECT_EQ(std::get<CompletionRequest>(g).stop_token_ids, (std::vector<int32_t>{9}));
  EXPECT_EQ(std::get<CompletionRequest>(g).min_tokens, 2);
}

TEST(OpenAiRequestTest, NullMeansAbsent) {
  json nulls = json::object();
  for (const char* k : {"max_tokens", "temperature", "top_p", "top_k", "stop", "seed", "n",
                        "logprobs", "echo", "user", "stream", "stream_options", "tripod", "suffix",
                        "logit_bias", "tools", "response_format", "stop_token_ids", "min_tokens"}) {
    nulls[k] = nullptr;
  }
  json b = json::parse(Body(kCmpl, json::object()));
  b.update(nulls);
  auto r = ParseCompletionBody(b.dump(), kCmpl);
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(r)) << std::get<ApiError>(r).message;
  EXPECT_EQ(std::get<CompletionRequest>(r).max_tokens, -1);
  EXPECT_FALSE(std::get<CompletionRequest>(r).logprobs);
}

TEST(OpenAiRequestTest, PromptShapes) {
  EXPECT_EQ(ParseOk(kCmpl, {{"prompt", {"one"}}}).prompt_text, "one");
  CompletionRequest ids = ParseOk(kCmpl, {{"prompt", {1, 2, 3}}});
  EXPECT_TRUE(ids.prompt_is_ids);
  EXPECT_EQ(ids.prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_TRUE(ids.prompt_text.empty());
  CompletionRequest nested = ParseOk(kCmpl, {{"prompt", {{4, 5}}}});
  EXPECT_EQ(nested.prompt_ids, (std::vector<int32_t>{4, 5}));
  // Integral floats count as integers (pydantic's lax mode).
  EXPECT_EQ(ParseOk(kCmpl, {{"prompt", {7.0}}}).prompt_ids, (std::vector<int32_t>{7}));
}

TEST(OpenAiRequestTest, ChatMessages) {
  CompletionRequest r = ParseOk(
      kChat, {{"messages",
               {{{"role", "developer"}, {"content", "Be brief."}},
                {{"role", "user"},
                 {"content",
                  {{{"type", "text"}, {"text", "Hello, "}}, {{"type", "text"}, {"text", "you"}}}}},
                {{"role", "assistant"}, {"content", nullptr}},
                {{"role", "user"}, {"content", "again"}, {"name", "bob"}}}}});
  EXPECT_EQ(r.kind, kChat);
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0].role, "system");  // developer -> system
  EXPECT_EQ(r.messages[0].content, "Be brief.");
  EXPECT_EQ(r.messages[1].content, "Hello, you");
  EXPECT_EQ(r.messages[2].role, "assistant");
  EXPECT_EQ(r.messages[2].content, "");
  EXPECT_EQ(r.messages[3].content, "again");
}

TEST(OpenAiRequestTest, ChatLogprobsAndMaxCompletionTokens) {
  CompletionRequest r = ParseOk(kChat, {{"logprobs", true}, {"top_logprobs", 5}});
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.sampling.top_logprobs, 5);
  r = ParseOk(kChat, {{"logprobs", true}});
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.sampling.top_logprobs, 0);
  r = ParseOk(kChat, {{"logprobs", false}, {"top_logprobs", 0}});
  EXPECT_FALSE(r.logprobs);
  // Completions' logprobs 0: the sampled token's log-probability, no alternatives.
  r = ParseOk(kCmpl, {{"logprobs", 0}});
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.sampling.top_logprobs, 0);
  // Both given: max_completion_tokens wins, also when max_tokens alone would be refused.
  r = ParseOk(kChat, {{"max_tokens", 0}, {"max_completion_tokens", 9}});
  EXPECT_EQ(r.max_tokens, 9);
  EXPECT_EQ(ParseOk(kChat, {{"max_tokens", 5}}).max_tokens, 5);
  EXPECT_EQ(ParseOk(kCmpl, {{"max_tokens", 2147483647}}).max_tokens, 2147483647);
}

TEST(OpenAiRequestTest, SeedsTopKAndPop) {
  EXPECT_EQ(ParseOk(kCmpl, {{"seed", -1}}).sampling.seed, UINT64_MAX);
  EXPECT_EQ(ParseOk(kCmpl, {{"seed", UINT64_MAX}}).sampling.seed, UINT64_MAX);
  EXPECT_EQ(ParseOk(kCmpl, {{"seed", 0}}).sampling.seed, 0u);
  EXPECT_TRUE(ParseOk(kCmpl, {{"seed", 0}}).has_seed);
  // A positive top_p too small for a float keeps its meaning (the likeliest token only).
  EXPECT_GT(ParseOk(kCmpl, {{"top_p", 1e-300}}).sampling.top_p, 0.0f);
  EXPECT_FLOAT_EQ(ParseOk(kCmpl, {{"repetition_penalty", 0.01}}).sampling.repetition_penalty,
                  0.01f);
  EXPECT_FLOAT_EQ(ParseOk(kCmpl, {{"repetition_penalty", 100}}).sampling.repetition_penalty,
                  100.0f);
  EXPECT_EQ(ParseOk(kCmpl, {{"top_k", -1}}).sampling.top_k, 0);
  EXPECT_EQ(ParseOk(kCmpl, {{"top_k", 0}}).sampling.top_k, 0);
  EXPECT_EQ(ParseOk(kCmpl, {{"stop", "x"}}).stop, std::vector<std::string>{"x"});

  auto pop = [](const json& v) { return ParseOk(kCmpl, {{"tripod", {{"pop", v}}}}).pop; };
  EXPECT_EQ(pop("off").kind, PopChoice::Kind::kOff);
  EXPECT_EQ(pop("on").kind, PopChoice::Kind::kOn);
  EXPECT_EQ(pop("").kind, PopChoice::Kind::kDefault);
  EXPECT_EQ(pop("0.25").ratio, "0.25");
  EXPECT_EQ(pop(" 1/3 ").ratio, "1/3");
  EXPECT_EQ(pop(0.25).kind, PopChoice::Kind::kRatio);
  EXPECT_EQ(pop(0.25).ratio, "0.25");
  EXPECT_EQ(pop(0).ratio, "0");
  EXPECT_EQ(pop(0.999).ratio, "0.999");
  EXPECT_EQ(ParseOk(kCmpl, {{"tripod", {{"method", ""}}}}).method.method, DraftMethod::kNone);
}

TEST(OpenAiRequestTest, PopVariants) {
  auto pop = [](const json& t) { return ParseOk(kCmpl, {{"tripod", t}}).pop; };
  EXPECT_EQ(pop({{"pop", "1/3"}}).variant, PopVariant::kPop);  // absent: POP itself
  EXPECT_FALSE(pop({{"pop", "1/3"}, {"pop_variant", nullptr}}).control());
  EXPECT_FALSE(pop({{"pop", "1/3"}, {"pop_variant", ""}}).control());
  EXPECT_FALSE(pop({{"pop_variant", "pop"}}).control());  // POP needs no ratio
  for (const auto& [name, v] :
       std::vector<std::pair<const char*, PopVariant>>{{"noboundary", PopVariant::kNoBoundary},
                                                       {"nokv", PopVariant::kNoKv},
                                                       {" shortgpt ", PopVariant::kShortGpt}}) {
    const PopChoice p = pop({{"pop", "1/3"}, {"pop_variant", name}});
    EXPECT_EQ(p.variant, v) << name;
    EXPECT_TRUE(p.control());
    EXPECT_EQ(p.ratio, "1/3");
  }
  // The gRPC door: the same field.
  tripod::v1::CompletionRequest p;
  p.set_prompt("x");
  p.mutable_tripod()->set_pop("0.25");
  p.mutable_tripod()->set_pop_variant("nokv");
  auto g = CompletionRequestFromProto(p);
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(g)) << std::get<ApiError>(g).message;
  EXPECT_EQ(std::get<CompletionRequest>(g).pop.variant, PopVariant::kNoKv);
  p.mutable_tripod()->set_pop_variant("skip");
  auto bad = CompletionRequestFromProto(p);
  ASSERT_TRUE(std::holds_alternative<ApiError>(bad));
  EXPECT_EQ(std::get<ApiError>(bad).param, "tripod.pop_variant");
}

TEST(OpenAiRequestTest, MethodsAndBudgets) {
  auto method = [](const json& t) { return ParseOk(kCmpl, {{"tripod", t}}).method; };
  EXPECT_EQ(method({{"method", "none"}}).method, DraftMethod::kNone);
  const std::vector<std::pair<const char*, DraftMethod>> names = {
      {"speckv", DraftMethod::kSpecKv},       {"specpc", DraftMethod::kSpecPc},
      {"draftmap", DraftMethod::kDraftMap},   {"snapkv", DraftMethod::kSnapKv},
      {"pyramidkv", DraftMethod::kPyramidKv}, {"streamingllm", DraftMethod::kStreamingLlm}};
  for (const auto& [name, m] : names) {
    const MethodChoice c = method({{"method", name}, {"budget", 100}});
    EXPECT_EQ(c.method, m) << name;
    EXPECT_EQ(c.budget_tokens, 100);
  }
  // A fraction of the prompt: a number below 1 or "a/b".
  EXPECT_DOUBLE_EQ(method({{"method", "specpc"}, {"budget", 0.25}}).budget_fraction, 0.25);
  EXPECT_EQ(method({{"method", "specpc"}, {"budget", 0.25}}).budget_tokens, 0);
  EXPECT_DOUBLE_EQ(method({{"method", "specpc"}, {"budget", "1/8"}}).budget_fraction, 0.125);
  EXPECT_EQ(method({{"method", "specpc"}, {"budget", "512"}}).budget_tokens, 512);
  EXPECT_EQ(method({{"method", "specpc"}, {"budget", 7.0}}).budget_tokens, 7);
  EXPECT_EQ(method({{
                        "method",
                        "",
                    },
                    {"budget", 0}})
                .method,
            DraftMethod::kNone);

  tripod::v1::CompletionRequest p;
  p.set_prompt("hello");
  p.mutable_tripod()->set_method("draftmap");
  p.mutable_tripod()->set_budget_fraction(0.5);
  auto r = CompletionRequestFromProto(p);
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(r)) << std::get<ApiError>(r).message;
  EXPECT_EQ(std::get<CompletionRequest>(r).method.method, DraftMethod::kDraftMap);
  EXPECT_DOUBLE_EQ(std::get<CompletionRequest>(r).method.budget_fraction, 0.5);
  p.mutable_tripod()->set_budget_fraction(1.0);  // a fraction must stay below 1
  auto bad = CompletionRequestFromProto(p);
  ASSERT_TRUE(std::holds_alternative<ApiError>(bad));
  EXPECT_EQ(std::get<ApiError>(bad).param, "tripod.budget");
}

struct Refusal {
  ApiKind kind;
  json extra;         // merged into a valid body
  std::string param;  // expected error param
  std::string words;  // expected in the message
};

TEST(OpenAiRequestTest, RefusedFieldsNameTheirParam) {
  const std::vector<Refusal> cases = {
      {kCmpl, {{"model", nullptr}}, "model", "model"},
      {kCmpl, {{"model", 5}}, "model", "must be a string"},
      {kCmpl, {{"model", ""}}, "model", "model"},
      {kCmpl, {{"prompt", nullptr}}, "prompt", "required"},
      {kCmpl, {{"prompt", ""}}, "prompt", "empty"},
      {kCmpl, {{"prompt", json::array()}}, "prompt", "empty"},
      {kCmpl, {{"prompt", {json::array()}}}, "prompt", "empty"},
      {kCmpl, {{"prompt", {"a", "b"}}}, "prompt", "one prompt"},
      {kCmpl, {{"prompt", {{1}, {2}}}}, "prompt", "one prompt"},
      {kCmpl, {{"prompt", {1, "a"}}}, "prompt", "prompt[1]"},
      {kCmpl, {{"prompt", {1, -2}}}, "prompt", "token id"},
      {kCmpl, {{"prompt", {1.5}}}, "prompt", "token id"},
      {kCmpl, {{"prompt", {4294967296LL}}}, "prompt", "token id"},
      {kCmpl, {{"prompt", 5}}, "prompt", "a string, a list"},
      {kCmpl, {{"prompt", {{"x", 1}}}}, "prompt", "a string, a list"},
      {kCmpl, {{"prompt", {true}}}, "prompt", "a string, a list"},
      {kChat, {{"messages", nullptr}}, "messages", "required"},
      {kChat, {{"messages", json::array()}}, "messages", "empty"},
      {kChat, {{"messages", "hi"}}, "messages", "list"},
      {kChat, {{"messages", {"hi"}}}, "messages[0]", "object"},
      {kChat, {{"messages", {{{"content", "x"}}}}}, "messages[0].role", "required"},
      {kChat, {{"messages", {{{"role", 1}, {"content", "x"}}}}}, "messages[0].role", "string"},
      {kChat,
       {{"messages", {{{"role", "function"}, {"content", "x"}}}}},
       "messages[0].role",
       "function"},
      {kChat,
       {{"messages", {{{"role", "wizard"}, {"content", "x"}}}}},
       "messages[0].role",
       "one of system, user, assistant"},
      {kChat, {{"messages", {{{"role", "user"}}}}}, "messages[0].content", "required"},
      {kChat,
       {{"messages", {{{"role", "user"}, {"content", 3}}}}},
       "messages[0].content",
       "string or a list"},
      {kChat,
       {{"messages",
         {{{"role", "user"}, {"content", {{{"type", "image_url"}, {"image_url", "u"}}}}}}}},
       "messages[0].content[0].type",
       "only text"},
      {kChat,
       {{"messages", {{{"role", "user"}, {"content", {{{"type", "text"}}}}}}}},
       "messages[0].content[0].text",
       "string"},
      {kCmpl, {{"max_tokens", 0}}, "max_tokens", "[1, 2147483647]"},
      {kCmpl, {{"max_tokens", -5}}, "max_tokens", "got -5"},
      {kCmpl, {{"max_tokens", 2147483648LL}}, "max_tokens", "[1, 2147483647]"},
      {kCmpl, {{"max_tokens", 1.5}}, "max_tokens", "integer"},
      {kCmpl, {{"max_tokens", "10"}}, "max_tokens", "got a string"},
      {kCmpl, {{"max_tokens", 1e300}}, "max_tokens", "64 bits"},
      {kChat, {{"max_completion_tokens", 0}}, "max_completion_tokens", "[1,"},
      {kCmpl, {{"temperature", -0.1}}, "temperature", "[0, 2]"},
      {kCmpl, {{"temperature", 2.01}}, "temperature", "[0, 2]"},
      {kCmpl, {{"temperature", "hot"}}, "temperature", "number"},
      {kCmpl, {{"temperature", true}}, "temperature", "number"},
      {kCmpl, {{"top_p", 0}}, "top_p", "(0, 1]"},
      {kCmpl, {{"top_p", 1.5}}, "top_p", "(0, 1]"},
      {kCmpl, {{"top_k", -2}}, "top_k", "[-1,"},
      {kCmpl, {{"top_k", 2.5}}, "top_k", "integer"},
      {kCmpl, {{"min_p", -0.01}}, "min_p", "[0, 1]"},
      {kCmpl, {{"min_p", 1.01}}, "min_p", "[0, 1]"},
      {kCmpl, {{"repetition_penalty", 0}}, "repetition_penalty", "[0.01, 100]"},
      {kCmpl, {{"repetition_penalty", -1}}, "repetition_penalty", "[0.01, 100]"},
      {kCmpl, {{"repetition_penalty", 1e300}}, "repetition_penalty", "[0.01, 100]"},
      {kCmpl, {{"repetition_penalty", 1e-50}}, "repetition_penalty", "[0.01, 100]"},
      {kCmpl, {{"presence_penalty", 2.5}}, "presence_penalty", "[-2, 2]"},
      {kCmpl, {{"frequency_penalty", -3}}, "frequency_penalty", "[-2, 2]"},
      {kCmpl, {{"stop", 5}}, "stop", "string or a list"},
      {kCmpl, {{"stop", {"a", 1}}}, "stop", "stop[1]"},
      {kCmpl, {{"stop", {""}}}, "stop", "1 to 256 bytes"},
      {kCmpl, {{"stop", std::string(257, 'x')}}, "stop", "got 257"},
      {kCmpl, {{"stop", std::vector<std::string>(17, "s")}}, "stop", "at most 16"},
      {kCmpl, {{"seed", 1.5}}, "seed", "integer"},
      {kCmpl, {{"seed", "1"}}, "seed", "integer"},
      {kCmpl, {{"seed", 1e30}}, "seed", "integer"},
      {kCmpl, {{"n", 129}}, "n", "[1, 128]"},
      {kCmpl, {{"n", 0}}, "n", "[1, 128]"},
      {kCmpl, {{"n", -2}}, "n", "[1, 128]"},
      {kCmpl, {{"n", "1"}}, "n", "integer"},
      {kCmpl, {{"n", 1.5}}, "n", "integer"},
      {kCmpl, {{"best_of", 1.5}}, "best_of", "integer"},
      {kCmpl, {{"n", 3}, {"best_of", 2}}, "best_of", "[n = 3, 128]"},
      {kCmpl, {{"best_of", 0}}, "best_of", "[n = 1, 128]"},
      {kCmpl, {{"best_of", 129}}, "best_of", "[n = 1, 128]"},
      {kCmpl, {{"best_of", 3}, {"stream", true}}, "best_of", "'stream'"},
      {kChat, {{"n", 2}, {"best_of", 4}, {"stream", true}}, "best_of", "'stream'"},
      {kCmpl, {{"logprobs", 21}}, "logprobs", "[0, 20]"},
      {kCmpl, {{"logprobs", -1}}, "logprobs", "[0, 20]"},
      {kCmpl, {{"logprobs", true}}, "logprobs", "integer"},
      {kChat, {{"logprobs", 3}}, "logprobs", "boolean"},
      {kChat, {{"logprobs", true}, {"top_logprobs", 21}}, "top_logprobs", "[0, 20]"},
      {kChat, {{"top_logprobs", 2}}, "top_logprobs", "logprobs"},
      {kChat, {{"echo", true}}, "echo", "not supported"},
      {kCmpl, {{"echo", "no"}}, "echo", "boolean"},
      {kCmpl, {{"suffix", "tail"}}, "suffix", "not supported"},
      {kCmpl, {{"logit_bias", {{"50256", -101}}}}, "logit_bias", "[-100, 100]"},
      {kCmpl, {{"logit_bias", {{"7", "x"}}}}, "logit_bias", "numbers"},
      {kCmpl, {{"logit_bias", {{"seven", 1}}}}, "logit_bias", "token ids"},
      {kCmpl, {{"logit_bias", {{"-3", 1}}}}, "logit_bias", "token ids"},
      {kCmpl, {{"logit_bias", {{"7", 1}, {"07", 2}}}}, "logit_bias", "twice"},
      {kCmpl, {{"logit_bias", 5}}, "logit_bias", "object"},
      {kCmpl, {{"stop_token_ids", 5}}, "stop_token_ids", "list"},
      {kCmpl, {{"stop_token_ids", {1, "x"}}}, "stop_token_ids", "integers"},
      {kCmpl, {{"stop_token_ids", {-1}}}, "stop_token_ids", ">= 0"},
      {kCmpl, {{"stop_token_ids", json(std::vector<int>(65, 1))}}, "stop_token_ids", "at most"},
      {kChat, {{"min_tokens", -1}}, "min_tokens", "[0,"},
      {kChat, {{"min_tokens", "3"}}, "min_tokens", "integer"},
      {kChat, {{"logit_bias", {{"99999999999", 1}}}}, "logit_bias", "token ids"},
      {kChat, {{"tools", {{{"type", "function"}}}}}, "tools[0].function", "must be an object"},
      {kChat, {{"tool_choice", "required"}}, "tool_choice", "'tools' is empty"},
      {kChat, {{"tool_choice", {{"type", "function"}}}}, "tool_choice", "must be"},
      {kChat, {{"function_call", {{"name", "f"}}}}, "function_call", "not supported"},
      {kChat,
       {{"messages",
         {{{"role", "user"}, {"content", "x"}},
          {{"role", "assistant"},
           {"tool_calls", {{{"id", "c1"}, {"type", "function"}, {"function", "f"}}}}}}}},
       "messages[1].tool_calls[0]",
       "must be"},
      {kChat,
       {{"messages",
         {{{"role", "assistant"}, {"content", ""}, {"function_call", {{"name", "f"}}}}}}},
       "messages[0].function_call",
       "not supported"},
      {kChat, {{"response_format", {{"type", "xml"}}}}, "response_format.type", "json_schema"},
      {kChat, {{"guided_regex", "(a"}}, "guided_regex", "invalid regex"},
      {kCmpl, {{"user", 1}}, "user", "string"},
      {kCmpl, {{"stream", "yes"}}, "stream", "boolean"},
      {kCmpl, {{"stream_options", {{"include_usage", true}}}}, "stream_options", "stream"},
      {kCmpl,
       {{"stream", false}, {"stream_options", {{"include_usage", true}}}},
       "stream_options",
       "stream"},
      {kCmpl, {{"stream", true}, {"stream_options", 1}}, "stream_options", "object"},
      {kCmpl,
       {{"stream", true}, {"stream_options", {{"include_usage", 1}}}},
       "stream_options.include_usage",
       "boolean"},
      {kCmpl, {{"ignore_eos", 1}}, "ignore_eos", "boolean"},
      {kCmpl, {{"tripod", "fast"}}, "tripod", "object"},
      {kCmpl, {{"tripod", {{"pop", "sometimes"}}}}, "tripod.pop", "ratio"},
      {kCmpl, {{"tripod", {{"pop", "1"}}}}, "tripod.pop", "[0, 1)"},
      {kCmpl, {{"tripod", {{"pop", "1/0"}}}}, "tripod.pop", "ratio"},
      {kCmpl, {{"tripod", {{"pop", "-0.1"}}}}, "tripod.pop", "ratio"},
      {kCmpl, {{"tripod", {{"pop", "nan"}}}}, "tripod.pop", "ratio"},
      {kCmpl, {{"tripod", {{"pop", "1/2/3"}}}}, "tripod.pop", "ratio"},
      {kCmpl, {{"tripod", {{"pop", 1}}}}, "tripod.pop", "ratio"},
      {kCmpl, {{"tripod", {{"pop", true}}}}, "tripod.pop", "ratio"},
      {kCmpl,
       {{"tripod", {{"pop", "1/3"}, {"pop_variant", "half"}}}},
       "tripod.pop_variant",
       "\"nokv\""},
      {kCmpl, {{"tripod", {{"pop", "1/3"}, {"pop_variant", 1}}}}, "tripod.pop_variant", "string"},
      {kCmpl, {{"tripod", {{"pop_variant", "nokv"}}}}, "tripod.pop_variant", "as a ratio"},
      {kCmpl,
       {{"tripod", {{"pop", "on"}, {"pop_variant", "nokv"}}}},
       "tripod.pop_variant",
       "as a ratio"},
      {kCmpl,
       {{"tripod",
         {{"pop", "1/3"}, {"pop_variant", "shortgpt"}, {"method", "snapkv"}, {"budget", 9}}}},
       "tripod.pop_variant",
       "tripod.method"},
      {kCmpl, {{"tripod", {{"method", "speckv"}}}}, "tripod.budget", "needs a 'tripod.budget'"},
      {kCmpl, {{"tripod", {{"method", "h2o"}, {"budget", 9}}}}, "tripod.method", "one of"},
      {kCmpl, {{"tripod", {{"method", 3}}}}, "tripod.method", "string"},
      {kCmpl, {{"tripod", {{"budget", 9}}}}, "tripod.budget", "needs a 'tripod.method'"},
      {kCmpl, {{"tripod", {{"method", "snapkv"}, {"budget", -1}}}}, "tripod.budget", "got -1"},
      {kCmpl, {{"tripod", {{"method", "snapkv"}, {"budget", 1.5}}}}, "tripod.budget", "whole"},
      {kCmpl, {{"tripod", {{"method", "snapkv"}, {"budget", "3/2"}}}}, "tripod.budget", "3/2"},
      {kCmpl, {{"tripod", {{"method", "snapkv"}, {"budget", "lots"}}}}, "tripod.budget", "lots"},
      {kCmpl, {{"tripod", {{"method", "snapkv"}, {"budget", 1e12}}}}, "tripod.budget", "2^31"},
      {kCmpl, {{"tripod", {{"method", "snapkv"}, {"budget", true}}}}, "tripod.budget", "number"},
  };
  for (const Refusal& c : cases) {
    SCOPED_TRACE(c.extra.dump());
    const ApiError e = ParseErr(c.kind, Body(c.kind, c.extra));
    EXPECT_EQ(e.http_status, 400);
    EXPECT_EQ(e.type, "invalid_request_error");
    EXPECT_EQ(e.param, c.param);
    EXPECT_THAT(e.message, HasSubstr(c.words));
  }
}

TEST(OpenAiRequestTest, NoOpToolFieldsPass) {
  // Without tools, tool_choice "none"/"auto" and empty tool-call lists ask for nothing.
  for (const json& extra :
       {json{{"tool_choice", "none"}}, json{{"tool_choice", "auto"}},
        json{{"tools", json::array()}, {"tool_choice", "none"}},
        json{{"messages",
              {{{"role", "user"}, {"content", "x"}},
               {{"role", "assistant"}, {"content", "y"}, {"tool_calls", json::array()}}}}}}) {
    SCOPED_TRACE(extra.dump());
    auto r = ParseCompletionBody(Body(kChat, extra), kChat);
    ASSERT_TRUE(std::holds_alternative<CompletionRequest>(r)) << std::get<ApiError>(r).message;
    EXPECT_FALSE(std::get<CompletionRequest>(r).ParsesToolCalls());
  }
}

TEST(OpenAiRequestTest, AForcedToolCallConstrainsTheOutputToItsSchema) {
  const json tools = json::parse(R"([
      {"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"], "additionalProperties": false}}},
      {"type": "function", "function": {"name": "noop"}}])");
  auto named = ParseCompletionBody(
      Body(kChat, {{"tools", tools},
                   {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}},
                   {"parallel_tool_calls", false}}),
      kChat);
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(named))
      << std::get<ApiError>(named).message;
  const std::string& regex = std::get<CompletionRequest>(named).output_regex;
  EXPECT_THAT(regex, HasSubstr("get_weather"));
  EXPECT_THAT(regex, ::testing::Not(HasSubstr("noop")));
  auto required =
      ParseCompletionBody(Body(kChat, {{"tools", tools}, {"tool_choice", "required"}}), kChat);
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(required));
  EXPECT_THAT(std::get<CompletionRequest>(required).output_regex, HasSubstr("noop"));
  // A forced call beside a structured output: two constraints, refused.
  auto both = ParseCompletionBody(Body(kChat, {{"tools", tools},
                                               {"tool_choice", "required"},
                                               {"response_format", {{"type", "json_object"}}}}),
                                  kChat);
  ASSERT_TRUE(std::holds_alternative<ApiError>(both));
  EXPECT_EQ(std::get<ApiError>(both).param, "tool_choice");
}

TEST(OpenAiRequestTest, BodiesThatAreNotJsonObjects) {
  for (const char* body : {"", "{", "not json", "[1,2]", "\"str\"", "42", "null",
                           "{\"model\": \"m\",}", "{\"prompt\": \"\xff\"}"}) {
    SCOPED_TRACE(body);
    const ApiError e = ParseErr(kCmpl, body);
    EXPECT_EQ(e.http_status, 400);
    EXPECT_EQ(e.param, "");
    EXPECT_THAT(e.message, HasSubstr("request body"));
  }
  // Deep nesting is refused before parsing; brackets inside strings do not count.
  const std::string deep = "{\"x\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
  EXPECT_THAT(ParseErr(kCmpl, deep).message, HasSubstr("deeper than"));
  json ok = json::parse(Body(kCmpl, json::object()));
  ok["prompt"] = std::string(1000, '[');
  auto r = ParseCompletionBody(ok.dump(), kCmpl);
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(r));
  EXPECT_EQ(std::get<CompletionRequest>(r).prompt_text, std::string(1000, '['));
}

TEST(OpenAiRequestTest, HostileNumbersAreRefusedNotStored) {
  // 1e999 overflows a double: the JSON parser refuses the body. Integers past 2^64 parse as
  // floats: refused by the field's check.
  EXPECT_THAT(ParseErr(kCmpl, R"({"model":"m","prompt":"x","temperature":1e999})").message,
              HasSubstr("not valid JSON"));
  EXPECT_EQ(
      ParseErr(kCmpl, R"({"model":"m","prompt":"x","max_tokens":99999999999999999999999})").param,
      "max_tokens");
  EXPECT_EQ(ParseErr(kCmpl, R"({"model":"m","prompt":"x","seed":-99999999999999999999999})").param,
            "seed");
}

TEST(OpenAiRequestTest, ParsePopChoiceDirectly) {
  auto ok = [](std::string_view s) { return std::holds_alternative<PopChoice>(ParsePopChoice(s)); };
  EXPECT_TRUE(ok("0"));
  EXPECT_TRUE(ok("2/3"));
  EXPECT_TRUE(ok("0.999"));
  EXPECT_FALSE(ok("3/2"));
  EXPECT_FALSE(ok("inf"));
  EXPECT_FALSE(ok("1/inf/2"));
  EXPECT_FALSE(ok("ON"));
}

// The gRPC path: same struct, same checks, same messages.
TEST(OpenAiRequestTest, ProtoFieldsMapLikeJson) {
  tripod::v1::CompletionRequest p;
  p.set_prompt("hello");
  p.set_max_tokens(7);
  p.set_temperature(0.5f);
  p.set_top_p(0.9f);
  p.set_top_k(-1);
  p.set_min_p(0.1f);
  p.set_repetition_penalty(1.2f);
  p.set_presence_penalty(0.5f);
  p.set_frequency_penalty(-0.5f);
  p.add_stop("END");
  p.set_seed(9);
  p.set_n(1);
  p.set_logprobs(2);
  p.set_ignore_eos(true);
  p.set_user("u");
  p.mutable_tripod()->set_pop("off");
  p.mutable_tripod()->set_method("snapkv");
  p.mutable_tripod()->set_budget(5);
  auto r = CompletionRequestFromProto(p);
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(r)) << std::get<ApiError>(r).message;
  const CompletionRequest& c = std::get<CompletionRequest>(r);
  EXPECT_EQ(c.kind, kCmpl);
  EXPECT_EQ(c.model, "");  // the served model
  EXPECT_EQ(c.prompt_text, "hello");
  EXPECT_EQ(c.max_tokens, 7);
  EXPECT_FLOAT_EQ(c.sampling.temperature, 0.5f);
  EXPECT_EQ(c.sampling.top_k, 0);
  EXPECT_FLOAT_EQ(c.sampling.repetition_penalty, 1.2f);
  EXPECT_EQ(c.stop, std::vector<std::string>{"END"});
  EXPECT_TRUE(c.has_seed);
  EXPECT_EQ(c.sampling.seed, 9u);
  EXPECT_TRUE(c.logprobs);
  EXPECT_EQ(c.sampling.top_logprobs, 2);
  EXPECT_TRUE(c.ignore_eos);
  EXPECT_EQ(c.user, "u");
  EXPECT_EQ(c.pop.kind, PopChoice::Kind::kOff);
  EXPECT_EQ(c.method.method, DraftMethod::kSnapKv);
  EXPECT_EQ(c.method.budget_tokens, 5);
  EXPECT_FALSE(c.stream);

  // Unset optionals are the defaults.
  tripod::v1::CompletionRequest bare;
  bare.mutable_prompt_ids()->add_ids(3);
  auto rb = CompletionRequestFromProto(bare);
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(rb));
  const CompletionRequest& b = std::get<CompletionRequest>(rb);
  EXPECT_TRUE(b.prompt_is_ids);
  EXPECT_EQ(b.prompt_ids, std::vector<int32_t>{3});
  EXPECT_EQ(b.max_tokens, -1);
  EXPECT_FLOAT_EQ(b.sampling.temperature, 1.0f);
  EXPECT_FALSE(b.logprobs);
  EXPECT_FALSE(b.has_seed);

  tripod::v1::CompletionRequest chat;
  auto* m = chat.mutable_messages()->add_messages();
  m->set_role("developer");
  m->set_content("x");
  chat.mutable_messages()->add_messages()->set_role("user");
  auto rc = CompletionRequestFromProto(chat);
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(rc));
  EXPECT_EQ(std::get<CompletionRequest>(rc).kind, kChat);
  EXPECT_EQ(std::get<CompletionRequest>(rc).messages[0].role, "system");
}

TEST(OpenAiRequestTest, ProtoRefusalsMatchJson) {
  struct Case {
    void (*set)(tripod::v1::CompletionRequest*);
    json extra;  // the same value over HTTP
  };
  const std::vector<Case> cases = {
      {[](tripod::v1::CompletionRequest* p) { p->set_max_tokens(0); }, {{"max_tokens", 0}}},
      {[](tripod::v1::CompletionRequest* p) { p->set_temperature(3); }, {{"temperature", 3}}},
      {[](tripod::v1::CompletionRequest* p) { p->set_top_p(0); }, {{"top_p", 0}}},
      {[](tripod::v1::CompletionRequest* p) { p->set_top_k(-5); }, {{"top_k", -5}}},
      {[](tripod::v1::CompletionRequest* p) { p->set_min_p(2); }, {{"min_p", 2}}},
      {[](tripod::v1::CompletionRequest* p) { p->set_repetition_penalty(0); },
       {{"repetition_penalty", 0}}},
      {[](tripod::v1::CompletionRequest* p) { p->set_presence_penalty(-3); },
       {{"presence_penalty", -3}}},
      {[](tripod::v1::CompletionRequest* p) { p->set_frequency_penalty(3); },
       {{"frequency_penalty", 3}}},
      {[](tripod::v1::CompletionRequest* p) { p->set_n(0); }, {{"n", 0}}},
      {[](tripod::v1::CompletionRequest* p) { p->set_logprobs(21); }, {{"logprobs", 21}}},
      {[](tripod::v1::CompletionRequest* p) {
         const std::vector<std::string> stops(17, "s");
         p->mutable_stop()->Assign(stops.begin(), stops.end());
       },
       {{"stop", std::vector<std::string>(17, "s")}}},
      {[](tripod::v1::CompletionRequest* p) { p->add_stop(); }, {{"stop", {""}}}},
      {[](tripod::v1::CompletionRequest* p) { p->mutable_tripod()->set_pop("2"); },
       {{"tripod", {{"pop", "2"}}}}},
      {[](tripod::v1::CompletionRequest* p) { p->mutable_tripod()->set_method("specpc"); },
       {{"tripod", {{"method", "specpc"}}}}},
      {[](tripod::v1::CompletionRequest* p) { p->mutable_tripod()->set_budget(-1); },
       {{"tripod", {{"budget", -1}}}}},
      {[](tripod::v1::CompletionRequest* p) { p->set_prompt(""); }, {{"prompt", ""}}},
      // The fields the HTTP API carries as JSON go through the same parsers.
      {[](tripod::v1::CompletionRequest* p) { p->set_n(200); }, {{"n", 200}}},
      {[](tripod::v1::CompletionRequest* p) {
         p->set_n(3);
         p->set_best_of(2);
       },
       {{"n", 3}, {"best_of", 2}}},
      {[](tripod::v1::CompletionRequest* p) { p->set_prompt_logprobs(21); },
       {{"prompt_logprobs", 21}}},
      {[](tripod::v1::CompletionRequest* p) {
         p->set_echo(true);
         p->set_logprobs(1);
         p->mutable_tripod()->set_pop("on");
       },
       {{"echo", true}, {"logprobs", 1}, {"tripod", {{"pop", "on"}}}}},
      {[](tripod::v1::CompletionRequest* p) { p->set_guided_regex("(a"); },
       {{"guided_regex", "(a"}}},
      {[](tripod::v1::CompletionRequest* p) { p->mutable_guided_choice(); },
       {{"guided_choice", json::array()}}},
      {[](tripod::v1::CompletionRequest* p) { p->set_guided_json("{\"type\": \"object\""); },
       {{"guided_json", "{\"type\": \"object\""}}},
      {[](tripod::v1::CompletionRequest* p) {
         p->mutable_response_format()->set_type("json_schema");
         p->mutable_response_format()->set_schema(R"({"type": "string", "format": "email"})");
       },
       {{"response_format",
         {{"type", "json_schema"},
          {"json_schema", {{"schema", R"({"type": "string", "format": "email"})"}}}}}}},
      {[](tripod::v1::CompletionRequest* p) { p->mutable_response_format()->set_type("xml"); },
       {{"response_format", {{"type", "xml"}}}}},
      {[](tripod::v1::CompletionRequest* p) { p->add_tools()->set_name("f"); },
       {{"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}}}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.extra.dump());
    tripod::v1::CompletionRequest p;
    p.set_prompt("hello");
    c.set(&p);
    auto r = CompletionRequestFromProto(p);
    ASSERT_TRUE(std::holds_alternative<ApiError>(r));
    const ApiError from_proto = std::get<ApiError>(r);
    const ApiError from_json = ParseErr(kCmpl, Body(kCmpl, c.extra));
    EXPECT_EQ(from_proto.param, from_json.param);
    EXPECT_EQ(from_proto.message, from_json.message);
    EXPECT_EQ(from_proto.http_status, 400);
  }

  tripod::v1::CompletionRequest none;
  auto r = CompletionRequestFromProto(none);
  ASSERT_TRUE(std::holds_alternative<ApiError>(r));
  EXPECT_EQ(std::get<ApiError>(r).param, "prompt");

  tripod::v1::CompletionRequest neg;
  neg.mutable_prompt_ids()->add_ids(-3);
  r = CompletionRequestFromProto(neg);
  ASSERT_TRUE(std::holds_alternative<ApiError>(r));
  EXPECT_EQ(std::get<ApiError>(r).param, "prompt_ids");

  tripod::v1::CompletionRequest empty_ids;
  empty_ids.mutable_prompt_ids();
  r = CompletionRequestFromProto(empty_ids);
  ASSERT_TRUE(std::holds_alternative<ApiError>(r));
  EXPECT_THAT(std::get<ApiError>(r).message, HasSubstr("empty"));

  tripod::v1::CompletionRequest tool;
  auto* m = tool.mutable_messages()->add_messages();
  m->set_role("function");
  r = CompletionRequestFromProto(tool);
  ASSERT_TRUE(std::holds_alternative<ApiError>(r));
  EXPECT_EQ(std::get<ApiError>(r).param, "messages[0].role");

  tripod::v1::CompletionRequest no_messages;
  no_messages.mutable_messages();
  r = CompletionRequestFromProto(no_messages);
  ASSERT_TRUE(std::holds_alternative<ApiError>(r));
  EXPECT_EQ(std::get<ApiError>(r).param, "messages");
}

// Chat over gRPC: tools, tool_choice, earlier calls and echo reach the request HTTP's parser makes
// of the same JSON, and are refused as it refuses them.
TEST(OpenAiRequestTest, ProtoToolsAndMessagesMapLikeJson) {
  tripod::v1::CompletionRequest p;
  auto* user = p.mutable_messages()->add_messages();
  user->set_role("user");
  user->set_content("weather?");
  auto* assistant = p.mutable_messages()->add_messages();
  assistant->set_role("assistant");
  auto* call = assistant->add_tool_calls();
  call->set_id("call_1");
  call->set_name("get_weather");
  call->set_arguments(R"({"city": "Oslo"})");
  auto* tool_turn = p.mutable_messages()->add_messages();
  tool_turn->set_role("tool");
  tool_turn->set_tool_call_id("call_1");
  tool_turn->set_content("-3 C");
  auto* tool = p.add_tools();
  tool->set_name("get_weather");
  tool->set_description("The weather");
  tool->set_parameters(
      R"({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})");
  p.mutable_tool_choice()->set_function("get_weather");
  p.set_parallel_tool_calls(false);
  auto r = CompletionRequestFromProto(p);
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(r)) << std::get<ApiError>(r).message;
  const CompletionRequest& g = std::get<CompletionRequest>(r);

  const std::string body = R"({"model": "m", "messages": [
      {"role": "user", "content": "weather?"},
      {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "-3 C"}],
    "tools": [{"type": "function", "function": {"name": "get_weather",
      "description": "The weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
    "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    "parallel_tool_calls": false})";
  auto h = ParseCompletionBody(body, kChat);
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(h)) << std::get<ApiError>(h).message;
  const CompletionRequest& want = std::get<CompletionRequest>(h);
  EXPECT_EQ(g.kind, kChat);
  EXPECT_EQ(g.tools_json, want.tools_json);
  EXPECT_EQ(g.tool_names, want.tool_names);
  EXPECT_EQ(g.tool_choice, ToolChoice::kNamed);
  EXPECT_EQ(g.tool_choice_name, "get_weather");
  EXPECT_FALSE(g.parallel_tool_calls);
  EXPECT_FALSE(g.output_regex.empty());
  EXPECT_EQ(g.output_regex, want.output_regex);
  ASSERT_EQ(g.messages.size(), 3u);
  ASSERT_EQ(g.messages[1].tool_calls.size(), 1u);
  EXPECT_EQ(g.messages[1].tool_calls[0].name, "get_weather");
  EXPECT_EQ(g.messages[1].tool_calls[0].arguments, want.messages[1].tool_calls[0].arguments);
  EXPECT_EQ(g.messages[2].role, "tool");

  // Refusals: the same message and param as HTTP's.
  struct Case {
    void (*set)(tripod::v1::CompletionRequest*);
    json extra;
  };
  const std::vector<Case> cases = {
      {[](tripod::v1::CompletionRequest* q) { q->set_echo(true); }, {{"echo", true}}},
      {[](tripod::v1::CompletionRequest* q) { q->mutable_tool_choice()->set_mode("required"); },
       {{"tool_choice", "required"}}},
      {[](tripod::v1::CompletionRequest* q) { q->mutable_tool_choice()->set_mode("sometimes"); },
       {{"tool_choice", "sometimes"}}},
      {[](tripod::v1::CompletionRequest* q) { q->add_tools()->set_name("bad name"); },
       {{"tools", {{{"type", "function"}, {"function", {{"name", "bad name"}}}}}}}},
      {[](tripod::v1::CompletionRequest* q) {
         q->add_tools()->set_name("f");
         q->mutable_tool_choice()->set_function("g");
       },
       {{"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}},
        {"tool_choice", {{"type", "function"}, {"function", {{"name", "g"}}}}}}},
      {[](tripod::v1::CompletionRequest* q) {
         q->mutable_messages()->mutable_messages(0)->add_tool_calls()->set_name("f");
       },
       {{"messages",
         {{{"role", "user"},
           {"content", "hi"},
           {"tool_calls",
            {{{"id", ""},
              {"type", "function"},
              {"function", {{"name", "f"}, {"arguments", ""}}}}}}}}}}},
      {[](tripod::v1::CompletionRequest* q) {
         q->add_tools()->set_name("f");
         q->mutable_tool_choice()->set_mode("required");
         q->set_guided_regex("a+");
       },
       {{"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}},
        {"tool_choice", "required"},
        {"guided_regex", "a+"}}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.extra.dump());
    tripod::v1::CompletionRequest q;
    auto* m = q.mutable_messages()->add_messages();
    m->set_role("user");
    m->set_content("hi");
    c.set(&q);
    auto got = CompletionRequestFromProto(q);
    ASSERT_TRUE(std::holds_alternative<ApiError>(got));
    const ApiError from_json = ParseErr(kChat, Body(kChat, c.extra));
    EXPECT_EQ(std::get<ApiError>(got).param, from_json.param);
    EXPECT_EQ(std::get<ApiError>(got).message, from_json.message);
  }

  // gRPC's own: parameters that are not JSON.
  tripod::v1::CompletionRequest bad = p;
  bad.mutable_tools(0)->set_parameters("{");
  auto e = CompletionRequestFromProto(bad);
  ASSERT_TRUE(std::holds_alternative<ApiError>(e));
  EXPECT_EQ(std::get<ApiError>(e).param, "tools[0].function.parameters");
}

// Echo, prompt log-probabilities, n and best_of, stop strings kept, structured outputs: the
// request HTTP's parser makes of the same fields; best_of > 1 is refused on Generate (stream).
TEST(OpenAiRequestTest, ProtoEchoChoicesAndStructuredOutputs) {
  tripod::v1::CompletionRequest p;
  p.set_prompt("hello");
  p.set_echo(true);
  p.set_logprobs(2);
  p.set_max_tokens(0);
  p.set_prompt_logprobs(3);
  p.set_n(2);
  p.set_best_of(4);
  p.set_include_stop_str_in_output(true);
  p.mutable_response_format()->set_type("json_schema");
  p.mutable_response_format()->set_schema(
      R"({"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}})");
  auto r = CompletionRequestFromProto(p);
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(r)) << std::get<ApiError>(r).message;
  const CompletionRequest& g = std::get<CompletionRequest>(r);
  // Raw text: the schema's properties keep their order, as a client wrote them.
  auto h = ParseCompletionBody(
      R"({"model": "m", "prompt": "hello", "echo": true, "logprobs": 2, "max_tokens": 0,
        "prompt_logprobs": 3, "n": 2, "best_of": 4, "include_stop_str_in_output": true,
        "response_format": {"type": "json_schema", "json_schema": {"schema":
          {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}}}})",
      kCmpl);
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(h)) << std::get<ApiError>(h).message;
  const CompletionRequest& want = std::get<CompletionRequest>(h);
  EXPECT_TRUE(g.echo);
  EXPECT_EQ(g.max_tokens, 0);
  EXPECT_EQ(g.vllm_prompt_logprobs, 3);
  EXPECT_EQ(g.prompt_logprobs, want.prompt_logprobs);
  EXPECT_EQ(g.n, 2);
  EXPECT_EQ(g.best_of, 4);
  EXPECT_TRUE(g.include_stop_str);
  EXPECT_EQ(g.output_regex, want.output_regex);  // the properties in the order written
  EXPECT_NE(g.output_regex.find("\"b\""), std::string::npos);
  EXPECT_LT(g.output_regex.find("\"b\""), g.output_regex.find("\"a\""));

  auto streamed = CompletionRequestFromProto(p, /*stream=*/true);
  ASSERT_TRUE(std::holds_alternative<ApiError>(streamed));
  EXPECT_EQ(std::get<ApiError>(streamed).param, "best_of");
  p.clear_best_of();
  auto ok = CompletionRequestFromProto(p, /*stream=*/true);
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(ok));
  EXPECT_TRUE(std::get<CompletionRequest>(ok).stream);

  tripod::v1::CompletionRequest choice;
  choice.set_prompt("hello");
  choice.mutable_guided_choice()->add_choices("yes");
  choice.mutable_guided_choice()->add_choices("no");
  auto c = CompletionRequestFromProto(choice);
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(c));
  EXPECT_EQ(std::get<CompletionRequest>(c).output_regex,
            ParseOk(kCmpl, {{"guided_choice", {"yes", "no"}}}).output_regex);
  tripod::v1::CompletionRequest text;
  text.set_prompt("hello");
  text.mutable_response_format()->set_type("text");
  auto t = CompletionRequestFromProto(text);
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(t));
  EXPECT_EQ(std::get<CompletionRequest>(t).output_regex, "");
}

}  // namespace
}  // namespace tripod::scheduler
