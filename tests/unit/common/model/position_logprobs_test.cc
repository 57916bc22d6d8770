// LogprobsAt: the raw log-softmax at one position, the given token's rank and the top-k, against
// a direct computation; ties, NaN and a row with nothing possible.
#include "common/model/position_logprobs.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace tripod {
namespace {

TEST(PositionLogprobsTest, LogSoftmaxRankAndTop) {
  const std::vector<float> logits = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f};
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x));
  const double lse = std::log(sum);
  for (int32_t t = 0; t < 5; ++t) {
    const PositionLogprobs lp = LogprobsAt(logits, t, 3);
    EXPECT_NEAR(lp.logprob, logits[t] - lse, 1e-6) << t;
    ASSERT_EQ(lp.top.size(), 3u);
    // 3 and 3 tie: the lower id first.
    EXPECT_EQ(lp.top[0].id, 1);
    EXPECT_EQ(lp.top[1].id, 3);
    EXPECT_EQ(lp.top[2].id, 0);
    EXPECT_NEAR(lp.top[2].logprob, 1.0 - lse, 1e-6);
  }
  EXPECT_EQ(LogprobsAt(logits, 1, 0).rank, 1);
  EXPECT_EQ(LogprobsAt(logits, 3, 0).rank, 2);
  EXPECT_EQ(LogprobsAt(logits, 0, 0).rank, 3);
  EXPECT_EQ(LogprobsAt(logits, 2, 0).rank, 5);
  EXPECT_TRUE(LogprobsAt(logits, 2, 0).top.empty());
  EXPECT_EQ(LogprobsAt(logits, 2, 99).top.size(), 5u);  // clamped to the vocabulary
}

TEST(PositionLogprobsTest, NanIsImpossibleAndAllImpossibleIsUniform) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> logits = {0.0f, nan, 0.0f};
  EXPECT_NEAR(LogprobsAt(logits, 0, 0).logprob, std::log(0.5), 1e-6);
  EXPECT_EQ(LogprobsAt(logits, 1, 0).logprob, -inf);
  EXPECT_EQ(LogprobsAt(logits, 1, 0).rank, 3);
  const std::vector<float> none = {-inf, nan, -inf, -inf};
  EXPECT_NEAR(LogprobsAt(none, 2, 0).logprob, std::log(0.25), 1e-6);
}

}  // namespace
}  // namespace tripod
