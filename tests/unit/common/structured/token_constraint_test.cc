// The token level of structured outputs on the bundled model's vocabulary: the trie walk's mask
// equals a brute-force check of every token's bytes against the automaton, end tokens come only
// in accepting states, the cache shares compiled constraints; and the masked sampler draws only
// allowed tokens, with log-probabilities of the masked distribution.
#include "common/structured/token_constraint.h"

#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "common/model/gguf.h"
#include "common/model/sampler.h"
#include "common/structured/constraint_cache.h"
#include "tests/unit/test_model.h"

namespace tripod::structured {
namespace {

const Tokenizer& TestTokenizer() {
  // Both kept for the tests' lifetime, each held by a static (so no leak is reported).
  static const GgufFile* file = [] {
    auto f = GgufFile::Open(TestModelPath());
    EXPECT_TRUE(f.ok()) << f.status();
    return f->release();
  }();
  static const Tokenizer* tok = [] {
    auto t = Tokenizer::FromGguf(*file);
    EXPECT_TRUE(t.ok()) << t.status();
    return t->release();
  }();
  return *tok;
}

std::shared_ptr<const VocabularyTrie> TestTrie() {
  static const auto trie = BuildVocabularyTrie(TestTokenizer());
  return trie;
}

TEST(VocabularyTrieTest, HoldsEveryTokenWithTextOnce) {
  const VocabularyTrie& t = *TestTrie();
  const Tokenizer& tok = TestTokenizer();
  EXPECT_EQ(t.vocab_size, tok.vocab_size());
  std::vector<int> seen(t.vocab_size, 0);
  for (int32_t id : t.tokens) ++seen[id];
  int with_text = 0;
  for (int32_t id = 0; id < t.vocab_size; ++id) {
    const bool has = !t.token_bytes[id].empty();
    with_text += has;
    EXPECT_EQ(seen[id], has ? 1 : 0) << id;
    if (tok.IsEndOfGeneration(id)) {
      EXPECT_FALSE(has) << "end token " << id << " has text";
    }
  }
  EXPECT_GT(with_text, t.vocab_size / 2);
  EXPECT_FALSE(t.end_ids.empty());
}

// The mask from the trie walk against every token walked through the DFA on its own.
TEST(TokenConstraintTest, MaskEqualsBruteForceInEveryReachedState) {
  for (const char* regex : {R"([0-9]+)", R"(\{"a": ?(true|false)\})", R"((yes|no|maybe))",
                            R"([^"\\]{0,20}")", R"(.*)", R"(héllo wörld)"}) {
    auto c = TokenConstraint::Compile(regex, TestTrie());
    ASSERT_TRUE(c.ok()) << regex << ": " << c.status();
    const ByteDfa& dfa = (*c)->dfa();
    const VocabularyTrie& t = *TestTrie();
    for (int32_t state = 0; state < std::min(dfa.num_states(), 12); ++state) {
      const TokenMask& m = (*c)->Mask(state);
      int allowed = 0;
      bool any_text = false;
      for (int32_t id = 0; id < t.vocab_size; ++id) {
        bool want;
        if (t.token_bytes[id].empty()) {
          want = false;
        } else {
          want = dfa.Walk(state, t.token_bytes[id]) >= 0;
          any_text |= want;
        }
        if (!t.token_bytes[id].empty()) {
          ASSERT_EQ(m.Allows(id), want) << regex << " state " << state << " token " << id;
        }
        allowed += want;
      }
      const bool ends = dfa.accepting[state] || !any_text;
      for (int32_t id : t.end_ids) EXPECT_EQ(m.Allows(id), ends) << regex << " state " << state;
      EXPECT_EQ(m.ends_only, !any_text);
      EXPECT_EQ(m.allowed, allowed + (ends ? static_cast<int>(t.end_ids.size()) : 0));
    }
  }
}

TEST(TokenConstraintTest, AdvanceFollowsTokenBytes) {
  auto c = TokenConstraint::Compile(R"(ab(cd)*)", TestTrie());
  ASSERT_TRUE(c.ok());
  const Tokenizer& tok = TestTokenizer();
  std::vector<int32_t> ids = tok.Encode("abcdcd");
  int32_t s = (*c)->start();
  for (int32_t id : ids) s = (*c)->Advance(s, id);
  EXPECT_TRUE((*c)->accepting(s));
  EXPECT_EQ((*c)->Advance(s, tok.end_of_generation_ids()[0]), ByteDfa::kDead);
}

// Past kMaxCachedMasks states the masks are walked each time, into scratch, and stay right.
TEST(TokenConstraintTest, MasksPastTheCacheCapStayCorrect) {
  auto c = TokenConstraint::Compile("a{1000}b{200}", TestTrie());
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_GT((*c)->dfa().num_states(), TokenConstraint::kMaxCachedMasks + 100);
  const VocabularyTrie& t = *TestTrie();
  int32_t a = -1, b = -1;
  for (int32_t id = 0; id < t.vocab_size; ++id) {
    if (t.token_bytes[id] == "a") a = id;
    if (t.token_bytes[id] == "b") b = id;
  }
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  int32_t s = (*c)->start();
  for (int i = 0; i < 1200; ++i) {
    const TokenMask& m = (*c)->Mask(s);
    const bool in_a = i < 1000;
    ASSERT_EQ(m.Allows(a), in_a) << i;
    ASSERT_EQ(m.Allows(b), !in_a) << i;
    s = (*c)->Advance(s, in_a ? a : b);
  }
  EXPECT_TRUE((*c)->accepting(s));
  EXPECT_TRUE((*c)->Mask(s).ends_only);
}

TEST(ConstraintCacheTest, SharesCompiledConstraintsAndRefusesBadOnes) {
  ConstraintCache cache(TestTokenizer(), /*capacity=*/2);
  auto a = cache.Get("a+");
  auto b = cache.Get("a+");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->get(), b->get());
  EXPECT_TRUE(cache.Get("b+").ok());
  EXPECT_TRUE(cache.Get("c+").ok());
  EXPECT_EQ(cache.size(), 2u);  // "a+" evicted, still alive with its holders
  EXPECT_TRUE((*a)->accepting((*a)->dfa().Walk((*a)->start(), "aaa")));
  auto bad = cache.Get("(a");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.Get("a(?=b)").status().code(), absl::StatusCode::kUnimplemented);
}

// Sequences on several threads share the cache and the constraints' masks (the decode engine
// samples in parallel; the service compiles on gRPC's threads).
TEST(ConstraintCacheTest, ConcurrentGetsAndMasksAgree) {
  ConstraintCache cache(TestTokenizer(), /*capacity=*/4);
  const std::vector<std::string> patterns = {R"([a-z]{1,12}@[a-z]+\.com)", R"((yes|no)!)",
                                             R"(\{"k": ?[0-9]{1,4}\})"};
  std::vector<std::vector<int>> allowed(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round) {
        for (const std::string& p : patterns) {
          auto c = cache.Get(p);
          ASSERT_TRUE(c.ok());
          const ByteDfa& dfa = (*c)->dfa();
          for (int32_t s = 0; s < dfa.num_states(); ++s) {
            if (round == 2) allowed[t].push_back((*c)->Mask(s).allowed);
            (*c)->Mask(s);
          }
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 1; t < 4; ++t) EXPECT_EQ(allowed[t], allowed[0]);
}

TEST(MaskedSamplerTest, DrawsOnlyAllowedTokensWithMaskedLogprobs) {
  const int32_t n = 1000;
  std::vector<float> logits(n);  // spread over [-6, 6], in no order
  for (int32_t i = 0; i < n; ++i) logits[i] = 6.0f * std::sin(0.37f * i * i + 1.3f * i);
  std::vector<uint64_t> mask((n + 63) / 64, 0);
  const std::vector<int32_t> allowed = {3, 64, 65, 500, 999};
  for (int32_t id : allowed) mask[id / 64] |= uint64_t{1} << (id % 64);
  for (float temperature : {0.0f, 1.0f, 0.7f}) {
    SamplingParams p;
    p.temperature = temperature;
    p.top_logprobs = 5;
    p.seed = 11;
    Sampler s(p, n);
    for (int i = 0; i < 50; ++i) {
      SampledToken t = s.Sample(logits, {}, 0, {}, mask);
      EXPECT_NE(std::find(allowed.begin(), allowed.end(), t.id), allowed.end()) << t.id;
      double total = 0;
      for (const TokenLogprob& lp : t.top) {
        EXPECT_NE(std::find(allowed.begin(), allowed.end(), lp.id), allowed.end());
        total += std::exp(lp.logprob);
      }
      EXPECT_NEAR(total, 1.0, 1e-4);  // the five allowed tokens hold all the mass
    }
  }
  // Greedy picks the best allowed token; a mask that the suppression empties stays in the mask.
  SamplingParams greedy;
  greedy.temperature = 0;
  Sampler g(greedy, n);
  int32_t best = allowed[0];
  for (int32_t id : allowed) {
    if (logits[id] > logits[best]) best = id;
  }
  EXPECT_EQ(g.Sample(logits, {}, 0, {}, mask).id, best);
  const SampledToken t = g.Sample(logits, {}, 0, allowed, mask);
  EXPECT_NE(std::find(allowed.begin(), allowed.end(), t.id), allowed.end());
}

}  // namespace
}  // namespace tripod::structured
