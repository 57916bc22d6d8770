// The table of request fields (request_fields.h): every field a body may carry is parsed,
// accepted as a no-op for the values that change nothing, or refused with a 400 naming it;
// unknown fields are refused, never ignored. Also echo, max_tokens 0 and prompt_logprobs, and
// their refusal beside what would not give the full model's numbers.
#include "scheduler/request_fields.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <span>
#include <string>
#include <variant>

#include "nlohmann/json.hpp"
#include "scheduler/openai_request.h"

namespace tripod::scheduler::request_fields_test {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

constexpr ApiKind kCmpl = ApiKind::kCompletion;
constexpr ApiKind kChat = ApiKind::kChatCompletion;

std::string Body(ApiKind kind, const json& extra) {
  json b = kind == kChat
               ? json{{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}}
               : json{{"model", "m"}, {"prompt", "hello"}};
  for (auto it = extra.begin(); it != extra.end(); ++it) b[it.key()] = it.value();
  return b.dump();
}

ApiResult<CompletionRequest> Parse(ApiKind kind, const json& extra) {
  return ParseCompletionBody(Body(kind, extra), kind);
}

CompletionRequest Ok(ApiKind kind, const json& extra) {
  auto r = Parse(kind, extra);
  if (auto* e = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << "refused " << extra.dump() << ": " << e->message;
    return {};
  }
  return std::get<CompletionRequest>(r);
}

ApiError Err(ApiKind kind, const json& extra) {
  auto r = Parse(kind, extra);
  if (auto* e = std::get_if<ApiError>(&r)) return *e;
  ADD_FAILURE() << "accepted " << extra.dump();
  return {};
}

struct Refusal {
  ApiKind kind;
  json extra;
  const char* param;
  const char* words;  // in the message
};

// Each is a 400 naming `param`, its message holding `words` (and `also`).
void ExpectRefused(std::span<const Refusal> cases, const char* also = "") {
  for (const Refusal& c : cases) {
    SCOPED_TRACE(c.extra.dump());
    const ApiError e = Err(c.kind, c.extra);
    EXPECT_EQ(e.http_status, 400);
    EXPECT_EQ(e.param, c.param);
    EXPECT_THAT(e.message, HasSubstr(c.words));
    EXPECT_THAT(e.message, HasSubstr(also));
  }
}

TEST(RequestFieldsTest, UnimplementedFieldsAreRefusedNamingTheField) {
  // The fields of issue 41 and vLLM's extras that would change the answer.
  const json values[] = {json::array({"a", "b"}), json{{"type", "object"}}, json("x|y"), json(1),
                         json(true)};
  for (const char* key : {"guided_grammar", "guided_whitespace_pattern", "allowed_token_ids",
                          "bad_words", "logits_processors", "use_beam_search",
                          "truncate_prompt_tokens", "some_unknown_field", "nvext"}) {
    for (ApiKind kind : {kCmpl, kChat}) {
      for (const json& v : values) {
        SCOPED_TRACE(std::string(key) + " " + v.dump());
        const ApiError e = Err(kind, {{key, v}});
        EXPECT_EQ(e.http_status, 400);
        EXPECT_EQ(e.type, "invalid_request_error");
        EXPECT_EQ(e.param, key);
        EXPECT_THAT(e.message, HasSubstr("not supported"));
      }
    }
  }
  // Null counts as absent, for unknown fields too.
  Ok(kCmpl, {{"guided_choice", nullptr}, {"anything", nullptr}});
}

TEST(RequestFieldsTest, EveryRefusedRowIsRefusedAndEveryParsedRowKnown) {
  for (const RequestField& f : RequestFields()) {
    for (ApiKind kind : {kCmpl, kChat}) {
      const unsigned door = kind == kChat ? kChatDoor : kCompletionsDoor;
      if ((f.doors & door) == 0 || f.rule != FieldRule::kRefused) continue;
      SCOPED_TRACE(std::string(f.name));
      const ApiError e = Err(kind, {{std::string(f.name), 1}});
      EXPECT_EQ(e.param, f.name);
    }
  }
}

TEST(RequestFieldsTest, FieldsOfTheOtherDoorAreRefused) {
  ApiError e = Err(kCmpl, {{"messages", json::array()}});
  EXPECT_EQ(e.param, "messages");
  EXPECT_THAT(e.message, HasSubstr("not supported on /v1/completions"));
  e = Err(kChat, {{"prompt", "x"}});
  EXPECT_EQ(e.param, "prompt");
  EXPECT_THAT(e.message, HasSubstr("/v1/chat/completions"));
  e = Err(kCmpl, {{"top_logprobs", 2}});
  EXPECT_EQ(e.param, "top_logprobs");
}

TEST(RequestFieldsTest, NoOpFieldsTakeOnlyTheValuesThatChangeNothing) {
  Ok(kCmpl, {{"skip_special_tokens", true}, {"user", "u"}, {"suffix", ""}});
  EXPECT_TRUE(Ok(kChat, {{"include_stop_str_in_output", true}}).include_stop_str);
  EXPECT_FALSE(Ok(kCmpl, {{"include_stop_str_in_output", false}}).include_stop_str);
  EXPECT_EQ(Err(kCmpl, {{"include_stop_str_in_output", 1}}).param, "include_stop_str_in_output");
  Ok(kChat, {{"skip_special_tokens", true},
             {"store", false},
             {"metadata", {{"k", "v"}}},
             {"service_tier", "auto"},
             {"parallel_tool_calls", true},
             {"modalities", {"text"}},
             {"prompt_cache_key", "k"},
             {"safety_identifier", "s"},
             {"echo", false},
             {"tools", json::array()},
             {"tool_choice", "none"},
             {"response_format", {{"type", "text"}}}});
  const Refusal refused[] = {
      {kCmpl, {{"skip_special_tokens", false}}, "skip_special_tokens", "only true"},
      {kChat, {{"skip_special_tokens", "no"}}, "skip_special_tokens", "only true"},
      {kChat, {{"store", true}}, "store", "only false"},
      {kChat, {{"service_tier", "flex"}}, "service_tier", "auto"},
      {kChat, {{"modalities", {"text", "audio"}}}, "modalities", "text"},
      {kChat, {{"metadata", "x"}}, "metadata", "object"},
      {kChat, {{"echo", true}}, "echo", "only false"},
      {kChat, {{"function_call", "required"}}, "function_call", "tool_choice"},
      {kCmpl, {{"suffix", "x"}}, "suffix", "only empty"},
      {kCmpl, {{"tripod", {{"pop", "off"}, {"fast", true}}}}, "tripod.fast", "not supported"},
      {kCmpl,
       {{"stream", true}, {"stream_options", {{"continuous_usage_stats", true}}}},
       "stream_options.continuous_usage_stats",
       "not supported"},
  };
  ExpectRefused(refused, "not supported");
}

TEST(RequestFieldsTest, EchoAndPromptLogprobs) {
  CompletionRequest r = Ok(kCmpl, {{"echo", true}});
  EXPECT_TRUE(r.echo);
  EXPECT_EQ(r.prompt_logprobs, -1);  // echo alone needs no log-probabilities
  r = Ok(kCmpl, {{"echo", true}, {"logprobs", 3}, {"max_tokens", 0}});
  EXPECT_EQ(r.max_tokens, 0);
  EXPECT_EQ(r.prompt_logprobs, 3);
  EXPECT_EQ(r.vllm_prompt_logprobs, -1);
  r = Ok(kCmpl, {{"logprobs", 2}});
  EXPECT_EQ(r.prompt_logprobs, -1);
  r = Ok(kCmpl, {{"echo", true}, {"logprobs", 1}, {"prompt_logprobs", 5}});
  EXPECT_EQ(r.prompt_logprobs, 5);
  EXPECT_EQ(r.vllm_prompt_logprobs, 5);
  r = Ok(kChat, {{"prompt_logprobs", 0}});
  EXPECT_EQ(r.prompt_logprobs, 0);
  EXPECT_EQ(r.vllm_prompt_logprobs, 0);
  // The full model asked for explicitly is fine.
  Ok(kCmpl, {{"prompt_logprobs", 1}, {"tripod", {{"pop", "off"}}}});
  Ok(kCmpl, {{"prompt_logprobs", 1}, {"tripod", {{"pop", "0"}}}});

  const Refusal refused[] = {
      {kCmpl, {{"max_tokens", 0}}, "max_tokens", "[1, "},
      {kCmpl, {{"prompt_logprobs", 21}}, "prompt_logprobs", "[0, 20]"},
      {kCmpl, {{"prompt_logprobs", -1}}, "prompt_logprobs", "[0, 20]"},
      {kChat, {{"prompt_logprobs", true}}, "prompt_logprobs", "integer"},
      {kCmpl, {{"prompt_logprobs", 1}, {"tripod", {{"pop", "1/3"}}}}, "tripod.pop", "1/3"},
      {kCmpl, {{"prompt_logprobs", 1}, {"tripod", {{"pop", "on"}}}}, "tripod.pop", "full model"},
      {kCmpl,
       {{"echo", true}, {"logprobs", 1}, {"tripod", {{"pop", 0.25}}}},
       "tripod.pop",
       "'echo' with 'logprobs'"},
      {kCmpl,
       {{"prompt_logprobs", 1}, {"tripod", {{"pop", "1/3"}, {"pop_variant", "nokv"}}}},
       "tripod.pop_variant",
       "full model"},
      {kChat,
       {{"prompt_logprobs", 1}, {"tripod", {{"method", "specpc"}, {"budget", 64}}}},
       "tripod.method",
       "specpc"},
  };
  ExpectRefused(refused);
}

}  // namespace
}  // namespace tripod::scheduler::request_fields_test
