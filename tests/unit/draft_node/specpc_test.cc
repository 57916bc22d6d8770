// SpecPC's selection steps (docs/algorithms.md, "SpecPC") on hand-made scores, where the kept set
// can be worked out by hand, and the exactness switch: a budget at or above the prompt keeps
// everything.
#include "draft_node/specpc.h"

#include <vector>

#include "gtest/gtest.h"

namespace tripod {
namespace {

TEST(SpecPcTest, MaxPoolIsCentredAndClamped) {
  const std::vector<float> s = {0, 0, 5, 0, 0, 0, 1, 0};
  // Kernel 3: each position sees itself and one neighbour on each side.
  EXPECT_EQ(MaxPool1d(s, 3), (std::vector<float>{0, 5, 5, 5, 0, 1, 1, 1}));
  // Kernel 4 (even): one to the left, two to the right.
  EXPECT_EQ(MaxPool1d(s, 4), (std::vector<float>{5, 5, 5, 5, 1, 1, 1, 1}));
  EXPECT_EQ(MaxPool1d(s, 1), s);
}

TEST(SpecPcTest, SeedsWithNeighbourhoodsAfterTheWindow) {
  // 20 positions; the window is the last 2 (18, 19); seeds in score order 5 (0.9), 12 (0.8).
  std::vector<float> s(20, 0.0f);
  s[5] = 0.9f;
  s[12] = 0.8f;
  SpecPcParams p;
  p.window = 2;
  p.neighbourhood = 3;  // delta in [-1, 1], nearest first
  p.budget = 5;
  // Window {18, 19}, then seed 5: 5, 4, 6 -> 5 kept.
  EXPECT_EQ(SpecPcSelect(s, p), (std::vector<int32_t>{4, 5, 6, 18, 19}));
  p.budget = 7;
  // Then seed 12: 12, 11 (13 truncated away).
  EXPECT_EQ(SpecPcSelect(s, p), (std::vector<int32_t>{4, 5, 6, 11, 12, 18, 19}));
  p.budget = 8;
  EXPECT_EQ(SpecPcSelect(s, p), (std::vector<int32_t>{4, 5, 6, 11, 12, 13, 18, 19}));
}

TEST(SpecPcTest, NeighboursClampAtTheEdgesAndRepeatsDrop) {
  std::vector<float> s(10, 0.0f);
  s[0] = 1.0f;  // neighbours clamp to 0: repeats drop
  s[1] = 0.5f;
  SpecPcParams p;
  p.window = 1;
  p.neighbourhood = 5;  // delta in [-2, 2]
  p.budget = 4;
  // Window {9}; seed 0: 0, (clamped 0), 1, (0), 2 -> {9, 0, 1, 2}.
  EXPECT_EQ(SpecPcSelect(s, p), (std::vector<int32_t>{0, 1, 2, 9}));
}

TEST(SpecPcTest, BudgetBelowTheWindowKeepsThePromptsEnd) {
  std::vector<float> s(20, 0.0f);
  s[2] = 1.0f;  // a strong seed, but the window alone overfills the budget
  SpecPcParams p;
  p.window = 8;
  p.budget = 3;
  // The window's latest positions first: the last token is always kept.
  EXPECT_EQ(SpecPcSelect(s, p), (std::vector<int32_t>{17, 18, 19}));
}

TEST(SpecPcTest, BudgetAtOrAboveThePromptKeepsEveryPosition) {
  std::vector<float> s = {0.1f, 0.4f, 0.2f, 0.3f};
  SpecPcParams p;
  p.window = 2;
  for (int budget : {4, 5, 1000}) {
    p.budget = budget;
    EXPECT_EQ(SpecPcSelect(s, p), (std::vector<int32_t>{0, 1, 2, 3})) << budget;
  }
  p.budget = 0;
  EXPECT_TRUE(SpecPcSelect(s, p).empty());
}

TEST(SpecPcTest, TokenScoresTakeTheMaxFromTheFirstScoredLayer) {
  CapturedAttention att;
  att.n_layers = 3;
  att.n_kv_heads = 2;
  att.n_keys = 4;
  att.max.assign(3 * 2 * 4, 0.0f);
  att.max[(0 * 2 + 0) * 4 + 0] = 0.9f;  // layer 0: below l_0 = 1, ignored
  att.max[(1 * 2 + 1) * 4 + 1] = 0.5f;
  att.max[(2 * 2 + 0) * 4 + 1] = 0.7f;
  att.max[(2 * 2 + 1) * 4 + 3] = 0.2f;
  EXPECT_EQ(SpecPcTokenScores(att, 1), (std::vector<float>{0, 0.7f, 0, 0.2f}));
  EXPECT_EQ(SpecPcTokenScores(att, 0), (std::vector<float>{0.9f, 0.7f, 0, 0.2f}));
}

}  // namespace
}  // namespace tripod
