// The decode engine's choices (DecodeRequest::n > 1) on the bundled model, fp32: the prompt runs
// once and its KV is forked (full blocks shared, the last partly filled one copied); greedy
// choices equal the single run, seeded ones equal single runs seeded seed + choice; each choice
// finishes on its own; a cancel ends them all; every block comes back; a migrated request's
// choices continue each from its own tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "absl/time/clock.h"
#include "common/util/mutex.h"
#include "common/util/thread_pool.h"
#include "decode_node/decode_engine.h"
#include "tests/unit/decode_node/random_prompt.h"
#include "tests/unit/decode_node/test_engine.h"

namespace tripod {
namespace {

struct Choices {
  std::map<int, std::vector<int32_t>> tokens;  // by choice
  std::map<int, std::vector<float>> logprobs;
  std::map<int, FinishReason> finish;
  std::map<int, int> finals;  // final events by choice (exactly one each)
  std::set<int64_t> ids;      // engine ids seen
};

DecodeRequest Request(std::vector<int32_t> prompt, int n, int max_tokens, Choices* out) {
  DecodeRequest r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0;
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  r.n = n;
  r.on_event = [out](const TokenEvent& ev) {
    EXPECT_EQ(out->finals[ev.choice], 0) << "choice " << ev.choice << ": event after its finish";
    if (ev.token >= 0) {
      out->tokens[ev.choice].push_back(ev.token);
      out->logprobs[ev.choice].push_back(ev.logprob);
    }
    out->ids.insert(ev.request_id);
    if (ev.finish != FinishReason::kNone) {
      ++out->finals[ev.choice];
      out->finish[ev.choice] = ev.finish;
    }
  };
  return r;
}

std::unique_ptr<DecodeEngine> NewEngine(size_t kv_bytes = size_t{64} << 20) {
  return NewTestEngine(TestEngineOptions(kv_bytes));
}

void ExpectAllFree(const DecodeEngine& e) {
  EXPECT_TRUE(e.cache().CheckConsistency().ok()) << e.cache().CheckConsistency();
  EXPECT_EQ(e.cache().num_free_blocks(), e.cache().num_blocks());
  EXPECT_EQ(e.cache().num_sequences(), 0);
  EXPECT_TRUE(e.idle());
}

class DecodeChoicesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { PinComputeThreads(); }
};

TEST_F(DecodeChoicesTest, GreedyChoicesEqualTheSingleRun) {
  auto e = NewEngine();
  ASSERT_NE(e, nullptr);
  for (int len : {17, 32}) {  // a partly filled last block (copied), whole blocks (none copied)
    const std::vector<int32_t> prompt = RandomPrompt(len, 7 + len);
    Choices one, three;
    ASSERT_TRUE(e->Submit(Request(prompt, 1, 12, &one)).ok());
    ASSERT_TRUE(e->RunUntilIdle().ok());
    ASSERT_TRUE(e->Submit(Request(prompt, 3, 12, &three)).ok());
    ASSERT_TRUE(e->RunUntilIdle().ok());
    ASSERT_EQ(one.tokens[0].size(), 12u);
    ASSERT_EQ(three.tokens.size(), 3u);
    for (int c = 0; c < 3; ++c) {
      EXPECT_EQ(three.tokens[c], one.tokens[0]) << "choice " << c << ", prompt " << len;
      EXPECT_EQ(three.finals[c], 1);
      EXPECT_EQ(three.finish[c], FinishReason::kLength);
    }
    EXPECT_EQ(three.ids.size(), 3u);  // each choice its own engine id
    ExpectAllFree(*e);
  }
}

TEST_F(DecodeChoicesTest, TheForkSharesThePromptsBlocks) {
  auto e = NewEngine();
  ASSERT_NE(e, nullptr);
  // 40 tokens of 16-token blocks: 2 full blocks and a third holding 8 slots.
  Choices out;
  ASSERT_TRUE(e->Submit(Request(RandomPrompt(40, 1), 4, 8, &out)).ok());
  ASSERT_TRUE(e->Step().ok());  // the prompt runs in one step and forks; each choice sampled once
  EXPECT_EQ(e->cache().num_sequences(), 4);
  // Two shared full blocks plus one partly filled block per choice: 6, where copies take 12.
  EXPECT_EQ(e->kv_usage().blocks, 2 + 4);
  EXPECT_TRUE(e->cache().CheckConsistency().ok()) << e->cache().CheckConsistency();
  for (int c = 0; c < 4; ++c) EXPECT_EQ(out.tokens[c].size(), 1u);
  ASSERT_TRUE(e->RunUntilIdle().ok());
  for (int c = 0; c < 4; ++c) EXPECT_EQ(out.tokens[c], out.tokens[0]);
  EXPECT_EQ(e->stats().generated_tokens, 4 * 8);
  ExpectAllFree(*e);
}

TEST_F(DecodeChoicesTest, SeededChoicesAreSeedPlusIndexAndRepeat) {
  auto e = NewEngine();
  ASSERT_NE(e, nullptr);
  const std::vector<int32_t> prompt = RandomPrompt(21, 5);
  auto sampled = [&](int n, uint64_t seed, Choices* out) {
    DecodeRequest r = Request(prompt, n, 10, out);
    r.sampling.temperature = 1.0f;
    r.sampling.seed = seed;
    ASSERT_TRUE(e->Submit(std::move(r)).ok());
    ASSERT_TRUE(e->RunUntilIdle().ok());
  };
  Choices a, b;
  sampled(3, 1000, &a);
  sampled(3, 1000, &b);
  EXPECT_EQ(a.tokens, b.tokens);  // reproducible
  EXPECT_TRUE(a.tokens[0] != a.tokens[1] || a.tokens[1] != a.tokens[2]);
  for (int c = 0; c < 3; ++c) {
    Choices single;
    sampled(1, 1000 + c, &single);
    EXPECT_EQ(a.tokens[c], single.tokens[0]) << "choice " << c;
    EXPECT_EQ(a.logprobs[c], single.logprobs[0]) << "choice " << c;
  }
  ExpectAllFree(*e);
}

TEST_F(DecodeChoicesTest, ChoicesStopOnTheirOwnAndCancelEndsThemAll) {
  auto e = NewEngine();
  ASSERT_NE(e, nullptr);
  const std::vector<int32_t> prompt = RandomPrompt(25, 9);

  // A stop token that only some choices draw: those end early with "stop", the others run on.
  Choices sampled;
  DecodeRequest r = Request(prompt, 4, 24, &sampled);
  r.sampling.temperature = 1.0f;
  r.sampling.seed = 42;
  ASSERT_TRUE(e->Submit(std::move(r)).ok());
  ASSERT_TRUE(e->RunUntilIdle().ok());
  const int32_t stop_token = sampled.tokens[1][3];  // choice 1's 4th token
  Choices stopped;
  r = Request(prompt, 4, 24, &stopped);
  r.sampling.temperature = 1.0f;
  r.sampling.seed = 42;
  r.stop_token_ids = {stop_token};
  ASSERT_TRUE(e->Submit(std::move(r)).ok());
  ASSERT_TRUE(e->RunUntilIdle().ok());
  for (int c = 0; c < 4; ++c) {
    EXPECT_EQ(stopped.finals[c], 1);
    const std::vector<int32_t>& full = sampled.tokens[c];
    const auto at = std::find(full.begin(), full.end(), stop_token);
    if (at == full.end()) {
      EXPECT_EQ(stopped.finish[c], FinishReason::kLength);
      EXPECT_EQ(stopped.tokens[c], full);
    } else {
      EXPECT_EQ(stopped.finish[c], FinishReason::kStop);
      EXPECT_EQ(stopped.tokens[c], std::vector<int32_t>(full.begin(), at + 1));
    }
  }
  EXPECT_EQ(stopped.finish[1], FinishReason::kStop);

  // Cancelled mid-stream (the id Submit returned): every choice ends, once.
  Choices cancelled;
  absl::StatusOr<int64_t> id = e->Submit(Request(prompt, 3, 50, &cancelled));
  ASSERT_TRUE(id.ok());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(e->Step().ok());
  e->Cancel(*id);
  ASSERT_TRUE(e->RunUntilIdle().ok());
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(cancelled.finals[c], 1);
    EXPECT_EQ(cancelled.finish[c], FinishReason::kCancelled);
    EXPECT_LT(cancelled.tokens[c].size(), 50u);
  }
  // Cancelled before its prompt ran: each choice still gets its one final event.
  Choices early;
  id = e->Submit(Request(prompt, 3, 5, &early));
  ASSERT_TRUE(id.ok());
  e->Cancel(*id);
  ASSERT_TRUE(e->RunUntilIdle().ok());
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(early.finals[c], 1);
    EXPECT_EQ(early.finish[c], FinishReason::kCancelled);
    EXPECT_TRUE(early.tokens[c].empty());
  }
  ExpectAllFree(*e);
}

TEST_F(DecodeChoicesTest, PreemptedChoicesKeepTheirTokens) {
  // 10 blocks of 16 tokens: 4 choices of a 40-token prompt growing to 80 tokens each (5 blocks
  // each, 2 shared) do not fit together, so choices are preempted and recompute.
  const size_t per_token = 2ull * 30 * 3 * 64 * 4;
  auto e = NewEngine(10 * 16 * per_token);
  ASSERT_NE(e, nullptr);
  const std::vector<int32_t> prompt = RandomPrompt(40, 11);
  Choices one, four;
  ASSERT_TRUE(e->Submit(Request(prompt, 1, 40, &one)).ok());
  ASSERT_TRUE(e->RunUntilIdle().ok());
  ASSERT_TRUE(e->Submit(Request(prompt, 4, 40, &four)).ok());
  ASSERT_TRUE(e->RunUntilIdle().ok());
  EXPECT_GT(e->stats().preemptions, 0);
  for (int c = 0; c < 4; ++c) EXPECT_EQ(four.tokens[c], one.tokens[0]) << "choice " << c;
  ExpectAllFree(*e);
}

TEST_F(DecodeChoicesTest, BackgroundLoopCancelsEveryChoiceFromAnotherThread) {
  auto e = NewEngine();
  ASSERT_NE(e, nullptr);
  e->Start();
  Mutex mu;
  Choices out;
  int tokens = 0, finals = 0;
  DecodeRequest r = Request(RandomPrompt(30, 4), 3, 4000, &out);
  TokenCallback record = r.on_event;
  r.on_event = [&](const TokenEvent& ev) {
    MutexLock lock(&mu);
    record(ev);
    tokens += ev.token >= 0;
    finals += ev.finish != FinishReason::kNone;
  };
  absl::StatusOr<int64_t> id = e->Submit(std::move(r));
  ASSERT_TRUE(id.ok());
  const absl::Time until = absl::Now() + absl::Seconds(120);
  while (absl::Now() < until) {
    {
      MutexLock lock(&mu);
      if (tokens >= 9) break;
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  e->Cancel(*id);
  while (absl::Now() < until) {
    {
      MutexLock lock(&mu);
      if (finals == 3) break;
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  e->Stop();
  MutexLock lock(&mu);
  EXPECT_EQ(finals, 3);
  for (int c = 0; c < 3; ++c) EXPECT_EQ(out.finish[c], FinishReason::kCancelled);
  ExpectAllFree(*e);
}

// A migrated request's choices (DecodeRequest::continued_choices): each its own sequence over the
// prompt plus its tokens, under one id. Greedy in fp32 each goes on exactly as the uninterrupted
// choice did, for what is left of its max_tokens; a sampled one keeps its seed + choice.
TEST_F(DecodeChoicesTest, ContinuedChoicesGoOnFromTheirOwnTokens) {
  auto e = NewEngine();
  ASSERT_NE(e, nullptr);
  const std::vector<int32_t> prompt = RandomPrompt(19, 3);
  Choices whole;
  ASSERT_TRUE(e->Submit(Request(prompt, 3, 12, &whole)).ok());
  ASSERT_TRUE(e->RunUntilIdle().ok());
  ASSERT_EQ(whole.tokens[2].size(), 12u);
  auto first = [&](int c, int k) {
    return std::vector<int32_t>(whole.tokens[c].begin(), whole.tokens[c].begin() + k);
  };
  auto rest = [&](int c, int k) {
    return std::vector<int32_t>(whole.tokens[c].begin() + k, whole.tokens[c].end());
  };
  // Choice 0 ended on the dead worker; 1 streamed 5 tokens, 2 streamed 9.
  Choices moved;
  DecodeRequest r = Request(prompt, 1, 0, &moved);
  r.continued_choices = {{1, first(1, 5), 7, 0}, {2, first(2, 9), 3, 0}};
  ASSERT_TRUE(e->Submit(std::move(r)).ok());
  ASSERT_TRUE(e->RunUntilIdle().ok());
  EXPECT_EQ(moved.tokens.count(0), 0u);
  EXPECT_EQ(moved.tokens[1], rest(1, 5));
  EXPECT_EQ(moved.tokens[2], rest(2, 9));
  for (int c : {1, 2}) {
    EXPECT_EQ(moved.finals[c], 1) << c;
    EXPECT_EQ(moved.finish[c], FinishReason::kLength) << c;
  }

  // Sampled: a choice moved before its first token draws what it would have drawn.
  Choices sampled, again;
  r = Request(prompt, 3, 8, &sampled);
  r.sampling.temperature = 1.0f;
  r.sampling.seed = 77;
  ASSERT_TRUE(e->Submit(std::move(r)).ok());
  ASSERT_TRUE(e->RunUntilIdle().ok());
  r = Request(prompt, 1, 0, &again);
  r.sampling.temperature = 1.0f;
  r.sampling.seed = 77;
  r.continued_choices = {{2, {}, 8, 0}};
  ASSERT_TRUE(e->Submit(std::move(r)).ok());
  ASSERT_TRUE(e->RunUntilIdle().ok());
  EXPECT_EQ(again.tokens[2], sampled.tokens[2]);

  // The id Submit returned cancels every one of them.
  Choices cancelled;
  r = Request(prompt, 1, 0, &cancelled);
  r.continued_choices = {{0, first(0, 2), 10, 0}, {1, first(1, 3), 9, 0}};
  absl::StatusOr<int64_t> id = e->Submit(std::move(r));
  ASSERT_TRUE(id.ok());
  e->Cancel(*id);
  ASSERT_TRUE(e->RunUntilIdle().ok());
  for (int c : {0, 1}) {
    EXPECT_EQ(cancelled.finals[c], 1) << c;
    EXPECT_EQ(cancelled.finish[c], FinishReason::kCancelled) << c;
  }
  ExpectAllFree(*e);
}

TEST_F(DecodeChoicesTest, RejectsBadContinuedChoices) {
  auto e = NewEngine();
  ASSERT_NE(e, nullptr);
  Choices out;
  auto with = [&](std::vector<ContinuedChoice> cs, int n = 1) {
    DecodeRequest r = Request(RandomPrompt(5, 1), n, 0, &out);
    r.continued_choices = std::move(cs);
    return e->Submit(std::move(r)).status().code();
  };
  const absl::StatusCode bad = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(with({{0, {}, 4, 0}, {1, {3}, 4, 0}}), absl::StatusCode::kOk);
  ASSERT_TRUE(e->RunUntilIdle().ok());
  EXPECT_EQ(with({{0, {}, 4, 0}}, 2), bad);               // n is the choices'
  EXPECT_EQ(with({{1, {}, 4, 0}, {1, {3}, 4, 0}}), bad);  // twice
  EXPECT_EQ(with({{kMaxChoices, {}, 4, 0}}), bad);        // no such choice
  EXPECT_EQ(with({{0, {3}, 0, 0}}), bad);                 // nothing left to generate
  EXPECT_EQ(with({{0, {3}, 2, 3}}), bad);                 // min_tokens past max_tokens
  EXPECT_EQ(with({{0, {1 << 30}, 2, 0}}), bad);           // outside the vocabulary
  ExpectAllFree(*e);
}

TEST_F(DecodeChoicesTest, RejectsBadCounts) {
  auto e = NewEngine();
  ASSERT_NE(e, nullptr);
  Choices out;
  for (int n : {0, -1, kMaxChoices + 1}) {
    EXPECT_EQ(e->Submit(Request(RandomPrompt(5, 1), n, 4, &out)).status().code(),
              absl::StatusCode::kInvalidArgument)
        << n;
  }
  DecodeRequest r = Request(RandomPrompt(5, 1), 2, 4, &out);
  r.continuation = true;
  EXPECT_FALSE(e->Submit(std::move(r)).ok());
}

}  // namespace
}  // namespace tripod
