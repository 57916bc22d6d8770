#include "scheduler/draft_methods.h"

#include <numeric>

#include "gtest/gtest.h"

namespace tripod::scheduler {
namespace {

std::vector<int32_t> Prompt(int n) {
  std::vector<int32_t> p(n);
  std::iota(p.begin(), p.end(), 100);  // token id = position + 100
  return p;
}

TEST(DraftMethodsTest, NamesRoundTrip) {
  for (DraftMethod m : {DraftMethod::kNone, DraftMethod::kSpecKv, DraftMethod::kSpecPc,
                        DraftMethod::kDraftMap, DraftMethod::kSnapKv, DraftMethod::kStreamingLlm,
                        DraftMethod::kPyramidKv, DraftMethod::kKeepLast}) {
    EXPECT_EQ(ParseDraftMethod(DraftMethodName(m)), m);
  }
  EXPECT_EQ(ParseDraftMethod(""), DraftMethod::kNone);
  EXPECT_EQ(ParseDraftMethod("SpecKV"), std::nullopt);
  EXPECT_TRUE(NeedsDraft(DraftMethod::kSpecKv));
  EXPECT_TRUE(NeedsDraft(DraftMethod::kDraftMap));
  EXPECT_FALSE(NeedsDraft(DraftMethod::kSnapKv));
  EXPECT_FALSE(TrimsKv(DraftMethod::kSpecPc));
  EXPECT_FALSE(TrimsKv(DraftMethod::kKeepLast));
  EXPECT_FALSE(NeedsDraft(DraftMethod::kKeepLast));
  EXPECT_TRUE(CompressesPrompt(DraftMethod::kKeepLast));
  EXPECT_TRUE(TrimsKv(DraftMethod::kStreamingLlm));
}

TEST(DraftMethodsTest, BudgetsResolveAgainstThePrompt) {
  EXPECT_EQ(ResolveBudget({DraftMethod::kSpecPc, 300, 0}, 1000, 0), 300);
  EXPECT_EQ(ResolveBudget({DraftMethod::kSpecPc, 0, 0.25}, 1000, 0), 250);
  EXPECT_EQ(ResolveBudget({DraftMethod::kSpecPc, 0, 0.125}, 1001, 0), 125);
  EXPECT_EQ(ResolveBudget({DraftMethod::kSpecPc, 0, 0.001}, 10, 0), 1);  // at least one token
  // The floor lifts a fraction, never past the prompt, and leaves a budget in tokens alone.
  EXPECT_EQ(ResolveBudget({DraftMethod::kSpecPc, 0, 0.25}, 1000, 512), 512);
  EXPECT_EQ(ResolveBudget({DraftMethod::kSpecPc, 0, 0.25}, 4096, 512), 1024);
  EXPECT_EQ(ResolveBudget({DraftMethod::kSpecKv, 0, 0.25}, 130, 512), 130);
  EXPECT_EQ(ResolveBudget({DraftMethod::kSpecKv, 64, 0}, 130, 512), 64);
  // SpecPC keeps prompt tokens (n), the KV methods KV entries (n - 1: the last is decode's).
  EXPECT_TRUE(BudgetKeepsAll(DraftMethod::kSpecPc, 100, 100));
  EXPECT_FALSE(BudgetKeepsAll(DraftMethod::kSpecPc, 99, 100));
  EXPECT_TRUE(BudgetKeepsAll(DraftMethod::kKeepLast, 100, 100));
  EXPECT_FALSE(BudgetKeepsAll(DraftMethod::kKeepLast, 99, 100));
  EXPECT_TRUE(BudgetKeepsAll(DraftMethod::kSpecKv, 99, 100));
  EXPECT_FALSE(BudgetKeepsAll(DraftMethod::kSnapKv, 98, 100));
}

TEST(DraftMethodsTest, ScoreRequestsAskWhatEachMethodNeeds) {
  const DraftMethodParams params;  // lookahead 64
  const std::vector<int32_t> prompt = Prompt(500);
  v1::ScoreRequest pc = ScoreRequestFor(DraftMethod::kSpecPc, 7, prompt, 100, 16, params);
  EXPECT_EQ(pc.request_id(), 7u);
  EXPECT_EQ(pc.prompt_size(), 500);
  EXPECT_EQ(pc.budget(), 100);
  EXPECT_EQ(pc.lookahead(), 0);
  // The draft map's last kept position is the last token, which it drops: one more asked.
  EXPECT_EQ(ScoreRequestFor(DraftMethod::kDraftMap, 7, prompt, 100, 16, params).budget(), 101);
  v1::ScoreRequest kv = ScoreRequestFor(DraftMethod::kSpecKv, 7, prompt, 100, 16, params);
  EXPECT_EQ(kv.budget(), 0);
  EXPECT_EQ(kv.lookahead(), 16);  // min(max_tokens, 64)
  EXPECT_EQ(ScoreRequestFor(DraftMethod::kSpecKv, 7, prompt, 100, 500, params).lookahead(), 64);
}

TEST(DraftMethodsTest, KeepLastKeepsThePromptsEndAsAPrompt) {
  const DraftMethodParams params;
  const AppliedMethod a = ApplyMethod(DraftMethod::kKeepLast, 3, Prompt(10), nullptr, params);
  EXPECT_TRUE(a.error.empty()) << a.error;
  EXPECT_EQ(a.prompt, (std::vector<int32_t>{107, 108, 109}));
  EXPECT_EQ(a.trimming.method(), v1::TRIM_NONE);
  EXPECT_EQ(a.kv_entries, 0);
}

TEST(DraftMethodsTest, SpecPcKeepsTheDraftsTokensInOrder) {
  const std::vector<int32_t> prompt = Prompt(10);
  v1::ImportanceMap map;
  for (int i : {0, 3, 4, 8, 9}) map.add_keep(i);
  AppliedMethod a = ApplyMethod(DraftMethod::kSpecPc, 5, prompt, &map, {});
  ASSERT_EQ(a.error, "");
  EXPECT_EQ(a.prompt, (std::vector<int32_t>{100, 103, 104, 108, 109}));
  EXPECT_EQ(a.trimming.method(), v1::TRIM_NONE);
  EXPECT_EQ(a.kv_entries, 0);

  // Malformed maps are refused (the request then runs without the method).
  for (const std::vector<int32_t>& keep : std::vector<std::vector<int32_t>>{
           {}, {0, 3, 3, 9}, {0, 10}, {0, 1, 2}, {5, 3, 9}, {0, 1, 2, 3, 4, 9}}) {
    v1::ImportanceMap bad;
    for (int i : keep) bad.add_keep(i);
    EXPECT_NE(ApplyMethod(DraftMethod::kSpecPc, 5, prompt, &bad, {}).error, "");
  }
}

TEST(DraftMethodsTest, DraftMapDropsTheLastPosition) {
  const std::vector<int32_t> prompt = Prompt(10);
  v1::ImportanceMap map;
  for (int i : {1, 2, 7, 9}) map.add_keep(i);
  AppliedMethod a = ApplyMethod(DraftMethod::kDraftMap, 3, prompt, &map, {});
  ASSERT_EQ(a.error, "");
  EXPECT_EQ(a.prompt, prompt);
  EXPECT_EQ(a.trimming.method(), v1::TRIM_DRAFTMAP);
  EXPECT_EQ(a.trimming.budget(), 3);
  EXPECT_EQ(std::vector<int32_t>(a.trimming.keep().begin(), a.trimming.keep().end()),
            (std::vector<int32_t>{1, 2, 7}));
  EXPECT_EQ(a.kv_entries, 3);
  // Fewer valid positions than the budget: refused.
  EXPECT_NE(ApplyMethod(DraftMethod::kDraftMap, 4, prompt, &map, {}).error, "");
}

TEST(DraftMethodsTest, TrimmingMethodsCarryTheirParameters) {
  const std::vector<int32_t> prompt = Prompt(400);
  v1::ImportanceMap map;
  for (int t : {5, 6, 7}) map.add_lookahead(t);
  DraftMethodParams params;
  params.trim_window = 32;
  AppliedMethod kv = ApplyMethod(DraftMethod::kSpecKv, 100, prompt, &map, params);
  ASSERT_EQ(kv.error, "");
  EXPECT_EQ(kv.trimming.method(), v1::TRIM_SPECKV);
  EXPECT_EQ(kv.trimming.budget(), 100);
  EXPECT_EQ(kv.trimming.window(), 32);
  EXPECT_EQ(kv.trimming.lookahead_size(), 3);
  EXPECT_EQ(kv.kv_entries, 100);
  // The window never exceeds the budget (the prefill worker refuses that).
  EXPECT_EQ(ApplyMethod(DraftMethod::kSnapKv, 20, prompt, nullptr, params).trimming.window(), 20);
  AppliedMethod s = ApplyMethod(DraftMethod::kStreamingLlm, 2, prompt, nullptr, params);
  EXPECT_EQ(s.trimming.method(), v1::TRIM_STREAMINGLLM);
  EXPECT_EQ(s.trimming.sink_tokens(), 2);
  // PyramidKV: its per-layer budgets wait for the model's layer count (set at the reservation).
  AppliedMethod py = ApplyMethod(DraftMethod::kPyramidKv, 100, prompt, nullptr, params);
  ASSERT_EQ(py.error, "");
  EXPECT_EQ(py.trimming.method(), v1::TRIM_PYRAMIDKV);
  EXPECT_EQ(py.trimming.window(), 32);
  EXPECT_EQ(py.trimming.layer_budgets_size(), 0);
  EXPECT_EQ(py.kv_entries, 100);
  // A method that needs a map and has none.
  EXPECT_NE(ApplyMethod(DraftMethod::kSpecKv, 100, prompt, nullptr, params).error, "");
}

}  // namespace
}  // namespace tripod::scheduler
