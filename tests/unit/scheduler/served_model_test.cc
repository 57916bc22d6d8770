// The name the API serves a model under: --served_model_name, else the catalogue name --model
// gave, else the file's name; under another name the file's name stays an alias that `model` may
// give (CheckModelName), and anything else is a 404 naming the served name. And the context
// error names the max_tokens field the client sent.
#include "scheduler/served_model.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <tuple>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "scheduler/openai_request.h"
#include "scheduler/request_preparation.h"
#include "tests/unit/test_model.h"

namespace tripod::scheduler {
namespace {

TEST(ServedModelTest, NameFromTheFlags) {
  EXPECT_EQ(ServedModelName("", ""), "");  // the default model: its file's name
  EXPECT_EQ(ServedModelName("qwen2.5-coder-1.5b-instruct", ""), "qwen2.5-coder-1.5b-instruct");
  EXPECT_EQ(ServedModelName("smollm2-135m-instruct", ""), "smollm2-135m-instruct");
  EXPECT_EQ(ServedModelName("/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", ""), "");
  EXPECT_EQ(ServedModelName("other.gguf", ""), "");
  EXPECT_EQ(ServedModelName("qwen2.5-coder-1.5b-instruct", "coder"), "coder");
  EXPECT_EQ(ServedModelName("/m/x.gguf", "coder"), "coder");
}

TEST(ServedModelTest, TheFileNameByDefaultWithoutAliases) {
  auto m = LoadServedModel(TestModelPath(), "", "");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->name, "SmolLM2-135M-Instruct.Q4_1");
  EXPECT_TRUE((*m)->aliases.empty());
  EXPECT_FALSE(CheckModelName("SmolLM2-135M-Instruct.Q4_1", **m).has_value());
  EXPECT_FALSE(CheckModelName("", **m).has_value());
  std::optional<ApiError> e = CheckModelName("smollm2-135m-instruct", **m);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->http_status, 404);
  EXPECT_EQ(e->code, "model_not_found");
  EXPECT_EQ(e->param, "model");
}

TEST(ServedModelTest, AnotherNameKeepsTheFileNameAsAnAlias) {
  auto m = LoadServedModel(TestModelPath(), "smollm2-135m-instruct", "");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->name, "smollm2-135m-instruct");
  EXPECT_EQ((*m)->aliases, std::vector<std::string>{"SmolLM2-135M-Instruct.Q4_1"});
  EXPECT_FALSE(CheckModelName("smollm2-135m-instruct", **m).has_value());
  EXPECT_FALSE(CheckModelName("SmolLM2-135M-Instruct.Q4_1", **m).has_value());
  EXPECT_FALSE(CheckModelName("", **m).has_value());
  std::optional<ApiError> e = CheckModelName("gpt-4o", **m);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->http_status, 404);
  EXPECT_EQ(e->code, "model_not_found");
  EXPECT_NE(e->message.find("'smollm2-135m-instruct'"), std::string::npos) << e->message;
  EXPECT_TRUE(CheckModelName("smollm2-135m-instruct-q4", **m).has_value());
}

// prompt + max_tokens past the context: the error names the field the client sent (a chat
// request's max_tokens is max_tokens, not max_completion_tokens).
TEST(ServedModelTest, ContextExceededNamesTheFieldGiven) {
  auto m = LoadServedModel(TestModelPath(), "", "");
  ASSERT_TRUE(m.ok()) << m.status();
  const int64_t context = (*m)->max_model_len;
  ASSERT_GT(context, 0);
  const std::string chat =
      R"("model": "SmolLM2-135M-Instruct.Q4_1", "messages": [{"role": "user", "content": "hi"}])";
  for (const auto& [kind, body, param] : std::vector<std::tuple<ApiKind, std::string, std::string>>{
           {ApiKind::kCompletion,
            absl::StrCat(
                R"({"model": "SmolLM2-135M-Instruct.Q4_1", "prompt": "hi", "max_tokens": )",
                context, "}"),
            "max_tokens"},
           {ApiKind::kChatCompletion, absl::StrCat("{", chat, R"(, "max_tokens": )", context, "}"),
            "max_tokens"},
           {ApiKind::kChatCompletion,
            absl::StrCat("{", chat, R"(, "max_completion_tokens": )", context, "}"),
            "max_completion_tokens"}}) {
    ApiResult<CompletionRequest> r = ParseCompletionBody(body, kind);
    const CompletionRequest* req = std::get_if<CompletionRequest>(&r);
    ASSERT_NE(req, nullptr) << body << ": " << std::get<ApiError>(r).message;
    ApiResult<PreparedRequest> p = PrepareRequest(*req, **m);
    const ApiError* e = std::get_if<ApiError>(&p);
    ASSERT_NE(e, nullptr) << body;
    EXPECT_EQ(e->code, "context_length_exceeded") << body;
    EXPECT_EQ(e->param, param) << body;
  }
}

}  // namespace
}  // namespace tripod::scheduler
