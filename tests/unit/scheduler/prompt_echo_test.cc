// What an answer gives back of its prompt: completions' echo (text, and with logprobs the
// prompt's entries first, null for the first token, offsets going on into the completion),
// vLLM's prompt_logprobs shape (completions: in the choice; chat: beside the choices), and the
// stream's first chunk.
#include "scheduler/prompt_echo.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "common/model/gguf.h"
#include "nlohmann/json.hpp"
#include "scheduler/openai_response.h"
#include "tests/unit/test_model.h"

namespace tripod::scheduler {
namespace {

using nlohmann::json;

class PromptEchoTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    static const Tokenizer* const tok = [] {
      auto gguf = GgufFile::Open(TestModelPath());
      EXPECT_TRUE(gguf.ok()) << gguf.status();
      auto t = Tokenizer::FromGguf(**gguf);
      EXPECT_TRUE(t.ok()) << t.status();
      return std::move(*t).release();
    }();
    tokenizer_ = tok;
  }

  // The prompt "Hello world again" with log-probabilities -1, -2 for its later tokens and two
  // alternatives each (ids 10 and 11).
  static PromptEcho Echo(bool echo, bool logprobs, int vllm) {
    CompletionRequest r;
    r.prompt_text = "Hello world again";
    r.echo = echo;
    r.logprobs = logprobs;
    r.vllm_prompt_logprobs = vllm;
    const std::vector<int32_t> ids = tokenizer_->Encode(r.prompt_text, false);
    PromptEcho e = MakePromptEcho(r, ids, *tokenizer_);
    for (size_t p = 1; p < ids.size(); ++p) {
      PromptLogprob lp;
      lp.position = static_cast<int>(p);
      lp.id = ids[p];
      lp.logprob = -static_cast<float>(p);
      lp.rank = static_cast<int32_t>(p + 2);
      lp.top = {{10, -0.1f}, {11, -0.2f}};
      e.logprobs.push_back(lp);
    }
    return e;
  }

  static const Tokenizer* tokenizer_;
};
const Tokenizer* PromptEchoTest::tokenizer_ = nullptr;

ResponseContext Context(ApiKind kind, bool logprobs, int top) {
  ResponseContext c;
  c.kind = kind;
  c.id = "x";
  c.model = "m";
  c.created = 1234;
  c.logprobs = logprobs;
  c.top_logprobs = top;
  return c;
}

TEST_F(PromptEchoTest, EchoWithLogprobsPutsThePromptFirst) {
  const PromptEcho e = Echo(true, true, -1);
  ASSERT_EQ(e.ids.size(), 3u);
  GeneratedToken t;
  t.id = 42;
  t.text = "!";
  t.logprob = -0.25f;
  const json body = json::parse(CompletionResponseBody(Context(ApiKind::kCompletion, true, 1),
                                                       std::vector<GeneratedToken>{t},
                                                       CompletionEnd{}, *tokenizer_, &e));
  const json& c = body["choices"][0];
  EXPECT_EQ(c["text"], "Hello world again!");
  EXPECT_FALSE(c.contains("prompt_logprobs"));
  const json& lp = c["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 4u);
  EXPECT_EQ(lp["tokens"][0], "Hello");
  EXPECT_EQ(lp["tokens"][1], " world");
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  EXPECT_EQ(lp["token_logprobs"][1], -1.0);
  EXPECT_EQ(lp["token_logprobs"][2], -2.0);
  EXPECT_EQ(lp["token_logprobs"][3], -0.25);
  // One alternative and the token itself.
  EXPECT_EQ(lp["top_logprobs"][1].size(), 2u);
  EXPECT_EQ(lp["top_logprobs"][1][" world"], -1.0);
  EXPECT_EQ(lp["text_offset"], json({0, 5, 11, 17}));
}

TEST_F(PromptEchoTest, EchoAloneAndVllmShape) {
  const PromptEcho e = Echo(true, false, 1);
  const json body = json::parse(CompletionResponseBody(Context(ApiKind::kCompletion, false, 0),
                                                       std::span<const GeneratedToken>(),
                                                       CompletionEnd{}, *tokenizer_, &e));
  const json& c = body["choices"][0];
  EXPECT_EQ(c["text"], "Hello world again");
  EXPECT_TRUE(c["logprobs"].is_null());
  const json& plp = c["prompt_logprobs"];
  ASSERT_EQ(plp.size(), 3u);
  EXPECT_TRUE(plp[0].is_null());
  const std::string own = std::to_string(e.ids[1]);
  ASSERT_EQ(plp[1].size(), 2u);  // the token and one alternative
  EXPECT_EQ(plp[1][own]["logprob"], -1.0);
  EXPECT_EQ(plp[1][own]["rank"], 3);
  EXPECT_EQ(plp[1][own]["decoded_token"], " world");
  EXPECT_EQ(plp[1]["10"]["rank"], 1);

  // Chat: beside the choices.
  const PromptEcho chat = Echo(false, false, 0);
  const json cb = json::parse(CompletionResponseBody(Context(ApiKind::kChatCompletion, false, 0),
                                                     std::span<const GeneratedToken>(),
                                                     CompletionEnd{}, *tokenizer_, &chat));
  ASSERT_EQ(cb["prompt_logprobs"].size(), 3u);
  EXPECT_EQ(cb["prompt_logprobs"][2].size(), 1u);
  EXPECT_FALSE(cb["choices"][0].contains("prompt_logprobs"));
}

TEST_F(PromptEchoTest, StreamSendsThePromptFirst) {
  SseStream s(Context(ApiKind::kCompletion, true, 1), *tokenizer_);
  EXPECT_EQ(s.Prompt(PromptEcho{}), "");  // nothing asked
  const std::string first = s.Prompt(Echo(true, true, -1));
  ASSERT_EQ(first.rfind("data: ", 0), 0u);
  const json chunk = json::parse(first.substr(6));
  EXPECT_EQ(chunk["created"], 1234);
  EXPECT_EQ(chunk["choices"][0]["text"], "Hello world again");
  EXPECT_EQ(chunk["choices"][0]["logprobs"]["tokens"].size(), 3u);
  // The completion's offsets go on after the echoed text.
  GeneratedToken t;
  t.id = 42;
  t.text = "!";
  const std::string next = s.Tokens(std::vector<GeneratedToken>{t});
  EXPECT_EQ(json::parse(next.substr(6))["choices"][0]["logprobs"]["text_offset"][0], 17);
}

}  // namespace
}  // namespace tripod::scheduler
