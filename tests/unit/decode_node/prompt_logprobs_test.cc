// Prompt log-probabilities on the decode engine (fp32, batch-invariant): a prompt P followed by
// the greedy tokens generated from it gets, at those tokens' positions, the log-probabilities and
// alternatives the engine reported when it generated them (teacher forcing); every position
// equals the log-softmax of one whole-prompt forward, across the engine's 64-row chunks; the
// prefix cache is bypassed; max_tokens 0 runs the prompt alone.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "common/compute/cpu/cpu_backend.h"
#include "common/compute/forward.h"
#include "common/kv/contiguous_kv_cache.h"
#include "common/model/position_logprobs.h"
#include "common/util/thread_pool.h"
#include "decode_node/decode_engine.h"
#include "tests/unit/decode_node/random_prompt.h"
#include "tests/unit/decode_node/reference_forward.h"
#include "tests/unit/test_model.h"

namespace tripod {
namespace {

class PromptLogprobsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { PinComputeThreads(); }
};

std::unique_ptr<DecodeEngine> NewEngine() {
  DecodeEngineOptions o;
  o.model_path = TestModelPath();
  o.precision = "fp32";
  o.kv_budget_bytes = size_t{64} << 20;
  o.max_tokens_per_step = 128;
  auto e = DecodeEngine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(e).value() : nullptr;
}

struct Collected {
  std::vector<TokenEvent> tokens;
  std::vector<PromptTokenLogprob> prompt;
  bool prompt_after_token = false;
  FinishReason finish = FinishReason::kNone;
  int cached = -1;
};

DecodeRequest Request(std::vector<int32_t> prompt, int max_tokens, Collected* out) {
  DecodeRequest r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0;
  r.sampling.top_logprobs = 5;
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  r.on_event = [out](const TokenEvent& ev) {
    if (!ev.prompt_logprobs.empty() && !out->tokens.empty()) out->prompt_after_token = true;
    out->prompt.insert(out->prompt.end(), ev.prompt_logprobs.begin(), ev.prompt_logprobs.end());
    if (ev.token >= 0) out->tokens.push_back(ev);
    out->finish = ev.finish;
    if (ev.finish != FinishReason::kNone) out->cached = ev.cached_tokens;
  };
  return r;
}

// The log-softmax at every position of one forward over the whole prompt (fp32,
// batch-invariant, as the engine's kernels): row r predicts token r + 1.
std::vector<PositionLogprobs> WholeForward(const std::vector<int32_t>& ids, int top_k) {
  const int n = static_cast<int>(ids.size());
  std::vector<int32_t> rows;
  for (int r = 0; r < n - 1; ++r) rows.push_back(r);
  const ReferenceForward f = RunReferenceForward(ids, n, rows);
  std::vector<PositionLogprobs> out;
  if (f.logits.empty()) return out;
  for (int r = 0; r < n - 1; ++r) out.push_back(LogprobsAt(f.row(r), ids[r + 1], top_k));
  return out;
}

TEST_F(PromptLogprobsTest, TeacherForcingGivesTheGeneratedTokensLogprobs) {
  auto e = NewEngine();
  ASSERT_NE(e, nullptr);
  const std::vector<int32_t> prompt = RandomPrompt(150, 21);
  Collected gen;
  ASSERT_TRUE(e->Submit(Request(prompt, 8, &gen)).ok());
  ASSERT_TRUE(e->RunUntilIdle().ok());
  ASSERT_EQ(gen.tokens.size(), 8u);
  EXPECT_TRUE(gen.prompt.empty());  // not asked

  std::vector<int32_t> full = prompt;
  for (const TokenEvent& t : gen.tokens) full.push_back(t.token);
  Collected lp;
  DecodeRequest r = Request(full, 0, &lp);
  r.prompt_logprobs = 5;
  const int64_t hits_before = e->stats().prefix_hit_slots;
  ASSERT_TRUE(e->Submit(std::move(r)).ok());
  ASSERT_TRUE(e->RunUntilIdle().ok());
  EXPECT_EQ(lp.finish, FinishReason::kLength);
  EXPECT_TRUE(lp.tokens.empty());
  // The first run's blocks are in the prefix cache; they have no logits: not attached.
  EXPECT_EQ(lp.cached, 0);
  EXPECT_EQ(e->stats().prefix_hit_slots, hits_before);
  ASSERT_EQ(lp.prompt.size(), full.size() - 1);
  for (size_t i = 0; i < lp.prompt.size(); ++i) {
    EXPECT_EQ(lp.prompt[i].position, static_cast<int>(i) + 1);
    EXPECT_EQ(lp.prompt[i].token, full[i + 1]);
  }
  for (size_t i = 0; i < gen.tokens.size(); ++i) {
    SCOPED_TRACE(i);
    const PromptTokenLogprob& p = lp.prompt[prompt.size() - 1 + i];
    const TokenEvent& g = gen.tokens[i];
    EXPECT_EQ(p.token, g.token);
    EXPECT_NEAR(p.logprob, g.logprob, 1e-3);
    EXPECT_EQ(p.rank, 1);  // greedy
    ASSERT_EQ(p.top.size(), g.top_logprobs.size());
    for (size_t j = 0; j < p.top.size(); ++j) {
      EXPECT_EQ(p.top[j].id, g.top_logprobs[j].id);
      EXPECT_NEAR(p.top[j].logprob, g.top_logprobs[j].logprob, 1e-3);
    }
  }

  // Across the 64-row chunks, the same numbers as one forward over the whole prompt.
  const std::vector<PositionLogprobs> whole = WholeForward(full, 5);
  ASSERT_EQ(whole.size(), lp.prompt.size());
  for (size_t i = 0; i < whole.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_NEAR(lp.prompt[i].logprob, whole[i].logprob, 1e-4);
    EXPECT_EQ(lp.prompt[i].rank, whole[i].rank);
    ASSERT_EQ(lp.prompt[i].top.size(), 5u);
    EXPECT_EQ(lp.prompt[i].top[0].id, whole[i].top[0].id);
  }
  EXPECT_TRUE(e->cache().CheckConsistency().ok());
  EXPECT_EQ(e->cache().num_free_blocks(), e->cache().num_blocks());
}

TEST_F(PromptLogprobsTest, PromptLogprobsComeBeforeTheTokens) {
  auto e = NewEngine();
  ASSERT_NE(e, nullptr);
  const std::vector<int32_t> prompt = RandomPrompt(100, 5);
  Collected plain, with;
  ASSERT_TRUE(e->Submit(Request(prompt, 6, &plain)).ok());
  DecodeRequest r = Request(prompt, 6, &with);
  r.prompt_logprobs = 0;
  ASSERT_TRUE(e->Submit(std::move(r)).ok());
  ASSERT_TRUE(e->RunUntilIdle().ok());
  ASSERT_EQ(with.tokens.size(), 6u);
  EXPECT_FALSE(with.prompt_after_token);
  ASSERT_EQ(with.prompt.size(), 99u);
  EXPECT_TRUE(with.prompt[0].top.empty());
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(with.tokens[i].token, plain.tokens[i].token);
}

TEST_F(PromptLogprobsTest, RefusedWhereThePromptIsNotPrefilledHere) {
  auto e = NewEngine();
  ASSERT_NE(e, nullptr);
  Collected c;
  DecodeRequest r = Request({1, 2, 3}, 2, &c);
  r.prompt_logprobs = 21;
  EXPECT_FALSE(e->Validate(r).ok());
  r.prompt_logprobs = 2;
  EXPECT_TRUE(e->Validate(r).ok());
  r.reserved_kv_seq = 0;
  r.reserved_slots = 2;
  EXPECT_FALSE(e->Validate(r).ok());
  // max_tokens 0 without prompt log-probabilities: the prompt runs, nothing is drawn.
  Collected none;
  ASSERT_TRUE(e->Submit(Request({5, 6, 7, 8}, 0, &none)).ok());
  ASSERT_TRUE(e->RunUntilIdle().ok());
  EXPECT_EQ(none.finish, FinishReason::kLength);
  EXPECT_TRUE(none.tokens.empty());
}

}  // namespace
}  // namespace tripod
