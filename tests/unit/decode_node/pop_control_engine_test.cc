// POP's controls served by the decode engine (DecodeRequest::pop_control): each variant's greedy
// tokens equal an independent reference built the way `tripod eval-pop` runs the control
// (eval/pop/pop_eval.cc), whether the engine prefills the prompt itself (in chunks that cross the
// boundary, batched with plain sequences) or adopts a reservation filled as a prefill worker
// fills it; every control's tokens differ from plain POP's; an inactive control (POP, or no
// layers) leaves the tokens bit-identical to a request without one.
#include <gtest/gtest.h>

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "common/compute/cpu/cpu_backend.h"
#include "common/compute/pop_control.h"
#include "common/kv/contiguous_kv_cache.h"
#include "common/kv/hiding_kv_store.h"
#include "common/util/thread_pool.h"
#include "decode_node/decode_engine.h"
#include "tests/unit/decode_node/random_prompt.h"
#include "tests/unit/test_model.h"

namespace tripod {
namespace {

constexpr int kNewTokens = 12;
const std::vector<int> kLengths = {21, 50};

DecodeRequest Greedy(std::vector<int32_t> prompt, std::vector<int32_t>* out) {
  DecodeRequest r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0;
  r.max_tokens = kNewTokens;
  r.ignore_eos = true;
  r.on_event = [out](const TokenEvent& ev) {
    if (ev.token >= 0) out->push_back(ev.token);
  };
  return r;
}

// The reference: a model on its own batch-invariant fp32 backend and a contiguous cache.
struct Reference {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<LoadedModel> model;

  Reference() {
    CpuBackendOptions o = *CpuOptionsForPrecision("fp32");
    o.batch_invariant = true;
    o.prepack_at_load = false;
    backend = MakeCpuBackend(o);
    auto m = LoadModel(TestModelPath(), *backend);
    EXPECT_TRUE(m.ok()) << m.status();
    if (m.ok()) model = *std::move(m);
  }
  int layers() const { return model->config.n_layers; }

  // Runs ids at positions (and slots) pos0.. under plan; the last row's logits' argmax.
  int32_t Run(const ForwardPlan& plan, KvStore& kv, const int32_t* ids, int n, int pos0) {
    ForwardWorkspace ws(*backend);
    StepBatch batch;
    batch.AddSequence(0, ids, n, pos0, pos0, true);
    std::vector<float> logits;
    EXPECT_TRUE(Forward(*model, *backend, plan, batch, kv, ws, &logits).ok());
    const int V = model->config.vocab_size;
    int32_t best = 0;
    for (int i = 1; i < V; ++i) {
      if (logits[i] > logits[best]) best = i;
    }
    return best;
  }

  std::unique_ptr<ContiguousKvCache> Cache(int slots) {
    const ModelConfig& c = model->config;
    auto kv =
        ContiguousKvCache::Create({c.n_layers, c.n_kv_heads, c.head_dim, KvDtype::kF32}, 1, slots);
    EXPECT_TRUE(kv.ok());
    return *std::move(kv);
  }

  // Prompt tokens 0..n-2 under `plan` into a fresh cache with room for the generation.
  std::unique_ptr<ContiguousKvCache> Prefill(const std::vector<int32_t>& prompt,
                                             const ForwardPlan& plan) {
    const int n = static_cast<int>(prompt.size());
    auto kv = Cache(n + kNewTokens);
    ForwardWorkspace ws(*backend);
    StepBatch batch;
    batch.AddSequence(0, prompt.data(), n - 1, 0, 0, false);
    EXPECT_TRUE(Forward(*model, *backend, plan, batch, *kv, ws, nullptr).ok());
    return kv;
  }

  // eval-pop's runs: plain POP and the controls, on the last third of the layers. nokv and
  // shortgpt build on the full model's prefill (their skipped layers' prompt K/V are never read).
  std::vector<int32_t> Tokens(const std::vector<int32_t>& prompt, PopVariant v) {
    const int L = layers(), n = static_cast<int>(prompt.size());
    const std::vector<int> skipped = PopTailLayers(L, 1.0 / 3);
    const bool pop_prefill = v == PopVariant::kPop || v == PopVariant::kNoBoundary;
    auto kv =
        Prefill(prompt, pop_prefill ? ForwardPlan::PopPrefill(L, skipped) : ForwardPlan::Full(L));
    ForwardPlan dec = ForwardPlan::Full(L);
    std::vector<bool> hidden(L, false);
    if (v == PopVariant::kShortGpt) {
      for (int l : skipped) dec.layers[l] = LayerMode::kSkip;
    }
    if (v == PopVariant::kNoKv) {
      for (int l : skipped) hidden[l] = true;
    }
    HidingKvStore hiding(*kv, hidden, n - 1);
    std::vector<int32_t> out;
    if (v == PopVariant::kNoBoundary) {
      ForwardPlan pruned = ForwardPlan::PopPrefill(L, skipped);
      pruned.output_head = true;
      out.push_back(Run(pruned, *kv, &prompt.back(), 1, n - 1));
    } else {
      out.push_back(Run(dec, hiding, &prompt.back(), 1, n - 1));
    }
    while (static_cast<int>(out.size()) < kNewTokens) {
      const int32_t t = out.back();
      out.push_back(Run(dec, hiding, &t, 1, n - 1 + static_cast<int>(out.size())));
    }
    return out;
  }
};

Reference& Ref() {
  static Reference* r = new Reference();
  return *r;
}

std::unique_ptr<DecodeEngine> NewEngine(int tokens_per_step) {
  DecodeEngineOptions o;
  o.model_path = TestModelPath();
  o.precision = "fp32";
  o.kv_budget_bytes = size_t{64} << 20;
  o.max_tokens_per_step = tokens_per_step;
  auto e = DecodeEngine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? *std::move(e) : nullptr;
}

PopControl Control(PopVariant v, int n_prompt) {
  PopControl pc;
  pc.variant = v;
  pc.skipped = PopTailLayers(Ref().layers(), 1.0 / 3);
  pc.prompt_tokens = n_prompt;
  return pc;
}

const std::vector<PopVariant> kControls = {PopVariant::kNoBoundary, PopVariant::kNoKv,
                                           PopVariant::kShortGpt};

class PopControlEngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { SetComputeThreads(ComputeThreads()); }
};

TEST(PopControlTest, PlansAndBoundaries) {
  EXPECT_EQ(PopTailLayers(30, 1.0 / 3), (std::vector<int>{20, 21, 22, 23, 24, 25, 26, 27, 28, 29}));
  EXPECT_TRUE(PopTailLayers(30, 0).empty());
  EXPECT_EQ(PopTailLayers(30, 0.2).size(), 6u);
  EXPECT_EQ(ParsePopRatio("1/3"), 1.0 / 3);
  EXPECT_FALSE(ParsePopRatio("1").has_value());
  EXPECT_FALSE(ParsePopRatio("x").has_value());
  EXPECT_FALSE(ParsePopRatio("1/0").has_value());
  for (PopVariant v :
       {PopVariant::kPop, PopVariant::kNoBoundary, PopVariant::kNoKv, PopVariant::kShortGpt}) {
    EXPECT_EQ(ParsePopVariant(PopVariantName(v)), v);
  }
  EXPECT_FALSE(ParsePopVariant("nobound").has_value());

  PopControl pc{PopVariant::kNoKv, {2, 3}, 10};
  EXPECT_EQ(pc.boundary(), 9);
  EXPECT_EQ(pc.PromptPlan(4).DebugString(), "F2 S2 head");
  EXPECT_EQ(pc.DecodePlan(4).DebugString(), "F4 head");
  EXPECT_EQ(pc.HiddenLayers(4), (std::vector<bool>{false, false, true, true}));
  pc.variant = PopVariant::kNoBoundary;
  EXPECT_EQ(pc.boundary(), 10);
  EXPECT_EQ(pc.PromptPlan(4).DebugString(), "F2 K2 head");
  EXPECT_TRUE(pc.HiddenLayers(4).empty());
  pc.variant = PopVariant::kShortGpt;
  EXPECT_EQ(pc.boundary(), 0);
  EXPECT_EQ(pc.DecodePlan(4).DebugString(), "F2 S2 head");
  EXPECT_EQ(PopVariantPrefillPlan(4, {2, 3}, PopVariant::kPop).DebugString(), "F2 K2");
  EXPECT_EQ(PopVariantPrefillPlan(4, {2, 3}, PopVariant::kShortGpt).DebugString(), "F2 S2");
  // Keys: a control's never equals the plain plan's; inactive controls leave it alone.
  EXPECT_NE(pc.MixKey(7), 7u);
  EXPECT_NE(pc.MixKey(7), PopControl({PopVariant::kNoKv, {2, 3}, 10}).MixKey(7));
  EXPECT_EQ(PopControl({PopVariant::kPop, {2, 3}, 10}).MixKey(7), 7u);
  EXPECT_EQ(PopControl({PopVariant::kNoKv, {}, 10}).MixKey(7), 7u);
}

// The engine prefills itself, in chunks of 16 rows (the boundary falls inside a chunk), with plain
// sequences batched beside the controlled ones: each control equals eval-pop's reference, the
// plain sequences equal the same engine's tokens for them alone.
TEST_F(PopControlEngineTest, OwnPrefillMatchesTheReference) {
  auto e = NewEngine(16);
  ASSERT_NE(e, nullptr);
  std::vector<std::vector<int32_t>> alone;
  for (size_t i = 0; i < kLengths.size(); ++i) {
    alone.emplace_back();
    ASSERT_TRUE(e->Submit(Greedy(RandomPrompt(kLengths[i], 7 + i), &alone.back())).ok());
    ASSERT_TRUE(e->RunUntilIdle().ok());
  }
  std::deque<std::vector<int32_t>> got;
  for (size_t i = 0; i < kLengths.size(); ++i) {
    const std::vector<int32_t> prompt = RandomPrompt(kLengths[i], 7 + i);
    for (PopVariant v : kControls) {
      got.emplace_back();
      DecodeRequest r = Greedy(prompt, &got.back());
      r.pop_control = Control(v, kLengths[i]);
      ASSERT_TRUE(e->Submit(std::move(r)).ok());
    }
    got.emplace_back();
    ASSERT_TRUE(e->Submit(Greedy(prompt, &got.back())).ok());  // plain, in the same steps
  }
  ASSERT_TRUE(e->RunUntilIdle().ok());
  size_t k = 0;
  std::vector<int> differ(kControls.size(),
                          0);  // prompts on which a control's tokens are not POP's
  for (size_t i = 0; i < kLengths.size(); ++i) {
    const std::vector<int32_t> prompt = RandomPrompt(kLengths[i], 7 + i);
    const std::vector<int32_t> pop = Ref().Tokens(prompt, PopVariant::kPop);
    for (size_t j = 0; j < kControls.size(); ++j) {
      const PopVariant v = kControls[j];
      EXPECT_EQ(got[k], Ref().Tokens(prompt, v))
          << PopVariantName(v) << ", prompt of " << kLengths[i];
      differ[j] += got[k] != pop;
      ++k;
    }
    EXPECT_EQ(got[k++], alone[i]) << "plain, prompt of " << kLengths[i];
  }
  for (size_t j = 0; j < kControls.size(); ++j) {
    EXPECT_GE(differ[j], 1) << PopVariantName(kControls[j]) << " gave POP's tokens every time";
  }
  EXPECT_TRUE(e->cache().CheckConsistency().ok());
  EXPECT_EQ(e->cache().num_free_blocks(), e->cache().num_blocks());
}

// KV of tokens 0..n-2 as a prefill worker makes it for the control (PopVariantPrefillPlan: nokv
// and shortgpt write nothing in the skipped layers), adopted from a reservation: the tokens of the
// engine's own prefill and of the reference.
TEST_F(PopControlEngineTest, AdoptedPrefillMatchesTheReference) {
  auto e = NewEngine(256);
  ASSERT_NE(e, nullptr);
  const int L = Ref().layers();
  const std::vector<int32_t> prompt = RandomPrompt(kLengths[1], 8);
  const int n = static_cast<int>(prompt.size());
  for (PopVariant v : kControls) {
    const ForwardPlan plan = PopVariantPrefillPlan(L, PopTailLayers(L, 1.0 / 3), v);
    auto kv = Ref().Prefill(prompt, plan);
    absl::StatusOr<KvSnapshot> snap = ExportSnapshot(*kv, 0, n - 1);
    ASSERT_TRUE(snap.ok()) << snap.status();
    absl::StatusOr<KvReservation> r = e->ReserveKv(n - 1, plan.KvKey());
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(WriteSnapshot(*snap, *r->store, r->kv_seq).ok());
    std::vector<int32_t> got;
    DecodeRequest req = Greedy(prompt, &got);
    req.reserved_kv_seq = r->kv_seq;
    req.reserved_slots = n - 1;
    req.pop_control = Control(v, n);
    ASSERT_TRUE(e->Submit(std::move(req)).ok());
    ASSERT_TRUE(e->RunUntilIdle().ok());
    EXPECT_EQ(got, Ref().Tokens(prompt, v)) << PopVariantName(v);
  }
  EXPECT_EQ(e->stats().adopted, 3);
  EXPECT_EQ(e->cache().num_free_blocks(), e->cache().num_blocks());
}

// The default stays as it was: no control, "pop", or a control on no layers (ratio 0) give the
// same tokens, and POP's controls need no KV snapshot or trimming.
TEST_F(PopControlEngineTest, InactiveControlsAreBitIdenticalAndBadOnesRefused) {
  auto e = NewEngine(16);
  ASSERT_NE(e, nullptr);
  const std::vector<int32_t> prompt = RandomPrompt(kLengths[0], 9);
  std::vector<int32_t> plain, pop, none;
  ASSERT_TRUE(e->Submit(Greedy(prompt, &plain)).ok());
  DecodeRequest r = Greedy(prompt, &pop);
  r.pop_control = Control(PopVariant::kPop, kLengths[0]);
  ASSERT_TRUE(e->Submit(std::move(r)).ok());
  r = Greedy(prompt, &none);
  r.pop_control = Control(PopVariant::kShortGpt, kLengths[0]);
  r.pop_control.skipped.clear();
  ASSERT_TRUE(e->Submit(std::move(r)).ok());
  ASSERT_TRUE(e->RunUntilIdle().ok());
  EXPECT_EQ(plain.size(), static_cast<size_t>(kNewTokens));
  EXPECT_EQ(pop, plain);
  EXPECT_EQ(none, plain);

  std::vector<int32_t> sink;
  r = Greedy(prompt, &sink);
  r.pop_control = Control(PopVariant::kNoKv, kLengths[0]);
  r.pop_control.skipped = {0};  // layer 0 runs in full, always
  EXPECT_EQ(e->Validate(r).code(), absl::StatusCode::kInvalidArgument);
  r.pop_control = Control(PopVariant::kNoKv, kLengths[0] + 1);  // longer than the prompt
  EXPECT_EQ(e->Validate(r).code(), absl::StatusCode::kInvalidArgument);
  r.pop_control = Control(PopVariant::kNoKv, kLengths[0]);
  r.reserved_kv_seq = 0;
  r.reserved_slots = 3;
  r.reserved_trimmed = true;
  EXPECT_EQ(e->Validate(r).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tripod
