// PrefillEngine's layer-wise KV export (the sink) and per-request plans, on the bundled model:
//  - the sink hears of every layer exactly once per prompt chunk, in order, with the stacked
//    K/V-only layers as one range, and slot ranges that tile the prompt;
//  - the KV that the sink encodes into wire chunks (SplitKvRange + EncodeKvChunk) is, byte for
//    byte, the KV of the snapshot path (ratio 0 and 1/3, fp32 and the f16 cache of "auto");
//  - a cancel flag or a sink error stops the run between layers;
//  - POP's nokv control: every layer sent, zeros for the skipped ones;
//  - plan compatibility: a pruned worker runs only its own plan's KvKey, a full-weights worker
//    runs any plan.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/compute/cpu/cpu_backend.h"
#include "common/kv_transfer/kv_chunk_codec.h"
#include "common/kv_transfer/kv_sender.h"
#include "prefill_node/prefill_engine.h"
#include "prefill_node/prefill_service.h"
#include "tests/unit/test_model.h"
#include "xxhash.h"

namespace tripod {
namespace {

std::vector<int32_t> SomeIds(int n, int seed) {
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = 100 + (seed * 7919 + i * 104729) % 40000;
  return ids;
}

// Engines are shared by the tests of this file (loading one prepacks its weights).
PrefillEngine* Engine(const std::string& precision, double ratio, bool stack, int chunk = 16) {
  static std::map<std::string, std::unique_ptr<PrefillEngine>> engines;
  const std::string key = absl::StrCat(precision, "/", ratio, "/", stack, "/", chunk);
  auto it = engines.find(key);
  if (it != engines.end()) return it->second.get();
  PrefillOptions o;
  o.model_path = TestModelPath();
  o.precision = precision;
  o.pop.ratio = ratio;
  o.chunk = chunk;
  o.stack_kv = stack;
  auto e = PrefillEngine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status();
  if (!e.ok()) return nullptr;
  return (engines[key] = std::move(e).value()).get();
}

// What a sink saw: the ranges it was told, and the KV it encoded into wire chunks, decoded back
// into a snapshot's layout.
struct Collected {
  std::vector<KvRange> ranges;
  KvSnapshot kv;
  std::vector<int> hits;  // per (layer, slot): how many chunks carried it
  int chunks = 0;
};

KvSink CollectingSink(Collected& c, const KvLayout& layout, int m) {
  c.kv.layout = layout;
  c.kv.n_slots = m;
  const size_t rows = size_t{1} * layout.n_layers * layout.n_kv_heads * m;
  c.kv.k.assign(rows * c.kv.row_bytes(), 0);
  c.kv.v.assign(rows * c.kv.row_bytes(), 0);
  c.hits.assign(size_t{1} * layout.n_layers * m, 0);
  return [&c](KvStore& store, int32_t seq, const KvRange& r) -> absl::Status {
    c.ranges.push_back(r);
    const KvLayout l = store.layout();
    const size_t row = KvRowBytes(l.dtype, l.head_dim);
    for (const KvRange& p : SplitKvRange(l, r, kMaxKvChunkPayload)) {
      v1::KvChunk chunk;
      EncodeKvChunk(store, seq, p.layer_begin, p.layer_end, p.slot_begin, p.slot_end, &chunk);
      ++c.chunks;
      EXPECT_LE(chunk.payload().size(), kMaxKvChunkPayload);
      EXPECT_EQ(chunk.xxh3(), XXH3_64bits(chunk.payload().data(), chunk.payload().size()));
      const uint8_t* in = reinterpret_cast<const uint8_t*>(chunk.payload().data());
      for (int layer = p.layer_begin; layer < p.layer_end; ++layer) {
        for (std::vector<uint8_t>* dst : {&c.kv.k, &c.kv.v}) {
          for (int h = 0; h < l.n_kv_heads; ++h) {
            for (int s = p.slot_begin; s < p.slot_end; ++s, in += row) {
              std::memcpy(dst->data() + c.kv.offset(layer, h, s), in, row);
            }
          }
        }
        for (int s = p.slot_begin; s < p.slot_end; ++s)
          ++c.hits[size_t{1} * layer * c.kv.n_slots + s];
      }
    }
    return absl::OkStatus();
  };
}

TEST(PrefillSinkTest, EveryLayerOncePerChunkStackedAsOneRange) {
  const std::vector<int32_t> prompt = SomeIds(41, 1);  // 40 prefilled: chunks 16, 16, 8
  for (bool stack : {true, false}) {
    SCOPED_TRACE(stack ? "stacked" : "per layer");
    PrefillEngine* e = Engine("fp32", 1.0 / 3, stack);
    ASSERT_NE(e, nullptr);
    const int L = e->model().config.n_layers;
    ASSERT_EQ(e->skipped_layers().size(), 10u);
    const int first_skipped = e->skipped_layers().front();
    Collected c;
    PrefillRun run;
    const ModelConfig& mc = e->model().config;
    run.sink =
        CollectingSink(c, KvLayout{mc.n_layers, mc.n_kv_heads, mc.head_dim, e->kv_dtype()}, 40);
    auto r = e->Run(prompt, run);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->prefilled_tokens, 40);
    EXPECT_EQ(r->chunks, 3);
    EXPECT_EQ(r->kv.n_slots, 0) << "no snapshot with a sink";
    EXPECT_TRUE(r->kv.k.empty());
    EXPECT_EQ(r->plan_key, e->plan().KvKey());
    // Expected: per chunk, layers 0..19 one by one, then 20..29 as one range (stacked) or one by
    // one.
    std::vector<KvRange> want;
    for (const auto& [b, n] : {std::pair{0, 16}, std::pair{16, 16}, std::pair{32, 8}}) {
      for (int l = 0; l < first_skipped; ++l) want.push_back({l, l + 1, b, b + n});
      if (stack) {
        want.push_back({first_skipped, L, b, b + n});
      } else {
        for (int l = first_skipped; l < L; ++l) want.push_back({l, l + 1, b, b + n});
      }
    }
    ASSERT_EQ(c.ranges.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(c.ranges[i].layer_begin, want[i].layer_begin) << i;
      EXPECT_EQ(c.ranges[i].layer_end, want[i].layer_end) << i;
      EXPECT_EQ(c.ranges[i].slot_begin, want[i].slot_begin) << i;
      EXPECT_EQ(c.ranges[i].slot_end, want[i].slot_end) << i;
    }
    for (size_t i = 0; i < c.hits.size(); ++i) ASSERT_EQ(c.hits[i], 1) << "layer x slot " << i;
  }
}

// The sink's wire chunks carry exactly the snapshot path's KV.
TEST(PrefillSinkTest, SinkKvEqualsSnapshotKvByteForByte) {
  const std::vector<int32_t> prompt = SomeIds(41, 2);
  struct Case {
    const char* precision;
    double ratio;
  };
  for (const Case& k : {Case{"fp32", 0.0}, Case{"fp32", 1.0 / 3}, Case{"auto", 1.0 / 3}}) {
    SCOPED_TRACE(absl::StrCat(k.precision, " ratio ", k.ratio));
    PrefillEngine* e = Engine(k.precision, k.ratio, true);
    ASSERT_NE(e, nullptr);
    auto snap = e->Run(prompt);
    ASSERT_TRUE(snap.ok()) << snap.status();
    ASSERT_EQ(snap->kv.n_slots, 40);
    Collected c;
    PrefillRun run;
    run.sink = CollectingSink(c, snap->kv.layout, 40);
    auto r = e->Run(prompt, run);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(c.kv.k.size(), snap->kv.k.size());
    ASSERT_EQ(c.kv.v.size(), snap->kv.v.size());
    EXPECT_EQ(std::memcmp(c.kv.k.data(), snap->kv.k.data(), c.kv.k.size()), 0);
    EXPECT_EQ(std::memcmp(c.kv.v.data(), snap->kv.v.data(), c.kv.v.size()), 0);
    EXPECT_EQ(r->plan_key, snap->kv.plan_key);
  }
}

// POP's nokv and shortgpt controls (PrefillPlan.variant): the skipped layers run kSkip, no K/V
// projected, yet the sink still hears of every layer once per chunk (the decode side expects them
// all) and carries zeros for them; the kept layers' KV is plain POP's byte for byte. On this
// pruned worker the variant's plan is taken; an unknown variant or one with trimming is refused.
TEST(PrefillSinkTest, NoKvControlSendsEveryLayerAndZerosForTheSkipped) {
  const std::vector<int32_t> prompt = SomeIds(41, 3);
  PrefillEngine* e = Engine("fp32", 1.0 / 3, true);
  ASSERT_NE(e, nullptr);
  const int L = e->model().config.n_layers;
  v1::PrefillRequest req;
  req.mutable_prompt()->Assign(prompt.begin(), prompt.end());
  req.set_decode_address("127.0.0.1:1");
  req.set_transfer_id(5);
  req.mutable_plan()->set_pop_ratio("1/3");
  req.mutable_plan()->set_variant("nokv");
  absl::StatusOr<PrefillJob> job = JobFromRequest(*e, req);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->plan.DebugString(), "F20 S10");
  req.mutable_plan()->set_variant("pop");
  ASSERT_TRUE(JobFromRequest(*e, req).ok());
  EXPECT_EQ(JobFromRequest(*e, req)->plan.KvKey(), e->plan().KvKey());
  req.mutable_plan()->set_variant("halfkv");
  EXPECT_EQ(JobFromRequest(*e, req).status().code(), absl::StatusCode::kInvalidArgument);
  req.mutable_plan()->set_variant("shortgpt");
  req.mutable_trimming()->set_method(v1::TRIM_STREAMINGLLM);
  req.mutable_trimming()->set_budget(8);
  EXPECT_EQ(JobFromRequest(*e, req).status().code(), absl::StatusCode::kInvalidArgument);

  auto plain = e->Run(prompt);
  ASSERT_TRUE(plain.ok()) << plain.status();
  Collected c;
  PrefillRun run;
  run.plan = &job->plan;
  run.sink = CollectingSink(c, plain->kv.layout, 40);
  auto r = e->Run(prompt, run);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->plan_key, job->plan.KvKey());
  for (size_t i = 0; i < c.hits.size(); ++i) ASSERT_EQ(c.hits[i], 1) << "layer x slot " << i;
  const KvSnapshot& want = plain->kv;
  const size_t row = want.row_bytes();
  const std::vector<uint8_t> zeros(row, 0);
  for (int l = 0; l < L; ++l) {
    for (int h = 0; h < want.layout.n_kv_heads; ++h) {
      for (int s = 0; s < 40; ++s) {
        const size_t o = want.offset(l, h, s);
        const uint8_t* expect = l < 20 ? want.k.data() + o : zeros.data();
        ASSERT_EQ(std::memcmp(c.kv.k.data() + o, expect, row), 0) << "K layer " << l;
        expect = l < 20 ? want.v.data() + o : zeros.data();
        ASSERT_EQ(std::memcmp(c.kv.v.data() + o, expect, row), 0) << "V layer " << l;
      }
    }
  }
}

TEST(PrefillSinkTest, OneTokenPromptCallsNoSink) {
  PrefillEngine* e = Engine("fp32", 1.0 / 3, true);
  ASSERT_NE(e, nullptr);
  int calls = 0;
  PrefillRun run;
  run.sink = [&](KvStore&, int32_t, const KvRange&) {
    ++calls;
    return absl::OkStatus();
  };
  auto r = e->Run({42}, run);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(r->prefilled_tokens, 0);
  EXPECT_EQ(r->last_token, 42);
}

TEST(PrefillSinkTest, CancelStopsBetweenLayers) {
  PrefillEngine* e = Engine("fp32", 1.0 / 3, true);
  ASSERT_NE(e, nullptr);
  const std::vector<int32_t> prompt = SomeIds(41, 3);
  std::atomic<bool> cancel{false};
  std::vector<KvRange> seen;
  PrefillRun run;
  run.cancel = &cancel;
  run.sink = [&](KvStore&, int32_t, const KvRange& r) {
    seen.push_back(r);
    if (r.slot_begin == 16 && r.layer_begin == 5) cancel = true;  // as another thread would
    return absl::OkStatus();
  };
  auto r = e->Run(prompt, run);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();
  // Chunk 0 whole (20 kept layers + the stack), chunk 1 up to layer 5; nothing after.
  ASSERT_EQ(seen.size(), 21u + 6u);
  EXPECT_EQ(seen.back().layer_begin, 5);
  EXPECT_EQ(seen.back().slot_begin, 16);

  // A flag already set: nothing runs.
  seen.clear();
  auto r2 = e->Run(prompt, run);
  EXPECT_EQ(r2.status().code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(seen.empty());

  // Without a sink the flag is still honoured.
  PrefillRun no_sink;
  no_sink.cancel = &cancel;
  EXPECT_EQ(e->Run(prompt, no_sink).status().code(), absl::StatusCode::kCancelled);
  cancel = false;
  EXPECT_TRUE(e->Run(prompt, no_sink).ok());
}

TEST(PrefillSinkTest, SinkErrorStopsTheRun) {
  PrefillEngine* e = Engine("fp32", 1.0 / 3, true);
  ASSERT_NE(e, nullptr);
  int calls = 0;
  PrefillRun run;
  run.sink = [&](KvStore&, int32_t, const KvRange& r) {
    ++calls;
    return r.layer_begin == 3 ? absl::FailedPreconditionError("decode: lease expired")
                              : absl::OkStatus();
  };
  auto r = e->Run(SomeIds(41, 4), run);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.status().message(), "decode: lease expired");
  EXPECT_EQ(calls, 4);
}

TEST(PrefillPlanTest, PrunedWorkerRunsOnlyItsOwnKv) {
  PrefillEngine* e = Engine("fp32", 1.0 / 3, true);
  ASSERT_NE(e, nullptr);
  EXPECT_FALSE(e->full_weights());
  auto own = e->PlanFor(std::nullopt);
  ASSERT_TRUE(own.ok());
  EXPECT_EQ(own->KvKey(), e->plan().KvKey());
  auto same_ratio = e->PlanFor(PopConfig{1.0 / 3, std::nullopt});
  ASSERT_TRUE(same_ratio.ok()) << same_ratio.status();
  EXPECT_EQ(same_ratio->KvKey(), e->plan().KvKey());
  std::vector<int> tail;
  for (int l = 20; l < 30; ++l) tail.push_back(l);
  auto same_layers = e->PlanFor(PopConfig{0, tail});
  ASSERT_TRUE(same_layers.ok()) << same_layers.status();
  EXPECT_EQ(same_layers->KvKey(), e->plan().KvKey());

  auto full = e->PlanFor(PopConfig{0.0, std::nullopt});
  EXPECT_EQ(full.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(full.status().message().find("F30"), std::string::npos) << full.status();
  EXPECT_NE(full.status().message().find("F20 K10"), std::string::npos) << full.status();
  EXPECT_EQ(e->PlanFor(PopConfig{0.2, std::nullopt}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(e->PlanFor(PopConfig{1.5, std::nullopt}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(e->PlanFor(PopConfig{0, std::vector<int>{0, 5}}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PrefillPlanTest, FullWeightsWorkerRunsAnyPlan) {
  PrefillEngine* full = Engine("fp32", 0.0, true);
  PrefillEngine* pruned = Engine("fp32", 1.0 / 3, true);
  ASSERT_NE(full, nullptr);
  ASSERT_NE(pruned, nullptr);
  EXPECT_TRUE(full->full_weights());
  const std::vector<int32_t> prompt = SomeIds(41, 5);
  auto plan = full->PlanFor(PopConfig{1.0 / 3, std::nullopt});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->KvKey(), pruned->plan().KvKey());
  PrefillRun run;
  run.plan = &*plan;
  auto a = full->Run(prompt, run);
  auto b = pruned->Run(prompt);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->plan_key, b->plan_key);
  EXPECT_EQ(a->kv.plan_key, pruned->plan().KvKey());
  // Kept layers: the same computation. K/V-only layers: the full Q|K|V weights instead of the
  // stacked K/V GEMM, equal up to rounding (the plan is honoured: they differ from full KV).
  const KvSnapshot& x = a->kv;
  const KvSnapshot& y = b->kv;
  ASSERT_EQ(x.k.size(), y.k.size());
  const size_t per_layer = size_t{1} * x.layout.n_kv_heads * x.n_slots * x.layout.head_dim;
  for (int l = 0; l < x.layout.n_layers; ++l) {
    const float* px = reinterpret_cast<const float*>(x.k.data()) + l * per_layer;
    const float* py = reinterpret_cast<const float*>(y.k.data()) + l * per_layer;
    double diff = 0, mag = 0;
    for (size_t i = 0; i < per_layer; ++i) {
      diff = std::max(diff, std::abs(double{px[i]} - py[i]));
      mag = std::max(mag, std::abs(double{py[i]}));
    }
    if (l < 20) {
      EXPECT_EQ(diff, 0.0) << "kept layer " << l;
    } else {
      EXPECT_LT(diff, 1e-4 * mag) << "K/V-only layer " << l;
    }
  }
  // And the worker's own plan on the full weights is the full model's KV, which the K/V-only
  // layers' is not.
  auto own = full->Run(prompt);
  ASSERT_TRUE(own.ok());
  const size_t l25 = 25 * per_layer * sizeof(float);
  EXPECT_NE(std::memcmp(own->kv.k.data() + l25, x.k.data() + l25, per_layer * sizeof(float)), 0);
}

}  // namespace
}  // namespace tripod
