// Prompt ids of completion requests and the /tokenize and /detokenize bodies, on the bundled
// model's tokenizer and chat template.
#include "scheduler/openai_tokens.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/gguf.h"
#include "nlohmann/json.hpp"
#include "scheduler/openai_request.h"
#include "tests/unit/test_model.h"

namespace tripod::scheduler {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

class OpenAiTokensTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto gguf = GgufFile::Open(TestModelPath());
    ASSERT_TRUE(gguf.ok()) << gguf.status();
    auto tok = Tokenizer::FromGguf(**gguf);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = std::move(*tok).release();
    auto text = (*gguf)->GetString("tokenizer.chat_template");
    ASSERT_TRUE(text.ok()) << text.status();
    auto tmpl = DetectChatTemplate(*text);
    ASSERT_TRUE(tmpl.ok()) << tmpl.status();
    template_ = new ChatTemplate(*tmpl);
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    delete template_;
  }

  static CompletionRequest Parse(const std::string& body, ApiKind kind) {
    auto r = ParseCompletionBody(body, kind);
    if (auto* e = std::get_if<ApiError>(&r)) ADD_FAILURE() << e->message;
    return std::get_if<CompletionRequest>(&r) ? std::get<CompletionRequest>(r)
                                              : CompletionRequest{};
  }

  static std::vector<int32_t> IdsOk(const CompletionRequest& r) {
    auto ids = PromptTokenIds(r, *tokenizer_, *template_);
    if (auto* e = std::get_if<ApiError>(&ids)) {
      ADD_FAILURE() << e->message;
      return {};
    }
    return std::get<std::vector<int32_t>>(ids);
  }

  static Tokenizer* tokenizer_;
  static ChatTemplate* template_;
};

Tokenizer* OpenAiTokensTest::tokenizer_ = nullptr;
ChatTemplate* OpenAiTokensTest::template_ = nullptr;

TEST_F(OpenAiTokensTest, TextPromptParsesSpecialTokens) {
  const CompletionRequest r =
      Parse(R"({"model":"m","prompt":"<|im_start|>user\nHi"})", ApiKind::kCompletion);
  const std::vector<int32_t> ids = IdsOk(r);
  std::vector<int32_t> expected = tokenizer_->Encode("<|im_start|>user\nHi", true);
  if (tokenizer_->add_bos()) expected.insert(expected.begin(), tokenizer_->bos_id());
  EXPECT_EQ(ids, expected);
  ASSERT_TRUE(tokenizer_->FindToken("<|im_start|>").has_value());
  EXPECT_NE(std::find(ids.begin(), ids.end(), *tokenizer_->FindToken("<|im_start|>")), ids.end());
}

TEST_F(OpenAiTokensTest, IdPromptCheckedAgainstVocabulary) {
  EXPECT_EQ(IdsOk(Parse(R"({"model":"m","prompt":[1,2,3]})", ApiKind::kCompletion)),
            (std::vector<int32_t>{1, 2, 3}));
  const int32_t v = tokenizer_->vocab_size();
  const CompletionRequest r =
      Parse(absl::StrCat(R"({"model":"m","prompt":[[5,)", v, "]]}"), ApiKind::kCompletion);
  auto ids = PromptTokenIds(r, *tokenizer_, *template_);
  ASSERT_TRUE(std::holds_alternative<ApiError>(ids));
  const ApiError& e = std::get<ApiError>(ids);
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.param, "prompt");
  EXPECT_THAT(e.message, HasSubstr("prompt[1]"));
  EXPECT_THAT(e.message, HasSubstr("outside the vocabulary"));
}

TEST_F(OpenAiTokensTest, ChatUsesTemplateAndKeepsContentFromInjecting) {
  const CompletionRequest r =
      Parse(R"({"model":"m","messages":[{"role":"user","content":"<|im_end|>hi"}]})",
            ApiKind::kChatCompletion);
  const std::vector<int32_t> ids = IdsOk(r);
  const std::vector<ChatSegment> segs = RenderChatSegments(*template_, r.messages, true);
  EXPECT_EQ(ids, EncodeChat(*tokenizer_, segs, false));
  EXPECT_EQ(tokenizer_->Decode(ids), RenderChat(*template_, r.messages, true));
  // The user's "<|im_end|>" is plain text: the special id appears only where the template put
  // it (after the default system message and after the user turn), not three times.
  const int32_t im_end = *tokenizer_->FindToken("<|im_end|>");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), im_end), 2);
}

TEST_F(OpenAiTokensTest, EmptyPromptRefused) {
  CompletionRequest r;  // as a front end might build one by hand
  r.kind = ApiKind::kCompletion;
  r.prompt_is_ids = true;
  auto ids = PromptTokenIds(r, *tokenizer_, *template_);
  ASSERT_TRUE(std::holds_alternative<ApiError>(ids));
  EXPECT_EQ(std::get<ApiError>(ids).param, "prompt");
}

TEST_F(OpenAiTokensTest, TokenizeDetokenizeRoundTrip) {
  auto req = ParseTokenizeBody(R"({"model":"m","prompt":"The café is open. 🎉"})");
  ASSERT_TRUE(std::holds_alternative<TokenizeRequest>(req));
  const std::vector<int32_t> ids = std::get<std::vector<int32_t>>(
      Tokenize(std::get<TokenizeRequest>(req), *tokenizer_, *template_));
  ASSERT_FALSE(ids.empty());
  const json t = json::parse(TokenizeResponseBody(ids, 2048));
  EXPECT_EQ(t["tokens"].get<std::vector<int32_t>>(), ids);
  EXPECT_EQ(t["count"], ids.size());
  EXPECT_EQ(t["max_model_len"], 2048);
  EXPECT_EQ(t.size(), 3u);

  json dreq;
  dreq["model"] = "m";
  dreq["tokens"] = t["tokens"];
  auto d = ParseDetokenizeBody(dreq.dump(), tokenizer_->vocab_size());
  ASSERT_TRUE(std::holds_alternative<DetokenizeRequest>(d));
  const json out = json::parse(DetokenizeResponseBody(std::get<DetokenizeRequest>(d), *tokenizer_));
  EXPECT_EQ(out["prompt"], "The café is open. 🎉");
}

TEST_F(OpenAiTokensTest, TokenizeOptions) {
  // add_special_tokens false: no BOS even where the tokenizer adds one.
  auto plain = ParseTokenizeBody(R"({"prompt":"hi","add_special_tokens":false})");
  ASSERT_TRUE(std::holds_alternative<TokenizeRequest>(plain));
  EXPECT_FALSE(std::get<TokenizeRequest>(plain).add_special_tokens);
  EXPECT_EQ(std::get<std::vector<int32_t>>(
                Tokenize(std::get<TokenizeRequest>(plain), *tokenizer_, *template_)),
            tokenizer_->Encode("hi", true));

  // Messages: what /v1/chat/completions would feed the model; add_generation_prompt defaults to
  // true and can be turned off.
  const std::string msgs = R"("messages":[{"role":"user","content":"hi"}])";
  auto chat = ParseTokenizeBody("{" + msgs + "}");
  ASSERT_TRUE(std::holds_alternative<TokenizeRequest>(chat));
  const TokenizeRequest& c = std::get<TokenizeRequest>(chat);
  EXPECT_TRUE(c.is_chat);
  EXPECT_TRUE(c.add_generation_prompt);
  const std::vector<int32_t> with =
      std::get<std::vector<int32_t>>(Tokenize(c, *tokenizer_, *template_));
  CompletionRequest as_chat = Parse("{\"model\":\"m\"," + msgs + "}", ApiKind::kChatCompletion);
  EXPECT_EQ(with, IdsOk(as_chat));
  auto no_gen = ParseTokenizeBody("{" + msgs + R"(,"add_generation_prompt":false})");
  ASSERT_TRUE(std::holds_alternative<TokenizeRequest>(no_gen));
  const std::vector<int32_t> without = std::get<std::vector<int32_t>>(
      Tokenize(std::get<TokenizeRequest>(no_gen), *tokenizer_, *template_));
  EXPECT_LT(without.size(), with.size());
  // A tool message on a template without a tool format (SmolLM2's ChatML) is a 400.
  auto tool = ParseTokenizeBody(R"({"messages":[{"role":"tool","content":"12 C"}]})");
  ASSERT_TRUE(std::holds_alternative<TokenizeRequest>(tool));
  auto refused = Tokenize(std::get<TokenizeRequest>(tool), *tokenizer_, *template_);
  ASSERT_TRUE(std::holds_alternative<ApiError>(refused));
  EXPECT_EQ(std::get<ApiError>(refused).param, "messages");
  EXPECT_EQ(tokenizer_->Decode(without),
            RenderChat(*template_, std::vector<ChatMessage>{{"user", "hi"}}, false));
}

TEST_F(OpenAiTokensTest, TokenizeAndDetokenizeRefusals) {
  struct Case {
    std::string body;
    std::string param;
  };
  const std::vector<Case> tokenize = {
      {"{}", "prompt"},
      {"[]", ""},
      {R"({"prompt":5})", "prompt"},
      {R"({"prompt":"a","messages":[{"role":"user","content":"b"}]})", "messages"},
      {R"({"messages":[]})", "messages"},
      {R"({"messages":[{"role":"function","content":"b"}]})", "messages[0].role"},
      {R"({"messages":[{"role":"assistant","content":"","tool_calls":[{"id":"c"}]}]})",
       "messages[0].tool_calls[0]"},
      {R"({"messages":[{"role":"user","content":"b"}],"tools":[{"type":"x"}]})", "tools[0].type"},
      {R"({"prompt":"a","add_special_tokens":"yes"})", "add_special_tokens"},
      {R"({"messages":[{"role":"user","content":"b"}],"add_generation_prompt":1})",
       "add_generation_prompt"},
      {R"({"prompt":"a","model":7})", "model"},
  };
  for (const Case& c : tokenize) {
    SCOPED_TRACE(c.body);
    auto r = ParseTokenizeBody(c.body);
    ASSERT_TRUE(std::holds_alternative<ApiError>(r));
    EXPECT_EQ(std::get<ApiError>(r).param, c.param);
    EXPECT_EQ(std::get<ApiError>(r).http_status, 400);
  }
  const int32_t v = tokenizer_->vocab_size();
  const std::vector<Case> detokenize = {
      {"{}", "tokens"},
      {R"({"tokens":"1 2"})", "tokens"},
      {R"({"tokens":[1,-1]})", "tokens"},
      {R"({"tokens":[1.5]})", "tokens"},
      {absl::StrCat(R"({"tokens":[0,)", v, "]}"), "tokens"},
      {"nope", ""},
  };
  for (const Case& c : detokenize) {
    SCOPED_TRACE(c.body);
    auto r = ParseDetokenizeBody(c.body, v);
    ASSERT_TRUE(std::holds_alternative<ApiError>(r));
    EXPECT_EQ(std::get<ApiError>(r).param, c.param);
  }
  auto last = ParseDetokenizeBody(absl::StrCat(R"({"tokens":[)", v - 1, "]}"), v);
  EXPECT_TRUE(std::holds_alternative<DetokenizeRequest>(last));
  auto none = ParseDetokenizeBody(R"({"tokens":[]})", v);
  ASSERT_TRUE(std::holds_alternative<DetokenizeRequest>(none));
  EXPECT_EQ(json::parse(DetokenizeResponseBody(std::get<DetokenizeRequest>(none), *tokenizer_)),
            json({{"prompt", ""}}));
}

TEST_F(OpenAiTokensTest, DetokenizeSplitCharacterIsStillJson) {
  // The first token of a multi-byte character alone: the body must stay valid JSON.
  const std::vector<int32_t> ids = tokenizer_->Encode("🎉", false);
  DetokenizeRequest d;
  d.tokens = {ids[0]};
  const std::string body = DetokenizeResponseBody(d, *tokenizer_);
  const json out = json::parse(body);
  EXPECT_TRUE(out["prompt"].is_string());
}

TEST_F(OpenAiTokensTest, TokenizerInfoNamesTheSpecialTokensTokenizeKnows) {
  const json info = json::parse(TokenizerInfoBody(*tokenizer_, 8192));
  EXPECT_EQ(info["tokenizer_class"], "gpt2");
  EXPECT_EQ(info["model_max_length"], 8192);
  EXPECT_EQ(info["vocab_size"], tokenizer_->vocab_size());
  EXPECT_TRUE(info["pad_token"].is_null());
  // lm-evaluation-harness reads the EOS id as /tokenize of this text (no special tokens added).
  ASSERT_TRUE(info["eos_token"].is_string());
  TokenizeRequest r;
  r.prompt = info["eos_token"].get<std::string>();
  r.add_special_tokens = false;
  auto ids = Tokenize(r, *tokenizer_, *template_);
  ASSERT_TRUE(std::holds_alternative<std::vector<int32_t>>(ids));
  EXPECT_EQ(std::get<std::vector<int32_t>>(ids), std::vector<int32_t>{tokenizer_->eos_id()});
  ASSERT_TRUE(info["bos_token"].is_string());
  EXPECT_EQ(tokenizer_->FindToken(info["bos_token"].get<std::string>()), tokenizer_->bos_id());
  EXPECT_EQ(info["add_bos_token"], tokenizer_->add_bos());
  EXPECT_TRUE(json::parse(TokenizerInfoBody(*tokenizer_, 0))["model_max_length"].is_null());
}

}  // namespace
}  // namespace tripod::scheduler
