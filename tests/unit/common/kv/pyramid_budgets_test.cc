// PyramidKV's per-layer budgets: the total equals a uniform budget's, they fall from the bottom
// layer to the top, the top keeps about (C - w) / beta besides the window, and no layer keeps
// more than the prompt has.
#include "common/kv/pyramid_budgets.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

namespace tripod {
namespace {

TEST(PyramidBudgetsTest, SumToTheUniformBudgetAndFallFromBottomToTop) {
  for (int layers : {2, 7, 30, 32}) {
    for (int budget : {33, 64, 128, 257, 1000}) {
      const int window = 32, m = 4096;
      const std::vector<int> b = PyramidLayerBudgets(budget, window, layers, m);
      ASSERT_EQ(b.size(), static_cast<size_t>(layers));
      EXPECT_EQ(std::accumulate(b.begin(), b.end(), 0LL), 1LL * layers * budget)
          << layers << " " << budget;
      EXPECT_TRUE(std::is_sorted(b.rbegin(), b.rend())) << layers << " " << budget;
      const int lo = (budget - window) / kPyramidBeta;
      // The top layer: lo (+1 where rounding spread a remainder), never below the window.
      EXPECT_GE(b.back(), window + lo);
      EXPECT_LE(b.back(), window + lo + 1);
      EXPECT_LE(b.front(), window + 2 * (budget - window) - lo + 1);
      if (budget - window >= 2 * kPyramidBeta) {
        EXPECT_GT(b.front(), b.back());
      }
    }
  }
}

TEST(PyramidBudgetsTest, PaperExampleWithoutItsOvershoot) {
  // C = 256, w = 32, 30 layers: lo = 11, hi = 437. The paper's integer step (14) would keep
  // 266 on average; the exact fall keeps 256.
  const std::vector<int> b = PyramidLayerBudgets(256, 32, 30, 8192);
  EXPECT_GE(b.front(), 32 + 437);  // + 1 where the floors' remainder went
  EXPECT_LE(b.front(), 32 + 438);
  EXPECT_EQ(b.back(), 32 + 11);
  EXPECT_EQ(std::accumulate(b.begin(), b.end(), 0), 30 * 256);
}

TEST(PyramidBudgetsTest, NoLayerKeepsMoreThanThePromptHas) {
  // m = 100, w = 8, C = 80: hi would be 2 * 72 - 3 = 141 > the 92 positions outside the window.
  const std::vector<int> b = PyramidLayerBudgets(80, 8, 10, 100);
  for (int x : b) {
    EXPECT_LE(x, 100);
    EXPECT_GE(x, 8);
  }
  EXPECT_EQ(b.front(), 100);
  EXPECT_TRUE(std::is_sorted(b.rbegin(), b.rend()));
  // What the bottom layers could not take went to the next ones: the total still holds.
  EXPECT_EQ(std::accumulate(b.begin(), b.end(), 0), 10 * 80);
}

TEST(PyramidBudgetsTest, EdgeCases) {
  EXPECT_EQ(PyramidLayerBudgets(50, 8, 1, 100), std::vector<int>{50});
  EXPECT_EQ(PyramidLayerBudgets(8, 8, 4, 100), std::vector<int>(4, 8));  // window only
  const std::vector<int> b = PyramidLayerBudgets(10, 8, 4, 100);         // 2 per layer
  EXPECT_EQ(std::accumulate(b.begin(), b.end(), 0), 40);
}

}  // namespace
}  // namespace tripod
