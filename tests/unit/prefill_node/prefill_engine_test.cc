// PrefillEngine on the bundled model (fp32 path):
//  - ratio 0: the KV and the boundary token's logits are bit-identical to the full reference
//    forward run the same way;
//  - ratio 1/3, prefilled in chunks: kept layers' KV is bit-identical to the full model's; each
//  skipped layer's K/V
//    equals the definition (its own norm and K/V projections applied to the stream leaving the
//    last kept layer), computed by the ordinary full-layer path of a reference model whose
//    other skipped layers are removed — independent of the K/V-only and stacked-GEMM code;
//  - the worker loads less than the full model and no head;
//  - bad configs and prompts are rejected.
#include "prefill_node/prefill_engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/compute/cpu/cpu_backend.h"
#include "common/compute/kv_stack.h"
#include "common/kv/contiguous_kv_cache.h"
#include "tests/unit/test_model.h"

namespace tripod {
namespace {

std::string ModelPath() { return TestModelPath(); }

std::vector<int32_t> SomeIds(int n, int seed) {
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = 100 + (seed * 7919 + i * 104729) % 40000;
  return ids;
}

class PrefillEngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    backend_ = MakeCpuBackend(*CpuOptionsForPrecision("fp32")).release();
    auto m = LoadModel(ModelPath(), *backend_);
    ASSERT_TRUE(m.ok()) << m.status();
    full_ = m->release();
  }
  static void TearDownTestSuite() {
    engines_.clear();
    delete full_;
    delete backend_;
    full_ = nullptr;
    backend_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(full_, nullptr) << "the model did not load"; }

  // Engines are shared across tests (loading one prepacks its weights: seconds on a busy host).
  static PrefillEngine* Engine(PopConfig pop, int chunk, bool stack = true) {
    const std::string key = absl::StrCat(pop.ratio, "/", chunk, "/", stack);
    auto it = engines_.find(key);
    if (it != engines_.end()) return it->second.get();
    PrefillOptions o;
    o.model_path = ModelPath();
    o.precision = "fp32";
    o.pop = pop;
    o.chunk = chunk;
    o.stack_kv = stack;
    auto e = PrefillEngine::Create(o);
    EXPECT_TRUE(e.ok()) << e.status();
    if (!e.ok()) return nullptr;
    return (engines_[key] = std::move(e).value()).get();
  }

  std::unique_ptr<ContiguousKvCache> NewCache(int capacity) {
    const ModelConfig& c = full_->config;
    KvLayout layout{c.n_layers, c.n_kv_heads, c.head_dim, KvDtype::kF32};
    return *ContiguousKvCache::Create(layout, 1, capacity);
  }

  // Runs ids[begin, end) through the reference model under `plan` in chunks, at positions and
  // slots begin.., returning the logits of the last one when `logits` is set.
  void RunRef(const ForwardPlan& plan, const std::vector<int32_t>& ids, int begin, int end,
              int chunk, KvStore& kv, std::vector<float>* logits) {
    ForwardWorkspace ws(*backend_);
    for (int b = begin; b < end; b += chunk) {
      const int n = std::min(chunk, end - b);
      StepBatch batch;
      const bool last = logits != nullptr && b + n == end;
      batch.AddSequence(0, ids.data() + b, n, b, b, last);
      const absl::Status s = Forward(*full_, *backend_, plan, batch, kv, ws, logits);
      ASSERT_TRUE(s.ok()) << s;
    }
  }

  static Backend* backend_;
  static LoadedModel* full_;
  static std::map<std::string, std::unique_ptr<PrefillEngine>> engines_;
};
Backend* PrefillEngineTest::backend_ = nullptr;
LoadedModel* PrefillEngineTest::full_ = nullptr;
std::map<std::string, std::unique_ptr<PrefillEngine>> PrefillEngineTest::engines_;

// Max |a - b| over one layer of two snapshots, and max |b| there (K when k, else V).
std::pair<double, double> LayerDiff(const KvSnapshot& a, const KvSnapshot& b, int layer, bool k) {
  const size_t per_layer = size_t{1} * a.layout.n_kv_heads * a.n_slots * a.layout.head_dim;
  const float* pa = reinterpret_cast<const float*>((k ? a.k : a.v).data()) + layer * per_layer;
  const float* pb = reinterpret_cast<const float*>((k ? b.k : b.v).data()) + layer * per_layer;
  double diff = 0, mag = 0;
  for (size_t i = 0; i < per_layer; ++i) {
    diff = std::max(diff, std::abs(double{pa[i]} - pb[i]));
    mag = std::max(mag, std::abs(double{pb[i]}));
  }
  return {diff, mag};
}

TEST_F(PrefillEngineTest, RatioZeroIsBitIdenticalToTheFullForward) {
  const std::vector<int32_t> prompt = SomeIds(41, 1);
  const int m = 40, chunk = 16;
  auto* engine = Engine(PopConfig{0.0, std::nullopt}, chunk);
  ASSERT_NE(engine, nullptr);
  EXPECT_TRUE(engine->skipped_layers().empty());
  auto r = engine->Run(prompt);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->kv.n_slots, m);
  EXPECT_EQ(r->last_token, prompt.back());
  EXPECT_EQ(r->last_position, m);
  EXPECT_EQ(r->chunks, 3);
  EXPECT_EQ(r->kv.token_ids, std::vector<int32_t>(prompt.begin(), prompt.end() - 1));
  const ForwardPlan full_plan = ForwardPlan::Full(full_->config.n_layers);
  EXPECT_EQ(r->kv.plan_key, full_plan.KvKey());  // ratio 0 KV may share the full model's cache

  // Reference: tokens 0..n-2 through the full model in the same chunks, then the last token.
  auto ref = NewCache(64);
  RunRef(full_plan, prompt, 0, m, chunk, *ref, nullptr);
  auto ref_snap = ExportSnapshot(*ref, 0, m);
  ASSERT_TRUE(ref_snap.ok());
  ASSERT_EQ(r->kv.k.size(), ref_snap->k.size());
  EXPECT_EQ(std::memcmp(r->kv.k.data(), ref_snap->k.data(), r->kv.k.size()), 0);
  EXPECT_EQ(std::memcmp(r->kv.v.data(), ref_snap->v.data(), r->kv.v.size()), 0);
  std::vector<float> ref_logits;
  RunRef(full_plan, prompt, m, m + 1, 1, *ref, &ref_logits);

  // Decode side: import the engine's KV, run the boundary token through the full model.
  auto dec = NewCache(64);
  ASSERT_TRUE(WriteSnapshot(r->kv, *dec, 0).ok());
  std::vector<float> logits;
  RunRef(full_plan, prompt, r->last_position, r->last_position + 1, 1, *dec, &logits);
  ASSERT_EQ(logits.size(), static_cast<size_t>(full_->config.vocab_size));
  ASSERT_EQ(logits.size(), ref_logits.size());
  EXPECT_EQ(std::memcmp(logits.data(), ref_logits.data(), logits.size() * sizeof(float)), 0);
}

// Each skipped layer j's K/V by definition: run the reference model with every other skipped
// layer removed (kSkip), so that layer j, run in full, sees exactly h*.
TEST_F(PrefillEngineTest, SkippedLayersKvMatchesTheDefinition) {
  const std::vector<int32_t> prompt = SomeIds(41, 2);
  const int m = 40;
  const int L = full_->config.n_layers;
  for (bool stack : {true, false}) {
    SCOPED_TRACE(stack ? "stacked K/V GEMM" : "per-layer K/V");
    auto* engine = Engine(PopConfig{}, 16, stack);
    ASSERT_NE(engine, nullptr);
    EXPECT_EQ(engine->model().kv_stack.n_layers(), stack ? 10 : 0);
    auto r = engine->Run(prompt);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->kv.plan_key, engine->plan().KvKey());
    EXPECT_NE(r->kv.plan_key, ForwardPlan::Full(L).KvKey());
    const std::vector<int>& skipped = engine->skipped_layers();
    ASSERT_EQ(skipped.size(), 10u);

    // Kept layers: the same computation as the full model's.
    auto full_kv = NewCache(64);
    RunRef(ForwardPlan::Full(L), prompt, 0, m, 16, *full_kv, nullptr);
    auto full_snap = *ExportSnapshot(*full_kv, 0, m);
    for (int l = 0; l < skipped.front(); ++l) {
      for (bool k : {true, false}) {
        EXPECT_EQ(LayerDiff(r->kv, full_snap, l, k).first, 0.0) << "kept layer " << l;
      }
    }
    for (int j : skipped) {
      // The per-layer path is the fallback: a few layers suffice for it.
      if (!stack && j != skipped.front() && j != 25 && j != skipped.back()) continue;
      ForwardPlan def = ForwardPlan::Full(L);
      for (int l : skipped) def.layers[l] = l == j ? LayerMode::kFull : LayerMode::kSkip;
      auto kv = NewCache(64);
      RunRef(def, prompt, 0, m, m, *kv, nullptr);
      auto snap = *ExportSnapshot(*kv, 0, m);
      for (bool k : {true, false}) {
        const auto [diff, mag] = LayerDiff(r->kv, snap, j, k);
        // fp32 throughout; the folded norm weight and a different GEMM shape change only the
        // rounding (~1e-6 of the magnitude over 576-term sums): 1e-4 leaves margin, and any
        // real error (wrong stream, norm, layer or RoPE) is of the order of the values.
        EXPECT_GT(mag, 0.1);
        EXPECT_LT(diff, 1e-4 * mag) << "layer " << j << (k ? " K" : " V");
      }
      // Sanity: past the first skipped layer the full model's stream differs from h*, and so
      // does its K/V (the first skipped layer sees h* in both).
      const double vs_full = LayerDiff(r->kv, full_snap, j, true).first;
      if (j == skipped.front()) {
        EXPECT_LT(vs_full, 1e-4 * LayerDiff(r->kv, full_snap, j, true).second);
      } else {
        EXPECT_GT(vs_full, 1e-2) << "layer " << j;
      }
    }
  }
}

// The stacked projection runs in tiles of rows; a batch of two sequences whose boundary falls
// inside a tile, longer than one tile, gives the same K/V as one K/V GEMM per layer.
TEST_F(PrefillEngineTest, StackedTilesMatchPerLayerOverSequenceBoundaries) {
  const int n0 = 150, n1 = 200;
  static_assert(n0 < kKvStackTileRows && n0 + n1 > kKvStackTileRows);
  const std::vector<int32_t> a = SomeIds(n0, 4), b = SomeIds(n1, 5);
  std::vector<KvSnapshot> snaps[2];
  for (bool stack : {true, false}) {
    PrefillEngine* e = Engine(PopConfig{}, 16, stack);
    ASSERT_NE(e, nullptr);
    const ModelConfig& c = e->model().config;
    KvLayout layout{c.n_layers, c.n_kv_heads, c.head_dim, KvDtype::kF32};
    auto kv = *ContiguousKvCache::Create(layout, 2, n1);
    StepBatch batch;
    batch.AddSequence(0, a.data(), n0, 0, 0, false);
    batch.AddSequence(1, b.data(), n1, 0, 0, false);
    ForwardWorkspace ws(e->backend());
    ASSERT_TRUE(Forward(e->model(), e->backend(), e->plan(), batch, *kv, ws, nullptr).ok());
    snaps[stack].push_back(*ExportSnapshot(*kv, 0, n0));
    snaps[stack].push_back(*ExportSnapshot(*kv, 1, n1));
  }
  for (int seq = 0; seq < 2; ++seq) {
    for (int l = 0; l < full_->config.n_layers; ++l) {
      for (bool k : {true, false}) {
        const auto [diff, mag] = LayerDiff(snaps[1][seq], snaps[0][seq], l, k);
        EXPECT_GT(mag, 0.1);
        EXPECT_LT(diff, 1e-4 * mag) << "seq " << seq << " layer " << l << (k ? " K" : " V");
      }
    }
  }
}

TEST_F(PrefillEngineTest, LoadsLessThanTheFullModelAndNoHead) {
  auto full_bytes = FullModelWeightBytes(ModelPath(), "fp32");
  ASSERT_TRUE(full_bytes.ok()) << full_bytes.status();
  EXPECT_EQ(*full_bytes, full_->resident_weight_bytes());
  auto* engine = Engine(PopConfig{}, 16);
  ASSERT_NE(engine, nullptr);
  const LoadedModel& m = engine->model();
  EXPECT_EQ(m.output, nullptr);
  EXPECT_EQ(m.output_norm, nullptr);
  EXPECT_FALSE(engine->plan().output_head);
  for (int l : engine->skipped_layers()) {
    EXPECT_EQ(m.layers[l].qkv, nullptr);
    EXPECT_EQ(m.layers[l].gate_up, nullptr);
    EXPECT_EQ(m.layers[l].wo, nullptr);
  }
  const size_t pop = engine->resident_weight_bytes();
  EXPECT_LT(pop, *full_bytes);
  // What is gone: the skipped layers' attention-output and FFN weights (read in their quantised
  // form), less the stacked K/V projection those layers keep in GEMM form; and the head.
  size_t skipped = 0;
  for (int l : engine->skipped_layers()) {
    const LayerWeights& w = full_->weights.layers[l];
    for (const WeightRef& r : {w.wo, w.w_gate, w.w_up, w.w_down}) skipped += r.tensor->n_bytes;
  }
  ASSERT_GT(skipped, m.kv_stack.resident_bytes());
  EXPECT_GE(*full_bytes - pop, skipped - m.kv_stack.resident_bytes());
  // Ratio 0 without the head still loads less (no head, tied to the embedding here or not).
  auto* no_head = Engine(PopConfig{0.0, std::nullopt}, 16);
  ASSERT_NE(no_head, nullptr);
  EXPECT_LE(no_head->resident_weight_bytes(), *full_bytes);
  EXPECT_GT(no_head->resident_weight_bytes(), pop);
}

TEST_F(PrefillEngineTest, RejectsBadConfigsAndPrompts) {
  PrefillOptions o;
  o.model_path = ModelPath();
  o.precision = "fp32";
  o.pop.ratio = 1.0;
  EXPECT_FALSE(PrefillEngine::Create(o).ok());
  o.pop.ratio = 1.0 / 3;
  o.pop.layers = std::vector<int>{0, 29};
  EXPECT_FALSE(PrefillEngine::Create(o).ok());
  o.pop.layers = std::vector<int>{30};
  EXPECT_FALSE(PrefillEngine::Create(o).ok());
  o.pop.layers.reset();
  o.chunk = 0;
  EXPECT_FALSE(PrefillEngine::Create(o).ok());
  o.chunk = 16;
  o.precision = "fp64";
  EXPECT_FALSE(PrefillEngine::Create(o).ok());
  o.precision = "fp32";
  o.model_path = "/nonexistent.gguf";
  EXPECT_FALSE(PrefillEngine::Create(o).ok());

  auto* engine = Engine(PopConfig{}, 16);
  ASSERT_NE(engine, nullptr);
  EXPECT_FALSE(engine->Run({}).ok());
  EXPECT_FALSE(engine->Run({5, full_->config.vocab_size}).ok());
  EXPECT_FALSE(engine->Run({-1, 5}).ok());
  auto one = engine->Run({42});
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->kv.n_slots, 0);
  EXPECT_EQ(one->last_token, 42);
  EXPECT_EQ(one->last_position, 0);
}

}  // namespace
}  // namespace tripod
