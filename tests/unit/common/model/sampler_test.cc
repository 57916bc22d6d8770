// Tests of the sampler: draw statistics against known distributions, what top-k / top-p / min-p
// exclude, penalty arithmetic, greedy ties, logprobs, determinism and parameter validation.
#include "common/model/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tripod {
namespace {

using ::testing::HasSubstr;

constexpr int kDraws = 20000;

std::vector<float> LogitsFromProbs(const std::vector<double>& probs, float offset = 1.7f) {
  std::vector<float> logits;
  for (double p : probs) logits.push_back(static_cast<float>(std::log(p)) + offset);
  return logits;
}

std::vector<int> DrawCounts(const SamplingParams& params, const std::vector<float>& logits,
                            int draws = kDraws) {
  Sampler sampler(params, static_cast<int32_t>(logits.size()));
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < draws; ++i) {
    const SampledToken t = sampler.Sample(logits, {});
    EXPECT_GE(t.id, 0);
    EXPECT_LT(t.id, static_cast<int32_t>(logits.size()));
    if (t.id >= 0 && t.id < static_cast<int32_t>(logits.size())) ++counts[t.id];
  }
  return counts;
}

// Each empirical frequency within 5 standard errors of the expected probability (about 0.018
// at p = 0.5 with 20000 draws): loose enough never to flake with a fixed seed, tight enough
// that a wrong temperature, cut or renormalisation fails.
void ExpectFrequencies(const std::vector<int>& counts, const std::vector<double>& expected,
                       int draws = kDraws) {
  ASSERT_EQ(counts.size(), expected.size());
  for (size_t i = 0; i < counts.size(); ++i) {
    const double f = static_cast<double>(counts[i]) / draws;
    const double p = expected[i];
    if (p == 0.0) {
      EXPECT_EQ(counts[i], 0) << "id " << i << " must never be sampled";
    } else {
      const double se = std::sqrt(p * (1.0 - p) / draws);
      EXPECT_NEAR(f, p, 5.0 * se + 1e-4) << "id " << i;
    }
  }
}

std::vector<double> Normalize(std::vector<double> w) {
  const double s = std::accumulate(w.begin(), w.end(), 0.0);
  for (double& x : w) x /= s;
  return w;
}

TEST(SamplerTest, DrawsFollowTheSoftmax) {
  const std::vector<double> probs = {0.5, 0.25, 0.15, 0.1};
  SamplingParams params;
  params.seed = 1234;
  ExpectFrequencies(DrawCounts(params, LogitsFromProbs(probs)), probs);
}

TEST(SamplerTest, TemperatureSharpensAndFlattens) {
  const std::vector<double> probs = {0.5, 0.25, 0.15, 0.1};
  SamplingParams params;
  params.seed = 7;
  params.temperature = 0.5f;  // p^(1/T) = p^2
  std::vector<double> sharp;
  for (double p : probs) sharp.push_back(p * p);
  ExpectFrequencies(DrawCounts(params, LogitsFromProbs(probs)), Normalize(sharp));

  params.temperature = 2.0f;  // p^(1/2)
  std::vector<double> flat;
  for (double p : probs) flat.push_back(std::sqrt(p));
  ExpectFrequencies(DrawCounts(params, LogitsFromProbs(probs)), Normalize(flat));
}

TEST(SamplerTest, TopKKeepsOnlyTheKBest) {
  const std::vector<double> probs = {0.1, 0.4, 0.05, 0.3, 0.15};
  SamplingParams params;
  params.seed = 99;
  params.top_k = 2;
  ExpectFrequencies(DrawCounts(params, LogitsFromProbs(probs)),
                    Normalize({0.0, 0.4, 0.0, 0.3, 0.0}));
  params.top_k = 1;  // top-k 1 is greedy
  ExpectFrequencies(DrawCounts(params, LogitsFromProbs(probs), 500), {0, 1, 0, 0, 0}, 500);
  params.top_k = 100;  // larger than the vocabulary: no cut
  ExpectFrequencies(DrawCounts(params, LogitsFromProbs(probs)), probs);
}

TEST(SamplerTest, TopPKeepsTheSmallestPrefixReachingP) {
  const std::vector<double> probs = {0.2, 0.4, 0.1, 0.3};
  SamplingParams params;
  params.seed = 5;
  params.top_p = 0.65f;  // 0.4 + 0.3 = 0.7 >= 0.65
  ExpectFrequencies(DrawCounts(params, LogitsFromProbs(probs)), Normalize({0, 0.4, 0, 0.3}));
  params.top_p = 0.35f;  // 0.4 alone suffices
  ExpectFrequencies(DrawCounts(params, LogitsFromProbs(probs), 500), {0, 1, 0, 0}, 500);
  params.top_p = 0.95f;  // needs 0.4 + 0.3 + 0.2 = 0.9 < 0.95, so all four
  ExpectFrequencies(DrawCounts(params, LogitsFromProbs(probs)), probs);
}

TEST(SamplerTest, TopPOnALargeVocabularyMatchesAFullSort) {
  // A long-tailed distribution over a real vocabulary size, in shuffled order, so the cut lies
  // beyond the first partial sort and the widening path runs.
  const int vocab = 49152;
  std::mt19937 gen(42);
  std::vector<float> logits(vocab);
  for (int i = 0; i < vocab; ++i) logits[i] = -0.002f * static_cast<float>(i);
  std::shuffle(logits.begin(), logits.end(), gen);
  const float top_p = 0.6f;

  // Expected kept set, by a plain full sort.
  std::vector<int> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  double total = 0.0;
  for (float l : logits) total += std::exp(static_cast<double>(l));
  std::set<int> kept;
  double acc = 0.0;
  for (int id : order) {
    kept.insert(id);
    acc += std::exp(static_cast<double>(logits[id]));
    if (acc >= top_p * total) break;
  }
  ASSERT_GT(kept.size(), 256u);  // exercises more than one widening step
  ASSERT_LT(kept.size(), static_cast<size_t>(vocab / 2));

  SamplingParams params;
  params.seed = 11;
  params.top_p = top_p;
  Sampler sampler(params, vocab);
  int in_better_half = 0;
  for (int i = 0; i < 2000; ++i) {
    const int32_t id = sampler.Sample(logits, {}).id;
    ASSERT_TRUE(kept.count(id)) << "sampled excluded id " << id;
    if (logits[id] > logits[order[kept.size() / 2]]) ++in_better_half;
  }
  // Mass is skewed to the head of the kept set: most draws come from its better half.
  EXPECT_GT(in_better_half, 1000);
}

TEST(SamplerTest, MinPDropsTokensBelowAFractionOfTheBest) {
  const std::vector<double> probs = {0.5, 0.3, 0.12, 0.08};
  SamplingParams params;
  params.seed = 3;
  params.min_p = 0.2f;  // keep p >= 0.1
  ExpectFrequencies(DrawCounts(params, LogitsFromProbs(probs)), Normalize({0.5, 0.3, 0.12, 0}));
  params.min_p = 1.0f;  // only the best
  ExpectFrequencies(DrawCounts(params, LogitsFromProbs(probs), 500), {1, 0, 0, 0}, 500);
}

TEST(SamplerTest, TruncationsComposeInOrderThenTemperature) {
  // top-k 3 keeps {0.3, 0.25, 0.2}; renormalised: 0.4, 0.333, 0.267; top-p 0.72 keeps the first
  // two (0.733); min-p 0.5 keeps both (0.333 >= 0.2); temperature 0.5 squares them.
  const std::vector<double> probs = {0.1, 0.3, 0.25, 0.2, 0.15};
  SamplingParams params;
  params.seed = 17;
  params.top_k = 3;
  params.top_p = 0.72f;
  params.min_p = 0.5f;
  params.temperature = 0.5f;
  ExpectFrequencies(DrawCounts(params, LogitsFromProbs(probs)),
                    Normalize({0, 0.3 * 0.3, 0.25 * 0.25, 0, 0}));
  // Temperature comes after top-p: at temperature 2 first, the three would be 0.367, 0.335,
  // 0.299 and top-p 0.72 would need all three; applied last, id 3 stays excluded.
  params.temperature = 2.0f;
  ExpectFrequencies(DrawCounts(params, LogitsFromProbs(probs)),
                    Normalize({0, std::sqrt(0.3), std::sqrt(0.25), 0, 0}));
}

TEST(SamplerTest, GreedyTakesTheArgmaxAndTheLowestIdOnTies) {
  SamplingParams params;
  params.temperature = 0.0f;
  Sampler sampler(params, 6);
  const std::vector<float> logits = {0.5f, 3.0f, -1.0f, 3.0f, 2.9f, NAN};
  for (int i = 0; i < 10; ++i) EXPECT_EQ(sampler.Sample(logits, {}).id, 1);
  const std::vector<float> nan_first = {NAN, -2.0f, -1.0f};
  EXPECT_EQ(sampler.Sample(nan_first, {}).id, 2);
}

TEST(SamplerTest, PenaltiesChangeLogitsAsDefined) {
  // history: prompt [0, 3], output [1, 1, 3]; output_start = 2.
  const std::vector<float> logits = {2.0f, -1.0f, 0.5f, 3.0f, 1.0f};
  const std::vector<int32_t> history = {0, 3, 1, 1, 3};
  SamplingParams params;
  params.temperature = 0.0f;
  params.repetition_penalty = 2.0f;
  params.presence_penalty = 0.5f;
  params.frequency_penalty = 0.25f;
  params.top_logprobs = 5;
  Sampler sampler(params, 5);
  const SampledToken t = sampler.Sample(logits, history, /*output_start=*/2);
  // id 0: seen in prompt only: 2/2 = 1.
  // id 1: -1*2 = -2, count 2: -2 - 0.25*2 - 0.5 = -3.
  // id 2: unseen: 0.5.   id 3: 3/2 = 1.5, count 1: 1.5 - 0.25 - 0.5 = 0.75.   id 4: 1.
  const std::vector<double> expected = {1.0, -3.0, 0.5, 0.75, 1.0};
  double lse = 0.0;
  for (double l : expected) lse += std::exp(l);
  lse = std::log(lse);
  ASSERT_EQ(t.top.size(), 5u);
  for (const TokenLogprob& e : t.top) {
    EXPECT_NEAR(e.logprob, expected[e.id] - lse, 1e-5) << "id " << e.id;
  }
  // Greedy sees the penalised logits: ids 0 and 4 tie at 1.0, the lower id wins.
  EXPECT_EQ(t.id, 0);
  EXPECT_EQ(t.top[0].id, 0);
  EXPECT_EQ(t.top[1].id, 4);

  // output_start = 0 counts the prompt for presence/frequency too: id 0 now has count 1.
  const SampledToken all = sampler.Sample(logits, history);
  EXPECT_EQ(all.id, 4);

  // The penalty buffers are cleared between calls: no history, no penalty.
  const SampledToken none = sampler.Sample(logits, {});
  EXPECT_EQ(none.id, 3);
  // Ids outside the vocabulary in the history are ignored.
  const std::vector<int32_t> bad = {-1, 5, 1000000};
  EXPECT_EQ(sampler.Sample(logits, bad).id, 3);
}

TEST(SamplerTest, LogitBiasComesFirstAndShowsInTheLogprobs) {
  const std::vector<float> logits = {2.0f, -1.0f, 0.5f, 3.0f, 1.0f};
  SamplingParams params;
  params.temperature = 0.0f;
  params.top_logprobs = 5;
  params.logit_bias = {{1, 4.5f}, {3, -100.0f}, {9, 100.0f}};  // 9: past the vocabulary
  Sampler sampler(params, 5);
  const SampledToken t = sampler.Sample(logits, {});
  const std::vector<double> expected = {2.0, 3.5, 0.5, -97.0, 1.0};
  double lse = 0.0;
  for (double l : expected) lse += std::exp(l);
  lse = std::log(lse);
  EXPECT_EQ(t.id, 1);
  ASSERT_EQ(t.top.size(), 5u);
  for (const TokenLogprob& e : t.top) {
    EXPECT_NEAR(e.logprob, expected[e.id] - lse, 1e-4) << "id " << e.id;
  }
  // Then the penalties: the biased token, repeated, is penalised from its biased logit.
  params.repetition_penalty = 2.0f;
  Sampler penalised(params, 5);
  const std::vector<int32_t> history = {1};
  EXPECT_EQ(penalised.Sample(logits, history).id, 0);  // 3.5 / 2 = 1.75 < 2
  // +100 on a sampled draw: that token, whatever the seed.
  SamplingParams draw;
  draw.temperature = 1.0f;
  draw.logit_bias = {{2, 100.0f}};
  for (uint64_t seed = 0; seed < 20; ++seed) {
    draw.seed = seed;
    Sampler s(draw, 5);
    EXPECT_EQ(s.Sample(logits, {}).id, 2);
  }
}

TEST(SamplerTest, SuppressedIdsAreNeverDrawn) {
  const std::vector<float> logits = {2.0f, -1.0f, 0.5f, 3.0f, 1.0f};
  SamplingParams params;
  params.temperature = 0.0f;
  params.logit_bias = {{1, 100.0f}};
  Sampler greedy(params, 5);
  const std::vector<int32_t> held = {1, 3, 7};  // 7: past the vocabulary, ignored
  EXPECT_EQ(greedy.Sample(logits, {}).id, 1);
  EXPECT_EQ(greedy.Sample(logits, {}, 0, held).id, 0);
  params.temperature = 1.5f;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    params.seed = seed;
    Sampler s(params, 5);
    const int32_t id = s.Sample(logits, {}, 0, held).id;
    EXPECT_TRUE(id == 0 || id == 2 || id == 4) << id;
  }
}

TEST(SamplerTest, NegativePresencePenaltyEncouragesRepeats) {
  const std::vector<float> logits = {1.0f, 0.0f};
  SamplingParams params;
  params.temperature = 0.0f;
  params.presence_penalty = -2.0f;
  Sampler sampler(params, 2);
  const std::vector<int32_t> history = {1};
  EXPECT_EQ(sampler.Sample(logits, history).id, 1);
}

TEST(SamplerTest, LogprobsAreALogSoftmaxOfTheUntemperedLogits) {
  const int vocab = 20;
  std::vector<float> logits(vocab);
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (float& l : logits) l = normal(gen);
  SamplingParams params;
  params.seed = 8;
  params.temperature = 0.3f;  // must not change the reported log-probs
  params.top_k = 3;           // nor must truncation
  params.top_logprobs = SamplingParams::kMaxTopLogprobs;
  Sampler sampler(params, vocab);
  const SampledToken t = sampler.Sample(logits, {});
  ASSERT_EQ(t.top.size(), 20u);
  double mass = 0.0;
  for (size_t i = 0; i < t.top.size(); ++i) {
    mass += std::exp(static_cast<double>(t.top[i].logprob));
    if (i > 0) {
      EXPECT_GE(t.top[i - 1].logprob, t.top[i].logprob);
    }
    EXPECT_NEAR(t.top[i].logprob - t.top[0].logprob, logits[t.top[i].id] - logits[t.top[0].id],
                1e-4);
  }
  EXPECT_NEAR(mass, 1.0, 1e-5);
  const auto chosen =
      std::find_if(t.top.begin(), t.top.end(), [&](const TokenLogprob& e) { return e.id == t.id; });
  ASSERT_NE(chosen, t.top.end());
  EXPECT_FLOAT_EQ(chosen->logprob, t.logprob);
  // The chosen token is among the top 3.
  EXPECT_LT(chosen - t.top.begin(), 3);

  params.top_logprobs = 0;
  Sampler plain(params, vocab);
  EXPECT_TRUE(plain.Sample(logits, {}).top.empty());
}

TEST(SamplerTest, SameSeedSameTokensOtherSeedOtherTokens) {
  std::vector<float> logits(1000);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(static_cast<float>(i));
  SamplingParams params;
  params.seed = 2024;
  params.top_p = 0.9f;
  params.top_k = 200;
  auto run = [&](uint64_t seed) {
    SamplingParams p = params;
    p.seed = seed;
    Sampler s(p, 1000);
    std::vector<int32_t> ids;
    for (int i = 0; i < 64; ++i) ids.push_back(s.Sample(logits, ids).id);
    return ids;
  };
  EXPECT_EQ(run(2024), run(2024));
  EXPECT_NE(run(2024), run(2025));
}

TEST(SamplerTest, DegenerateInputs) {
  SamplingParams params;
  params.seed = 1;
  params.top_logprobs = 2;
  Sampler sampler(params, 4);
  EXPECT_EQ(sampler.Sample({}, {}).id, -1);
  // Everything impossible: treated as uniform, still a valid id.
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> none = {-inf, -inf, NAN, -inf};
  std::set<int32_t> seen;
  for (int i = 0; i < 200; ++i) seen.insert(sampler.Sample(none, {}).id);
  EXPECT_EQ(seen.size(), 4u);
  // +inf dominates without producing NaN log-probs.
  const std::vector<float> pos_inf = {0.0f, inf, 1.0f, 2.0f};
  const SampledToken t = sampler.Sample(pos_inf, {});
  EXPECT_EQ(t.id, 1);
  EXPECT_FALSE(std::isnan(t.logprob));
  EXPECT_NEAR(t.logprob, 0.0f, 1e-6);
}

TEST(SamplerTest, ValidateRejectsOutOfRangeParameters) {
  EXPECT_TRUE(SamplingParams{}.Validate().ok());
  auto error_of = [](auto mutate) {
    SamplingParams p;
    mutate(p);
    return std::string(p.Validate().message());
  };
  EXPECT_THAT(error_of([](SamplingParams& p) { p.temperature = -0.1f; }), HasSubstr("temperature"));
  EXPECT_THAT(error_of([](SamplingParams& p) { p.temperature = NAN; }), HasSubstr("temperature"));
  EXPECT_THAT(error_of([](SamplingParams& p) { p.top_k = -1; }), HasSubstr("top_k"));
  EXPECT_THAT(error_of([](SamplingParams& p) { p.top_p = 0.0f; }), HasSubstr("top_p"));
  EXPECT_THAT(error_of([](SamplingParams& p) { p.top_p = 1.5f; }), HasSubstr("top_p"));
  EXPECT_THAT(error_of([](SamplingParams& p) { p.min_p = -0.5f; }), HasSubstr("min_p"));
  EXPECT_THAT(error_of([](SamplingParams& p) { p.repetition_penalty = 0.0f; }),
              HasSubstr("repetition_penalty"));
  EXPECT_THAT(error_of([](SamplingParams& p) { p.presence_penalty = 2.5f; }),
              HasSubstr("presence_penalty"));
  EXPECT_THAT(error_of([](SamplingParams& p) { p.frequency_penalty = -3.0f; }),
              HasSubstr("frequency_penalty"));
  EXPECT_THAT(error_of([](SamplingParams& p) { p.top_logprobs = 21; }), HasSubstr("top_logprobs"));
  EXPECT_THAT(error_of([](SamplingParams& p) {
                p.logit_bias = {{3, 100.5f}};
              }),
              HasSubstr("logit_bias"));
  EXPECT_THAT(error_of([](SamplingParams& p) {
                p.logit_bias = {{3, NAN}};
              }),
              HasSubstr("logit_bias"));
  EXPECT_THAT(error_of([](SamplingParams& p) {
                p.logit_bias = {{-1, 1.0f}};
              }),
              HasSubstr("logit_bias"));
  EXPECT_THAT(error_of([](SamplingParams& p) {
                p.logit_bias = {{5, 1.0f}, {5, 2.0f}};
              }),
              HasSubstr("sorted"));
  EXPECT_THAT(error_of([](SamplingParams& p) {
                p.logit_bias.resize(SamplingParams::kMaxLogitBias + 1);
                for (size_t i = 0; i < p.logit_bias.size(); ++i) {
                  p.logit_bias[i] = {static_cast<int32_t>(i), 1.0f};
                }
              }),
              HasSubstr("at most"));
  SamplingParams edges;
  edges.temperature = 0.0f;
  edges.top_p = 1.0f;
  edges.min_p = 1.0f;
  edges.presence_penalty = -2.0f;
  edges.frequency_penalty = 2.0f;
  edges.top_logprobs = 20;
  edges.logit_bias = {{0, -100.0f}, {7, 100.0f}};
  EXPECT_TRUE(edges.Validate().ok());
  SamplingParams bad;
  bad.top_p = 2.0f;
  EXPECT_EQ(bad.Validate().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SamplerTest, UnvalidatedParametersAreClampedNotFatal) {
  SamplingParams params;
  params.temperature = -1.0f;  // clamps to greedy
  params.top_p = 7.0f;
  params.top_k = -5;
  params.top_logprobs = 100;
  Sampler sampler(params, 3);
  const std::vector<float> logits = {0.0f, 1.0f, 0.5f};
  const SampledToken t = sampler.Sample(logits, {});
  EXPECT_EQ(t.id, 1);
  EXPECT_EQ(t.top.size(), 3u);
}

}  // namespace
}  // namespace tripod
