// KV trimming on the prefill engine (bundled model, fp32): a policy that keeps everything gives
// Run's exact snapshot; StreamingLLM and the draft map keep their fixed positions' rows
// unchanged; SpecKV and SnapKV keep, per layer and head, the budget: the window and the
// best-scored rest, with rows equal to the untrimmed prefill's; the decode engine generates
// from the trimmed KV, and reads each head's entries in that head's own slot order; under POP the
// skipped layers are scored by queries from their own stream (refused where their Q projections
// were not loaded); and the selection itself on hand-made scores.
#include "prefill_node/kv_trimming.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <memory>
#include <vector>

#include "common/kv/pyramid_budgets.h"
#include "decode_node/decode_engine.h"
#include "gtest/gtest.h"
#include "prefill_node/prefill_engine.h"
#include "tests/unit/test_model.h"

namespace tripod {
namespace {

std::vector<int32_t> Prompt(int n) {
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = 300 + (i * 29) % 800;
  return ids;
}

TEST(KvTrimmingTest, SelectByScoreKeepsTheWindowAndTheBestPooledRest) {
  // m = 12, window 3 (positions 9..11), budget 6: the top 3 of the pooled scores over 0..8.
  std::vector<float> s(12, 0.0f);
  s[2] = 0.9f;
  s[6] = 0.5f;
  s[10] = 1.0f;  // inside the window: never competes
  // Kernel 1 (no pooling): 2, 6, then the earliest zero (0).
  EXPECT_EQ(SelectByScore(s.data(), 12, 6, 3, 1), (std::vector<int32_t>{0, 2, 6, 9, 10, 11}));
  // Kernel 3: pooled 1..3 = 0.9, 5..7 = 0.5: the top 3 are 1, 2, 3.
  EXPECT_EQ(SelectByScore(s.data(), 12, 6, 3, 3), (std::vector<int32_t>{1, 2, 3, 9, 10, 11}));
}

TEST(KvTrimmingTest, PoliciesAreCheckedAndNamed) {
  EXPECT_EQ(*ParseTrimMethod("speckv"), TrimMethod::kSpecKv);
  EXPECT_EQ(*ParseTrimMethod("streamingllm"), TrimMethod::kStreamingLlm);
  EXPECT_FALSE(ParseTrimMethod("h2o").ok());
  TrimPolicy p;
  p.method = TrimMethod::kSpecKv;
  p.budget = 16;
  p.window = 32;
  EXPECT_FALSE(ValidateTrimPolicy(p, 100).ok());  // window past the budget
  p.window = 8;
  EXPECT_TRUE(ValidateTrimPolicy(p, 100).ok());
  p.method = TrimMethod::kDraftMap;
  p.keep = {1, 5, 3};
  p.budget = 3;
  EXPECT_FALSE(ValidateTrimPolicy(p, 100).ok());  // not ascending
  p.keep = {1, 3, 5};
  EXPECT_TRUE(ValidateTrimPolicy(p, 100).ok());
  EXPECT_TRUE(KeepsEverything(p, 3));
  EXPECT_FALSE(KeepsEverything(p, 4));
}

class TrimEngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    PrefillOptions o;
    o.model_path = TestModelPath();
    o.precision = "fp32";
    o.chunk = 64;
    o.pop = *ParsePopConfig("0", "");  // full weights: any plan
    engine_ = PrefillEngine::Create(o)->release();
  }
  static void TearDownTestSuite() {
    delete engine_;
    engine_ = nullptr;
  }
  static PrefillEngine* engine_;
};
PrefillEngine* TrimEngineTest::engine_ = nullptr;

const float* Row(const KvSnapshot& s, bool k, int layer, int head, int slot) {
  return reinterpret_cast<const float*>(&(k ? s.k : s.v)[s.offset(layer, head, slot)]);
}

TEST_F(TrimEngineTest, KeepingEverythingIsRunsExactSnapshot) {
  const std::vector<int32_t> prompt = Prompt(90);
  const PrefillResult full = *engine_->Run(prompt);
  for (TrimMethod m : {TrimMethod::kSpecKv, TrimMethod::kSnapKv, TrimMethod::kStreamingLlm}) {
    TrimPolicy p;
    p.method = m;
    p.budget = 89;  // = the prefilled tokens
    p.window = 16;
    p.lookahead = {5, 6, 7};
    const PrefillResult r = *engine_->RunTrimmed(prompt, p);
    EXPECT_FALSE(r.kv.trimmed()) << TrimMethodName(m);
    EXPECT_EQ(r.kv.k, full.kv.k) << TrimMethodName(m);
    EXPECT_EQ(r.kv.v, full.kv.v) << TrimMethodName(m);
  }
}

TEST_F(TrimEngineTest, FixedMethodsKeepTheirPositionsRowsUnchanged) {
  const std::vector<int32_t> prompt = Prompt(90);
  const PrefillResult full = *engine_->Run(prompt);
  const ModelConfig& c = engine_->model().config;
  TrimPolicy p;
  p.method = TrimMethod::kStreamingLlm;
  p.budget = 20;
  const PrefillResult r = *engine_->RunTrimmed(prompt, p);
  ASSERT_TRUE(r.kv.trimmed());
  ASSERT_EQ(r.kv.n_slots, 20);
  for (int l = 0; l < c.n_layers; ++l) {
    for (int h = 0; h < c.n_kv_heads; ++h) {
      for (int s = 0; s < 20; ++s) {
        const int32_t pos = r.kv.positions[(l * c.n_kv_heads + h) * 20 + s];
        ASSERT_EQ(pos, s < 4 ? s : 89 - 20 + s) << l << " " << h << " " << s;
        ASSERT_EQ(0, std::memcmp(Row(r.kv, true, l, h, s), Row(full.kv, true, l, h, pos),
                                 r.kv.row_bytes()));
        ASSERT_EQ(0, std::memcmp(Row(r.kv, false, l, h, s), Row(full.kv, false, l, h, pos),
                                 r.kv.row_bytes()));
      }
    }
  }
  p.method = TrimMethod::kDraftMap;
  p.budget = 3;
  p.keep = {0, 40, 88};
  const PrefillResult d = *engine_->RunTrimmed(prompt, p);
  ASSERT_EQ(d.kv.n_slots, 3);
  for (int l = 0; l < c.n_layers; ++l) {
    EXPECT_EQ(d.kv.positions[(l * c.n_kv_heads) * 3 + 1], 40);
  }
}

TEST_F(TrimEngineTest, ScoredMethodsKeepTheWindowAndRowsOfTheUntrimmedKv) {
  const std::vector<int32_t> prompt = Prompt(120);
  const PrefillResult full = *engine_->Run(prompt);
  const ModelConfig& c = engine_->model().config;
  const int m = 119, budget = 40, window = 8;
  for (TrimMethod method : {TrimMethod::kSpecKv, TrimMethod::kSnapKv}) {
    TrimPolicy p;
    p.method = method;
    p.budget = budget;
    p.window = window;
    p.lookahead = {11, 12, 13, 14};
    absl::StatusOr<PrefillResult> got = engine_->RunTrimmed(prompt, p);
    ASSERT_TRUE(got.ok()) << got.status();
    const KvSnapshot& kv = got->kv;
    ASSERT_TRUE(kv.trimmed());
    ASSERT_EQ(kv.n_slots, budget);
    int differ_from_first_head = 0;
    for (int l = 0; l < c.n_layers; ++l) {
      for (int h = 0; h < c.n_kv_heads; ++h) {
        const int32_t* pos = &kv.positions[(l * c.n_kv_heads + h) * budget];
        ASSERT_TRUE(std::is_sorted(pos, pos + budget));
        for (int j = m - window; j < m; ++j) ASSERT_TRUE(std::binary_search(pos, pos + budget, j));
        if (!std::equal(pos, pos + budget, &kv.positions[0])) ++differ_from_first_head;
        for (int s = 0; s < budget; ++s) {
          const float* a = Row(kv, true, l, h, s);
          const float* b = Row(full.kv, true, l, h, pos[s]);
          for (int d = 0; d < c.head_dim; ++d) {
            ASSERT_NEAR(a[d], b[d], 1e-3 + 1e-3 * std::fabs(b[d])) << l << " " << h << " " << s;
          }
        }
      }
    }
    // Heads choose for themselves: not every (layer, head) keeps the same set.
    EXPECT_GT(differ_from_first_head, 0) << TrimMethodName(method);
  }
}

// The evaluation's shared pass (split_lookahead): the untrimmed KV is the one pass's, the combined
// scores are one batch's (max and sum over the window's and the lookahead's queries, up to
// rounding), the window's alone are a pass without lookahead's, and the positions SpecKV and
// SnapKV keep from them are the unshared passes'.
TEST_F(TrimEngineTest, SplitLookaheadScoresAsOneBatchAndAPassWithoutIt) {
  const std::vector<int32_t> prompt = Prompt(120);
  const std::vector<int32_t> lookahead = {11, 12, 13, 14, 15};
  const int window = 8, m = 119;
  auto joint = engine_->RunScored(prompt, window, lookahead);
  auto alone = engine_->RunScored(prompt, window, {});
  auto split = engine_->RunScored(prompt, window, lookahead, nullptr, /*split_lookahead=*/true);
  ASSERT_TRUE(joint.ok() && alone.ok() && split.ok()) << split.status();
  EXPECT_EQ(split->full.kv.k, alone->full.kv.k);
  EXPECT_EQ(split->full.kv.v, alone->full.kv.v);
  EXPECT_GT(split->lookahead_s, 0);
  auto near = [](const std::vector<float>& a, const std::vector<float>& b, int n_keys_a,
                 int n_keys_b, int keys) {
    int bad = 0;
    for (size_t r = 0; r < a.size() / n_keys_a; ++r) {
      for (int k = 0; k < keys; ++k) {
        const float x = a[r * n_keys_a + k], y = b[r * n_keys_b + k];
        if (std::fabs(x - y) > 1e-5f + 1e-4f * std::fabs(y)) ++bad;
      }
    }
    return bad;
  };
  const CapturedAttention& j = joint->attention;
  const CapturedAttention& s = split->attention;
  ASSERT_EQ(s.n_keys, j.n_keys);
  EXPECT_EQ(near(s.max, j.max, s.n_keys, j.n_keys, j.n_keys), 0);
  EXPECT_EQ(near(s.sum, j.sum, s.n_keys, j.n_keys, j.n_keys), 0);
  const CapturedAttention& w = split->window_only;
  const CapturedAttention& a = alone->attention;
  ASSERT_EQ(w.n_keys, a.n_keys);
  EXPECT_EQ(near(w.max, a.max, w.n_keys, a.n_keys, a.n_keys), 0);
  EXPECT_EQ(near(w.sum, a.sum, w.n_keys, a.n_keys, a.n_keys), 0);
  // The lookahead's queries changed the scores (else this test would not see a mix-up).
  EXPECT_GT(near(s.sum, w.sum, s.n_keys, w.n_keys, w.n_keys), 0);
  for (TrimMethod method : {TrimMethod::kSpecKv, TrimMethod::kSnapKv}) {
    TrimPolicy p;
    p.method = method;
    p.budget = 40;
    p.window = window;
    const bool spec = method == TrimMethod::kSpecKv;
    // Equal but for a near tie that rounding may flip (a batch of other rows can change a sum's
    // last bits on some kernels).
    const std::vector<int32_t> got = ScoredPositions(p, spec ? s : w, m);
    const std::vector<int32_t> want = ScoredPositions(p, spec ? j : a, m);
    ASSERT_EQ(got.size(), want.size());
    size_t same = 0;
    for (size_t i = 0; i < got.size(); ++i) same += got[i] == want[i];
    EXPECT_GE(same, got.size() * 99 / 100) << TrimMethodName(method);
  }
}

// Kept positions of (layer, head), [layers][heads][budget].
std::vector<int32_t> HeadPositions(const KvSnapshot& kv, int layer, int head) {
  const int c = kv.n_slots;
  const int32_t* p = &kv.positions[(size_t{1} * layer * kv.layout.n_kv_heads + head) * c];
  return std::vector<int32_t>(p, p + c);
}

TEST_F(TrimEngineTest, PopScoresItsKvOnlyLayersWithQueriesFromTheirOwnStream) {
  // POP 1/3 skips layers 20..29: their K/V (and, for scoring, their queries) come from h*, the
  // stream leaving layer 19. Layer 20's input is h* in the full model too, so up to layer 20 the
  // POP run scores exactly as the full one; deeper layers have no full-model equivalent.
  const std::vector<int32_t> prompt = Prompt(150);
  const ModelConfig& c = engine_->model().config;
  PopConfig pop;
  pop.ratio = 1.0 / 3;
  const ForwardPlan pop_plan = *engine_->PlanFor(pop);
  ASSERT_EQ(pop_plan.layers[20], LayerMode::kKvOnly);
  ASSERT_EQ(pop_plan.layers[19], LayerMode::kFull);
  for (TrimMethod method : {TrimMethod::kSpecKv, TrimMethod::kSnapKv}) {
    SCOPED_TRACE(TrimMethodName(method));
    TrimPolicy p;
    p.method = method;
    p.budget = 48;
    p.window = 8;
    p.lookahead = {21, 22, 23};
    const PrefillResult full = *engine_->RunTrimmed(prompt, p);
    absl::StatusOr<PrefillResult> popped = engine_->RunTrimmed(prompt, p, &pop_plan);
    ASSERT_TRUE(popped.ok()) << popped.status();
    for (int l = 0; l <= 20; ++l) {
      for (int h = 0; h < c.n_kv_heads; ++h) {
        ASSERT_EQ(HeadPositions(popped->kv, l, h), HeadPositions(full.kv, l, h)) << l << " " << h;
      }
    }

    // A prefill worker that loaded only what POP needs (the skipped layers' K/V as one stacked
    // GEMM, their norms and Q projections) keeps what the full-weights one keeps under the same
    // plan, up to near-ties of the stacked GEMM's rounding.
    PrefillOptions o;
    o.model_path = TestModelPath();
    o.precision = "fp32";
    o.chunk = 64;
    o.pop = pop;
    std::unique_ptr<PrefillEngine> pruned = *PrefillEngine::Create(o);
    absl::StatusOr<PrefillResult> own = pruned->RunTrimmed(prompt, p);
    ASSERT_TRUE(own.ok()) << own.status();
    int same = 0, total = 0;
    for (int l = 20; l < c.n_layers; ++l) {
      for (int h = 0; h < c.n_kv_heads; ++h) {
        const std::vector<int32_t> a = HeadPositions(own->kv, l, h);
        const std::vector<int32_t> b = HeadPositions(popped->kv, l, h);
        std::vector<int32_t> both;
        std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
        same += static_cast<int>(both.size());
        total += p.budget;
      }
    }
    EXPECT_GE(same, total * 97 / 100) << same << " of " << total;

    // Without the Q projections there is nothing to score the skipped layers with: refused.
    o.score_queries = false;
    std::unique_ptr<PrefillEngine> no_queries = *PrefillEngine::Create(o);
    absl::StatusOr<PrefillResult> refused = no_queries->RunTrimmed(prompt, p);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  }
}

// Greedy ids from a decode engine given a prompt's (maybe trimmed) KV.
std::vector<int32_t> DecodeFrom(const std::vector<int32_t>& prompt, KvSnapshot kv, int n) {
  DecodeEngineOptions d;
  d.model_path = TestModelPath();
  d.precision = "fp32";
  std::unique_ptr<DecodeEngine> decode = *DecodeEngine::Create(d);
  DecodeRequest req;
  req.prompt = prompt;
  req.max_tokens = n;
  req.sampling.temperature = 0;
  req.ignore_eos = true;
  req.kv = std::make_shared<const KvSnapshot>(std::move(kv));
  std::vector<int32_t> ids;
  std::string error;
  req.on_event = [&](const TokenEvent& e) {
    if (e.token >= 0) ids.push_back(e.token);
    if (e.finish == FinishReason::kError) error = e.error;
  };
  EXPECT_TRUE(decode->Submit(std::move(req)).ok());
  EXPECT_TRUE(decode->RunUntilIdle().ok());
  EXPECT_EQ(error, "");
  return ids;
}

TEST_F(TrimEngineTest, DecodeGeneratesFromTrimmedKv) {
  const std::vector<int32_t> prompt = Prompt(100);
  TrimPolicy p;
  p.method = TrimMethod::kSpecKv;
  p.budget = 48;
  p.window = 8;
  p.lookahead = {42, 43};
  PrefillResult r = *engine_->RunTrimmed(prompt, p);
  EXPECT_EQ(DecodeFrom(prompt, std::move(r.kv), 6).size(), 6u);
}

TEST_F(TrimEngineTest, PyramidKvKeepsEachLayerItsBudgetAtTheTopOfItsSlots) {
  const std::vector<int32_t> prompt = Prompt(120);
  const ModelConfig& c = engine_->model().config;
  const int m = 119, budget = 40, window = 8;
  TrimPolicy p;
  p.method = TrimMethod::kPyramidKv;
  p.budget = budget;
  p.window = window;
  absl::StatusOr<PrefillResult> got = engine_->RunTrimmed(prompt, p);
  ASSERT_TRUE(got.ok()) << got.status();
  const KvSnapshot& kv = got->kv;
  const std::vector<int> budgets = PyramidLayerBudgets(budget, window, c.n_layers, m);
  ASSERT_EQ(kv.n_slots, budgets.front());
  ASSERT_EQ(kv.layer_first.size(), static_cast<size_t>(c.n_layers));
  // SnapKV at the same mean budget: each layer's pyramid selection nests with it (the same
  // scores, the top-k of a smaller budget inside that of a larger one).
  p.method = TrimMethod::kSnapKv;
  const PrefillResult snap = *engine_->RunTrimmed(prompt, p);
  for (int l = 0; l < c.n_layers; ++l) {
    EXPECT_EQ(kv.layer_first[l], kv.n_slots - budgets[l]) << l;
    for (int h = 0; h < c.n_kv_heads; ++h) {
      const std::vector<int32_t> pos = HeadPositions(kv, l, h);
      for (int j = 0; j < kv.layer_first[l]; ++j) ASSERT_EQ(pos[j], -1);
      const std::vector<int32_t> kept(pos.begin() + kv.layer_first[l], pos.end());
      const std::vector<int32_t> s = HeadPositions(snap.kv, l, h);
      ASSERT_TRUE(std::is_sorted(kept.begin(), kept.end()));
      for (int j = m - window; j < m; ++j) {
        ASSERT_TRUE(std::binary_search(kept.begin(), kept.end(), j));
      }
      if (budgets[l] <= budget) {
        EXPECT_TRUE(std::includes(s.begin(), s.end(), kept.begin(), kept.end())) << l << " " << h;
      } else {
        EXPECT_TRUE(std::includes(kept.begin(), kept.end(), s.begin(), s.end())) << l << " " << h;
      }
    }
  }
  // What a transfer sends is the uniform budget's bytes.
  EXPECT_EQ(kv.kept_bytes(), snap.kv.kept_bytes());
  EXPECT_EQ(DecodeFrom(prompt, kv, 6).size(), 6u);

  // Equal per-layer budgets are SnapKV exactly.
  p.method = TrimMethod::kPyramidKv;
  p.layer_budgets.assign(c.n_layers, budget);
  const PrefillResult flat = *engine_->RunTrimmed(prompt, p);
  EXPECT_TRUE(flat.kv.layer_first.empty());
  EXPECT_EQ(flat.kv.positions, snap.kv.positions);
  EXPECT_EQ(flat.kv.k, snap.kv.k);

  // Budgets that do not fit the model are refused.
  p.layer_budgets.assign(c.n_layers + 1, budget);
  EXPECT_EQ(engine_->RunTrimmed(prompt, p).status().code(), absl::StatusCode::kInvalidArgument);
  p.layer_budgets.assign(c.n_layers, budget + 1);  // a mean above the budget
  EXPECT_EQ(engine_->RunTrimmed(prompt, p).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(TrimEngineTest, DecodeNeverAttendsALayersPadding) {
  // SnapKV's KV, and the same with 16 padding slots below every layer's entries (a whole K tile,
  // so that the kernels group the kept entries as before): the decode engine must not see the
  // padding, so both generate the same tokens. Were the padding attended, its (zero or stale)
  // rows would take attention weight and change the output.
  const std::vector<int32_t> prompt = Prompt(100);
  TrimPolicy p;
  p.method = TrimMethod::kSnapKv;
  p.budget = 32;
  p.window = 8;
  KvSnapshot kv = engine_->RunTrimmed(prompt, p)->kv;
  const KvLayout& l = kv.layout;
  const int pad = 16, slots = kv.n_slots + pad;
  KvSnapshot padded = kv;
  padded.n_slots = slots;
  padded.layer_first.assign(l.n_layers, pad);
  padded.positions.clear();
  padded.k.assign(size_t{1} * l.n_layers * l.n_kv_heads * slots * kv.row_bytes(), 0);
  padded.v = padded.k;
  for (int layer = 0; layer < l.n_layers; ++layer) {
    for (int h = 0; h < l.n_kv_heads; ++h) {
      padded.positions.insert(padded.positions.end(), pad, -1);
      for (int s = 0; s < kv.n_slots; ++s) {
        padded.positions.push_back(
            kv.positions[(size_t{1} * layer * l.n_kv_heads + h) * kv.n_slots + s]);
        std::memcpy(&padded.k[padded.offset(layer, h, pad + s)], &kv.k[kv.offset(layer, h, s)],
                    kv.row_bytes());
        std::memcpy(&padded.v[padded.offset(layer, h, pad + s)], &kv.v[kv.offset(layer, h, s)],
                    kv.row_bytes());
      }
    }
  }
  ASSERT_TRUE(ValidateSnapshot(padded, 99).ok()) << ValidateSnapshot(padded, 99);
  EXPECT_EQ(DecodeFrom(prompt, std::move(padded), 8), DecodeFrom(prompt, std::move(kv), 8));
}

TEST_F(TrimEngineTest, EachHeadsOwnSlotOrderDecodesTheSame) {
  // Trimmed heads hold different positions in different slots. The untrimmed KV with every
  // (layer, head)'s slots rotated by its own amount, positions recorded, must decode as the
  // untrimmed KV does: were a head's entries read with another head's positions, or a query head
  // paired with the wrong KV head, the tokens would change.
  const std::vector<int32_t> prompt = Prompt(100);
  KvSnapshot full = engine_->Run(prompt)->kv;
  const KvLayout& l = full.layout;
  const int n = full.n_slots;
  KvSnapshot turned = full;
  turned.positions.clear();
  for (int layer = 0; layer < l.n_layers; ++layer) {
    for (int h = 0; h < l.n_kv_heads; ++h) {
      for (int s = 0; s < n; ++s) {
        const int src = (s + 7 * (h + 1) + layer) % n;
        turned.positions.push_back(src);
        std::memcpy(&turned.k[turned.offset(layer, h, s)], &full.k[full.offset(layer, h, src)],
                    full.row_bytes());
        std::memcpy(&turned.v[turned.offset(layer, h, s)], &full.v[full.offset(layer, h, src)],
                    full.row_bytes());
      }
    }
  }
  ASSERT_TRUE(ValidateSnapshot(turned, 99).ok());
  EXPECT_EQ(DecodeFrom(prompt, std::move(turned), 8), DecodeFrom(prompt, std::move(full), 8));
}
}  // namespace
}  // namespace tripod
