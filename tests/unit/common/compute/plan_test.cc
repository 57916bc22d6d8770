// ForwardPlan builders.
#include "common/compute/plan.h"

#include <gtest/gtest.h>

namespace tripod {
namespace {

TEST(PlanTest, FullRunsEveryLayerWithHead) {
  const ForwardPlan p = ForwardPlan::Full(30);
  EXPECT_EQ(p.count(LayerMode::kFull), 30);
  EXPECT_TRUE(p.output_head);
  EXPECT_EQ(p.DebugString(), "F30 head");
}

TEST(PlanTest, PopPrefillMarksSkippedLayersKvOnlyWithoutHead) {
  std::vector<int> skipped;
  for (int l = 20; l < 30; ++l) skipped.push_back(l);
  const ForwardPlan p = ForwardPlan::PopPrefill(30, skipped);
  EXPECT_EQ(p.count(LayerMode::kKvOnly), 10);
  EXPECT_EQ(p.layers[19], LayerMode::kFull);
  EXPECT_EQ(p.layers[20], LayerMode::kKvOnly);
  EXPECT_FALSE(p.output_head);
  EXPECT_EQ(p.DebugString(), "F20 K10");
}

TEST(PlanTest, SelfDraftSkipsDeepLayers) {
  const ForwardPlan p = ForwardPlan::SelfDraft(30, 8);
  EXPECT_EQ(p.count(LayerMode::kFull), 8);
  EXPECT_EQ(p.count(LayerMode::kSkip), 22);
  EXPECT_EQ(p.DebugString(), "F8 S22 head");
}

}  // namespace
}  // namespace tripod
