// The draft engine on the bundled model: a self-draft of every layer generates the target's own
// greedy tokens (Session, the CLI's loop, as the independent path), and so does a shallow
// self-draft's lookahead when it runs at full depth, its map unchanged; the captured scores do not
// depend on how the prompt was chunked; SpecPC's kept set holds the window and the budget, and a
// budget at or above the prompt keeps it whole; bad requests get clear errors; a separate draft
// whose vocabulary is not its target's is refused at start.
#include "draft_node/draft_engine.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common/compute/session.h"
#include "gtest/gtest.h"
#include "tests/unit/gguf_writer.h"
#include "tests/unit/test_model.h"

namespace tripod {
namespace {

std::vector<int32_t> SomePrompt(int n) {
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = 100 + (i * 37) % 900;
  return ids;
}

std::unique_ptr<DraftEngine> Engine(int layers, int chunk, const std::string& precision = "fp32",
                                    int lookahead_layers = 0) {
  DraftEngineOptions o;
  o.model_path = TestModelPath();
  o.self_draft_layers = layers;
  o.lookahead_layers = lookahead_layers;
  o.prefill_chunk = chunk;
  o.precision = precision;
  o.context_tokens = 512;
  absl::StatusOr<std::unique_ptr<DraftEngine>> e = DraftEngine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

// The target's own greedy tokens after `prompt`, through Session (the CLI's loop).
std::vector<int32_t> TargetGreedy(const std::vector<int32_t>& prompt, int n) {
  SessionOptions so;
  so.model_path = TestModelPath();
  so.precision = "fp32";
  so.context_tokens = 512;
  std::unique_ptr<Session> s = *Session::Open(so);
  std::vector<int32_t> want;
  std::vector<float> logits = *s->Append(prompt);
  for (int i = 0; i < n; ++i) {
    const int32_t t =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    want.push_back(t);
    logits = *s->Append({t});
  }
  return want;
}

TEST(DraftEngineTest, FullDepthSelfDraftGeneratesTheTargetsGreedyTokens) {
  std::unique_ptr<DraftEngine> e = Engine(0, 512);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->depth(), e->model().config.n_layers);
  DraftRequest r;
  r.prompt = SomePrompt(40);
  r.lookahead = 6;
  absl::StatusOr<DraftResult> got = e->Score(r);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->lookahead, TargetGreedy(r.prompt, 6));
}

TEST(DraftEngineTest, DeeperLookaheadLeavesTheMapAndGeneratesAtItsDepth) {
  // An 8-layer self-draft whose lookahead comes from every layer: the map (scores, kept set) is
  // the 8-layer draft's exactly, and the lookahead is the target's greedy tokens, which the
  // 8-layer draft's own lookahead is not on this prompt.
  std::unique_ptr<DraftEngine> shallow = Engine(8, 32), deep = Engine(8, 32, "fp32", kAllLayers);
  ASSERT_NE(shallow, nullptr);
  ASSERT_NE(deep, nullptr);
  EXPECT_EQ(deep->depth(), 8);
  EXPECT_EQ(deep->lookahead_depth(), deep->model().config.n_layers);
  EXPECT_EQ(shallow->lookahead_depth(), 8);
  DraftRequest r;
  r.prompt = SomePrompt(60);
  r.specpc.window = 12;
  r.specpc.budget = 24;
  r.lookahead = 6;
  absl::StatusOr<DraftResult> a = shallow->Score(r), b = deep->Score(r);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->token_scores, b->token_scores);
  EXPECT_EQ(a->keep, b->keep);
  const std::vector<int32_t> target = TargetGreedy(r.prompt, 6);
  EXPECT_EQ(b->lookahead, target);
  EXPECT_NE(a->lookahead, target);
  // Without lookahead tokens the deep engine runs only its 8 layers: the same map again.
  r.lookahead = 0;
  absl::StatusOr<DraftResult> c = deep->Score(r);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->token_scores, a->token_scores);
  EXPECT_TRUE(c->lookahead.empty());

  EXPECT_EQ(*ParseLookaheadLayers("all"), kAllLayers);
  EXPECT_EQ(*ParseLookaheadLayers("12"), 12);
  EXPECT_FALSE(ParseLookaheadLayers("0").ok());
  EXPECT_FALSE(ParseLookaheadLayers("deep").ok());
}

TEST(DraftEngineTest, ScoresDoNotDependOnChunkingAndKeepHoldsWindowAndBudget) {
  std::unique_ptr<DraftEngine> whole = Engine(8, 512), chunked = Engine(8, 16);
  ASSERT_NE(whole, nullptr);
  ASSERT_NE(chunked, nullptr);
  DraftRequest r;
  r.prompt = SomePrompt(150);
  r.specpc.window = 20;
  r.specpc.budget = 60;
  r.specpc.pool_kernel = 5;
  r.specpc.neighbourhood = 5;
  absl::StatusOr<DraftResult> a = whole->Score(r), b = chunked->Score(r);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->first_layer, 4);  // depth / 2 for drafts under 16 layers
  ASSERT_EQ(a->token_scores.size(), 150u);
  ASSERT_EQ(b->token_scores.size(), 150u);
  float top = 0;
  for (int j = 0; j < 150; ++j) {
    EXPECT_GE(a->token_scores[j], 0.0f);
    EXPECT_LE(a->token_scores[j], 1.0f);
    EXPECT_NEAR(a->token_scores[j], b->token_scores[j], 1e-4) << j;
    top = std::max(top, a->token_scores[j]);
  }
  EXPECT_GT(top, 0.05f);  // attention concentrates somewhere
  ASSERT_EQ(a->keep.size(), 60u);
  EXPECT_TRUE(std::is_sorted(a->keep.begin(), a->keep.end()));
  for (int j = 130; j < 150; ++j) {
    EXPECT_TRUE(std::binary_search(a->keep.begin(), a->keep.end(), j)) << "window position " << j;
  }
  // The highest-scoring position outside the window is kept.
  const int best =
      static_cast<int>(std::max_element(a->token_scores.begin(), a->token_scores.begin() + 130) -
                       a->token_scores.begin());
  EXPECT_TRUE(std::binary_search(a->keep.begin(), a->keep.end(), best)) << best;

  r.specpc.budget = 150;
  absl::StatusOr<DraftResult> all = whole->Score(r);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->keep.size(), 150u);
  for (int j = 0; j < 150; ++j) EXPECT_EQ(all->keep[j], j);
}

TEST(DraftEngineTest, BadRequestsAndOptionsAreRefusedWithAMessage) {
  std::unique_ptr<DraftEngine> e = Engine(4, 512, "auto");
  ASSERT_NE(e, nullptr);
  auto refused = [&](DraftRequest r, const std::string& words) {
    absl::StatusOr<DraftResult> got = e->Score(r);
    ASSERT_FALSE(got.ok());
    EXPECT_NE(got.status().message().find(words), std::string::npos) << got.status();
  };
  DraftRequest r;
  refused(r, "empty prompt");
  r.prompt = {1, 2, 3, -5};
  refused(r, "outside the vocabulary");
  r.prompt = SomePrompt(10);
  r.lookahead = -1;
  refused(r, "lookahead");
  r.lookahead = 0;
  r.first_layer = 4;
  refused(r, "past the draft's 4 layers");
  r.first_layer = -1;
  r.lookahead = 600;
  refused(r, "exceed the draft's context");
  DraftEngineOptions o;
  o.model_path = TestModelPath();
  o.self_draft_layers = 99;
  absl::StatusOr<std::unique_ptr<DraftEngine>> bad = DraftEngine::Create(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("self-draft layers"), std::string::npos) << bad.status();
  o.self_draft_layers = 8;
  for (int look : {4, 99, -2}) {  // shallower than the draft, deeper than the model, nonsense
    o.lookahead_layers = look;
    bad = DraftEngine::Create(o);
    ASSERT_FALSE(bad.ok()) << look;
    EXPECT_NE(bad.status().message().find("lookahead layers"), std::string::npos) << bad.status();
  }
  o.self_draft_layers = 0;  // a separate draft runs in full
  o.lookahead_layers = 12;
  bad = DraftEngine::Create(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("separate draft"), std::string::npos) << bad.status();
}

// tripod serve's draft pair: the draft worker runs a separate model (self_draft_layers 0) for a
// target; a target of another vocabulary is refused before the draft's weights load, naming both.
TEST(DraftEngineTest, ASeparateDraftMustShareItsTargetsVocabulary) {
  const std::string target =
      ::testing::TempDir() + "/draft_target_" + std::to_string(getpid()) + ".gguf";
  std::ofstream(target, std::ios::binary)
      << gguf_writer::ModelMetadata("qwen2", {"<|endoftext|>", "a", "b"});
  DraftEngineOptions o;
  o.model_path = TestModelPath();
  o.self_draft_layers = 0;
  o.target_model_path = target;
  absl::StatusOr<std::unique_ptr<DraftEngine>> e = DraftEngine::Create(o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("vocabularies differ (49152 tokens against 3"),
            std::string::npos)
      << e.status();
  EXPECT_NE(e.status().message().find(target), std::string::npos) << e.status();
  unlink(target.c_str());

  // The same file as its own target: the pair is accepted (and runs in full).
  o.target_model_path = TestModelPath();
  o.context_tokens = 64;
  e = DraftEngine::Create(o);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ((*e)->depth(), (*e)->model().config.n_layers);
}

}  // namespace
}  // namespace tripod
