// PopConfig: the default and ratio skip sets, explicit lists, and the configs it rejects.
#include "prefill_node/pop_config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace tripod {
namespace {

std::vector<int> Range(int a, int b) {  // [a, b)
  std::vector<int> v;
  for (int l = a; l < b; ++l) v.push_back(l);
  return v;
}

TEST(PopConfigTest, DefaultSkipsTheLastThird) {
  EXPECT_EQ(*SkippedLayers(PopConfig{}, 30), Range(20, 30));
  EXPECT_EQ(*SkippedLayers(PopConfig{}, 32), Range(22, 32));  // Llama-3.1-8B: 10 of 32
  EXPECT_EQ(*SkippedLayers(PopConfig{}, 2), Range(2, 2));     // floor(2/3) = 0
}

TEST(PopConfigTest, RatiosTakeTheFloorOfTheTail) {
  auto skipped = [](double r) { return SkippedLayers(PopConfig{r, std::nullopt}, 30)->size(); };
  EXPECT_EQ(skipped(0), 0u);
  EXPECT_EQ(skipped(0.2), 6u);
  EXPECT_EQ(skipped(0.25), 7u);
  EXPECT_EQ(skipped(0.4), 12u);
  EXPECT_EQ(skipped(0.5), 15u);
  EXPECT_EQ(skipped(0.99), 29u);  // layer 0 always kept
  EXPECT_EQ(*SkippedLayers(PopConfig{0.2, std::nullopt}, 30), Range(24, 30));
}

TEST(PopConfigTest, ExplicitListsAreSortedAndMayBeAnywhereButLayerZero) {
  PopConfig c;
  c.layers = std::vector<int>{29, 3, 15};
  EXPECT_EQ(*SkippedLayers(c, 30), (std::vector<int>{3, 15, 29}));
  c.layers = std::vector<int>{};
  EXPECT_TRUE(SkippedLayers(c, 30)->empty());
}

TEST(PopConfigTest, RejectsBadConfigs) {
  for (double r : {-0.1, 1.0, 1.5, std::nan("")}) {
    const auto s = SkippedLayers(PopConfig{r, std::nullopt}, 30);
    EXPECT_FALSE(s.ok()) << r;
    EXPECT_NE(s.status().message().find("ratio"), absl::string_view::npos) << s.status();
  }
  PopConfig c;
  c.layers = std::vector<int>{20, 30};
  EXPECT_NE(SkippedLayers(c, 30).status().message().find("outside"), absl::string_view::npos);
  c.layers = std::vector<int>{-1};
  EXPECT_FALSE(SkippedLayers(c, 30).ok());
  c.layers = std::vector<int>{21, 20, 21};
  EXPECT_NE(SkippedLayers(c, 30).status().message().find("twice"), absl::string_view::npos);
  c.layers = std::vector<int>{0, 1};
  EXPECT_NE(SkippedLayers(c, 30).status().message().find("layer 0"), absl::string_view::npos);
  EXPECT_FALSE(SkippedLayers(PopConfig{}, 0).ok());
}

TEST(PopConfigTest, ParsesFlags) {
  EXPECT_NEAR(ParsePopConfig("1/3", "")->ratio, 1.0 / 3, 1e-12);
  EXPECT_DOUBLE_EQ(ParsePopConfig("0.25", "")->ratio, 0.25);
  EXPECT_FALSE(ParsePopConfig("", "")->layers.has_value());
  EXPECT_EQ(*ParsePopConfig("", "20-22,25")->layers, (std::vector<int>{20, 21, 22, 25}));
  EXPECT_TRUE(ParsePopConfig("", "none")->layers->empty());
  EXPECT_EQ(*SkippedLayers(*ParsePopConfig("1/3", ""), 30), Range(20, 30));
}

TEST(PopConfigTest, RejectsBadFlags) {
  EXPECT_FALSE(ParsePopConfig("0.3", "20-29").ok());  // both
  EXPECT_FALSE(ParsePopConfig("abc", "").ok());
  EXPECT_FALSE(ParsePopConfig("1/0", "").ok());
  EXPECT_FALSE(ParsePopConfig("1/2/3", "").ok());
  EXPECT_FALSE(ParsePopConfig("", "29-20").ok());
  EXPECT_FALSE(ParsePopConfig("", "20,x").ok());
  EXPECT_FALSE(ParsePopConfig("", "-3").ok());
}

TEST(PopConfigTest, Describes) {
  EXPECT_EQ(DescribeSkipped(Range(20, 30), 30), "skipped layers 20-29 (10 of 30)");
  EXPECT_EQ(DescribeSkipped({3, 5, 6}, 30), "skipped layers 3,5-6 (3 of 30)");
  EXPECT_EQ(DescribeSkipped({}, 30), "skipped layers none (0 of 30)");
}

}  // namespace
}  // namespace tripod
