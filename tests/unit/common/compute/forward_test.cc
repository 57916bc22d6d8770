// Forward-pass properties on the bundled model: chunking and multi-sequence batching leave the
// logits unchanged (fp32 path), bad batches are rejected, the K/V hook hears of each written layer
// once, in order, after its K/V is in the store, and its error stops the pass. Exact values are
// checked against the NumPy reference in tests/reference/.
#include "common/compute/forward.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "common/compute/cpu/cpu_backend.h"
#include "common/compute/forwarding_backend.h"
#include "common/kv/contiguous_kv_cache.h"
#include "tests/unit/test_model.h"

namespace tripod {
namespace {

class ForwardTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = TestModelPath();
    backend_ = MakeCpuBackend(*CpuOptionsForPrecision("fp32")).release();
    auto m = LoadModel(path, *backend_);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = m->release();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete backend_;
    model_ = nullptr;
    backend_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(model_, nullptr) << "the model did not load"; }

  std::unique_ptr<ContiguousKvCache> NewCache(int n_seqs, int capacity) {
    const ModelConfig& c = model_->config;
    KvLayout layout{c.n_layers, c.n_kv_heads, c.head_dim, KvDtype::kF32};
    return *ContiguousKvCache::Create(layout, n_seqs, capacity);
  }

  // Logits of the last token of `ids`, prefilled `chunk` tokens at a time.
  std::vector<float> LastLogits(const std::vector<int32_t>& ids, int chunk) {
    auto kv = NewCache(1, 256);
    ForwardWorkspace ws(*backend_);
    const ForwardPlan plan = ForwardPlan::Full(model_->config.n_layers);
    std::vector<float> logits;
    for (size_t b = 0; b < ids.size(); b += chunk) {
      const int n = static_cast<int>(std::min<size_t>(chunk, ids.size() - b));
      StepBatch batch;
      batch.AddSequence(0, ids.data() + b, n, static_cast<int>(b), static_cast<int>(b),
                        b + n == ids.size());
      EXPECT_TRUE(Forward(*model_, *backend_, plan, batch, *kv, ws, &logits).ok());
    }
    return logits;
  }

  static Backend* backend_;
  static LoadedModel* model_;
};
Backend* ForwardTest::backend_ = nullptr;
LoadedModel* ForwardTest::model_ = nullptr;

double RelL2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * double(a[i] - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

int Argmax(const std::vector<float>& v) {
  return static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin());
}

std::vector<int32_t> SomeIds(int n, int seed) {
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = 100 + (seed * 7919 + i * 104729) % 40000;
  return ids;
}

TEST_F(ForwardTest, ChunkedPrefillMatchesWholePrefill) {
  const std::vector<int32_t> ids = SomeIds(40, 1);
  const std::vector<float> whole = LastLogits(ids, 40);
  ASSERT_EQ(whole.size(), static_cast<size_t>(model_->config.vocab_size));
  for (int chunk : {1, 7, 16}) {
    const std::vector<float> part = LastLogits(ids, chunk);
    EXPECT_LT(RelL2(part, whole), 1e-4) << "chunk " << chunk;
    EXPECT_EQ(Argmax(part), Argmax(whole)) << "chunk " << chunk;
  }
}

TEST_F(ForwardTest, BatchOfSequencesMatchesEachAlone) {
  const std::vector<int32_t> a = SomeIds(13, 2), b = SomeIds(29, 3), c = SomeIds(5, 4);
  auto kv = NewCache(3, 64);
  ForwardWorkspace ws(*backend_);
  StepBatch batch;
  batch.AddSequence(0, a.data(), 13, 0, 0, true);
  batch.AddSequence(1, b.data(), 29, 0, 0, true);
  batch.AddSequence(2, c.data(), 5, 0, 0, true);
  std::vector<float> logits;
  ASSERT_TRUE(Forward(*model_, *backend_, ForwardPlan::Full(model_->config.n_layers), batch, *kv,
                      ws, &logits)
                  .ok());
  const size_t V = model_->config.vocab_size;
  ASSERT_EQ(logits.size(), 3 * V);
  int i = 0;
  for (const auto* ids : {&a, &b, &c}) {
    const std::vector<float> alone = LastLogits(*ids, static_cast<int>(ids->size()));
    const std::vector<float> in_batch(logits.begin() + i * V, logits.begin() + (i + 1) * V);
    EXPECT_LT(RelL2(in_batch, alone), 1e-4) << "sequence " << i;
    EXPECT_EQ(Argmax(in_batch), Argmax(alone));
    ++i;
  }
}

TEST_F(ForwardTest, RejectsOutOfVocabularyToken) {
  auto kv = NewCache(1, 8);
  ForwardWorkspace ws(*backend_);
  StepBatch batch;
  const int32_t bad[] = {1, model_->config.vocab_size};
  batch.AddSequence(0, bad, 2, 0, 0, true);
  std::vector<float> logits;
  const absl::Status s = Forward(*model_, *backend_, ForwardPlan::Full(model_->config.n_layers),
                                 batch, *kv, ws, &logits);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("vocabulary"), std::string::npos) << s;
}

TEST_F(ForwardTest, RejectsPlanOfWrongDepth) {
  auto kv = NewCache(1, 8);
  ForwardWorkspace ws(*backend_);
  StepBatch batch;
  const int32_t ids[] = {1, 2};
  batch.AddSequence(0, ids, 2, 0, 0, true);
  std::vector<float> logits;
  EXPECT_FALSE(Forward(*model_, *backend_, ForwardPlan::Full(3), batch, *kv, ws, &logits).ok());
}

// Whether any K element of `layer` in slots [0, n) of sequence 0 is non-zero (the cache starts
// zeroed).
bool LayerWritten(KvStore& kv, int layer, int n) {
  const KvLayout l = kv.layout();
  const KvLayerRef ref = kv.Layer(0, layer);
  std::vector<float> row(l.head_dim);
  for (int s = 0; s < n; ++s) {
    ref.ReadK(s, 0, l.head_dim, reinterpret_cast<uint8_t*>(row.data()));
    for (float x : row) {
      if (x != 0.0f) return true;
    }
  }
  return false;
}

TEST_F(ForwardTest, KvHookHearsOfEachWrittenLayerOnceInOrder) {
  const int L = model_->config.n_layers;
  const std::vector<int32_t> ids = SomeIds(9, 5);
  // POP on the full weights (each K/V-only layer on its own, no stack) and a self-draft, whose
  // skipped layers write nothing and are not reported.
  std::vector<int> skipped;
  for (int l = L - 10; l < L; ++l) skipped.push_back(l);
  for (const auto& [plan, written] : {std::pair{ForwardPlan::PopPrefill(L, skipped), L},
                                      std::pair{ForwardPlan::SelfDraft(L, 7), 7}}) {
    SCOPED_TRACE(plan.DebugString());
    auto kv = NewCache(1, 16);
    ForwardWorkspace ws(*backend_);
    StepBatch batch;
    batch.AddSequence(0, ids.data(), 9, 0, 0, false);
    std::vector<std::pair<int, int>> calls;
    const absl::Status s =
        Forward(*model_, *backend_, plan, batch, *kv, ws, nullptr, [&](int begin, int end) {
          calls.emplace_back(begin, end);
          // This layer's K/V is in the store; the next layer's is not yet.
          EXPECT_TRUE(LayerWritten(*kv, begin, 9)) << "layer " << begin;
          if (end < L) {
            EXPECT_FALSE(LayerWritten(*kv, end, 9)) << "layer " << end;
          }
          return absl::OkStatus();
        });
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_EQ(calls.size(), static_cast<size_t>(written));
    for (int l = 0; l < written; ++l) EXPECT_EQ(calls[l], std::make_pair(l, l + 1));
  }
}

TEST_F(ForwardTest, KvHookErrorStopsTheForward) {
  const int L = model_->config.n_layers;
  const std::vector<int32_t> ids = SomeIds(5, 6);
  auto kv = NewCache(1, 8);
  ForwardWorkspace ws(*backend_);
  StepBatch batch;
  batch.AddSequence(0, ids.data(), 5, 0, 0, true);
  std::vector<float> logits;
  int last = -1;
  const absl::Status s = Forward(
      *model_, *backend_, ForwardPlan::Full(L), batch, *kv, ws, &logits, [&](int begin, int) {
        last = begin;
        return begin == 3 ? absl::CancelledError("stop at 3") : absl::OkStatus();
      });
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(s.message(), "stop at 3");
  EXPECT_EQ(last, 3);
  EXPECT_FALSE(LayerWritten(*kv, 4, 5));
  EXPECT_TRUE(logits.empty());
}

// Logs the calls a graph step cares about: where a step begins, the ops inside, where it ends.
class StepLog final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  std::vector<std::string> calls;
  void BeginGraphStep() override { calls.push_back("begin"); }
  void Embed(const GgufTensorInfo& t, std::span<const int32_t> ids, float* out,
             int64_t ld) override {
    calls.push_back("embed");
    ForwardingBackend::Embed(t, ids, out, ld);
  }
  void FromHost(const float* src, size_t n, float* dst) override {
    calls.push_back("from_host");
    ForwardingBackend::FromHost(src, n, dst);
  }
  void Attention(std::span<const AttentionArgs> seqs) override {
    calls.push_back("attention");
    ForwardingBackend::Attention(seqs);
  }
  void AttentionScores(std::span<const AttentionScoreArgs> seqs) override {
    calls.push_back("scores");
    ForwardingBackend::AttentionScores(seqs);
  }
  void ToHost(const float* src, size_t n, float* dst) override {
    calls.push_back("to_host");
    ForwardingBackend::ToHost(src, n, dst);
  }
};

// A decode step (one token per sequence, logits wanted, nothing heard between layers) is marked
// as a graph step before its first op and ends with its only ToHost; a step with more tokens, no
// logits, a K/V hook or captured attention is not marked, since a backend could not replay it
// whole. The logits are the same either way.
TEST_F(ForwardTest, DecodeStepsAreMarkedAsGraphSteps) {
  const int L = model_->config.n_layers;
  const std::vector<int32_t> ids = SomeIds(12, 7);
  auto kv = NewCache(2, 32);
  StepLog log(*backend_);
  ForwardWorkspace ws(log);
  const ForwardPlan plan = ForwardPlan::Full(L);
  std::vector<float> logits;
  StepBatch pre;
  pre.AddSequence(0, ids.data(), 6, 0, 0, true);
  pre.AddSequence(1, ids.data() + 6, 6, 0, 0, true);
  ASSERT_TRUE(Forward(*model_, log, plan, pre, *kv, ws, &logits).ok());
  EXPECT_EQ(std::count(log.calls.begin(), log.calls.end(), "begin"), 0);

  auto decode = [&](int pos) {
    StepBatch b;
    const int32_t t[2] = {ids[0], ids[1]};
    b.AddSequence(0, &t[0], 1, pos, pos, true);
    b.AddSequence(1, &t[1], 1, pos, pos, true);
    return b;
  };
  log.calls.clear();
  ASSERT_TRUE(Forward(*model_, log, plan, decode(6), *kv, ws, &logits).ok());
  ASSERT_FALSE(log.calls.empty());
  EXPECT_EQ(log.calls.front(), "begin");
  EXPECT_EQ(log.calls.back(), "to_host");
  EXPECT_EQ(std::count(log.calls.begin(), log.calls.end(), "begin"), 1);
  EXPECT_EQ(std::count(log.calls.begin(), log.calls.end(), "to_host"), 1);
  EXPECT_EQ(std::count(log.calls.begin(), log.calls.end(), "attention"), L);
  const std::vector<float> marked = logits;

  // The same step, unmarked, on the CPU backend directly: the same logits.
  auto kv2 = NewCache(2, 32);
  ForwardWorkspace ws2(*backend_);
  ASSERT_TRUE(Forward(*model_, *backend_, plan, pre, *kv2, ws2, &logits).ok());
  ASSERT_TRUE(Forward(*model_, *backend_, plan, decode(6), *kv2, ws2, &logits).ok());
  EXPECT_EQ(logits, marked);

  // Not graph steps: no logits; a K/V hook; captured attention.
  log.calls.clear();
  ASSERT_TRUE(Forward(*model_, log, plan, decode(7), *kv, ws, nullptr).ok());
  ASSERT_TRUE(Forward(*model_, log, plan, decode(7), *kv, ws, &logits, [](int, int) {
                return absl::OkStatus();
              }).ok());
  ForwardPlan scoring = plan;
  scoring.capture.window = 1;
  scoring.capture.layers.assign(L, 1);
  std::vector<CapturedAttention> captured;
  ASSERT_TRUE(Forward(*model_, log, scoring, decode(7), *kv, ws, &logits, {}, &captured).ok());
  EXPECT_EQ(std::count(log.calls.begin(), log.calls.end(), "begin"), 0);
  EXPECT_GT(std::count(log.calls.begin(), log.calls.end(), "scores"), 0);
}

// A pass that outputs no logits (a prefill worker's) leaves only K/V behind, so the last layer
// writes its K/V and stops: one attention call fewer, and the KV it leaves is the same as a pass
// with logits leaves (the next token's logits agree bit for bit on the fp32 path).
TEST_F(ForwardTest, APassWithoutLogitsStopsTheLastLayerAfterItsKv) {
  const int L = model_->config.n_layers;
  const std::vector<int32_t> ids = SomeIds(21, 5);
  const ForwardPlan plan = ForwardPlan::Full(L);
  std::vector<float> logits;
  auto next_logits = [&](KvStore& kv, ForwardWorkspace& ws) {
    StepBatch b;
    b.AddSequence(0, ids.data() + 20, 1, 20, 20, true);
    EXPECT_TRUE(Forward(*model_, *backend_, plan, b, kv, ws, &logits).ok());
    return logits;
  };
  StepLog log(*backend_);
  auto kv_with = NewCache(1, 32);
  ForwardWorkspace ws_with(log);
  StepBatch with;
  with.AddSequence(0, ids.data(), 20, 0, 0, true);
  ASSERT_TRUE(Forward(*model_, log, plan, with, *kv_with, ws_with, &logits).ok());
  EXPECT_EQ(std::count(log.calls.begin(), log.calls.end(), "attention"), L);
  const std::vector<float> want = next_logits(*kv_with, ws_with);

  // A row asks for logits but no vector takes them; a vector is given but no row asks.
  for (bool vector : {false, true}) {
    log.calls.clear();
    auto kv = NewCache(1, 32);
    ForwardWorkspace ws(log);
    StepBatch without;
    without.AddSequence(0, ids.data(), 20, 0, 0, /*logits=*/!vector);
    ASSERT_TRUE(Forward(*model_, log, plan, without, *kv, ws, vector ? &logits : nullptr).ok());
    EXPECT_EQ(std::count(log.calls.begin(), log.calls.end(), "attention"), L - 1);
    EXPECT_EQ(next_logits(*kv, ws), want) << "output vector " << vector;
  }
}

}  // namespace
}  // namespace tripod
