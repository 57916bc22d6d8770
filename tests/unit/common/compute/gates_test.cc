// ForwardPlan::gates: gate 1 leaves the forward bit-identical, gate 0 equals skipping the layer,
// gates in between act as a smooth scalar on the branches; and Backend::AddScaled itself.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "common/compute/cpu/cpu_backend.h"
#include "common/compute/forward.h"
#include "common/kv/contiguous_kv_cache.h"
#include "tests/unit/test_model.h"

namespace tripod {
namespace {

class GatesTest : public ::testing::Test {
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
  }
  void SetUp() override { ASSERT_NE(model_, nullptr); }

  // Logits of every position of a fixed 24-token prompt under `plan`.
  std::vector<float> Logits(const ForwardPlan& plan) {
    const ModelConfig& c = model_->config;
    auto kv =
        *ContiguousKvCache::Create({c.n_layers, c.n_kv_heads, c.head_dim, KvDtype::kF32}, 1, 64);
    ForwardWorkspace ws(*backend_);
    std::vector<int32_t> ids;
    for (int i = 0; i < 24; ++i) ids.push_back(1 + (i * 7919) % 40000);
    StepBatch b;
    b.AddSequence(0, ids.data(), 24, 0, 0, false);
    for (int r = 0; r < 24; ++r) b.logit_rows.push_back(r);
    std::vector<float> logits;
    EXPECT_TRUE(Forward(*model_, *backend_, plan, b, *kv, ws, &logits).ok());
    return logits;
  }
  ForwardPlan Gated(int layer, float g) {
    ForwardPlan p = ForwardPlan::Full(model_->config.n_layers);
    p.gates.assign(model_->config.n_layers, 1.0f);
    p.gates[layer] = g;
    return p;
  }

  static Backend* backend_;
  static LoadedModel* model_;
};
Backend* GatesTest::backend_ = nullptr;
LoadedModel* GatesTest::model_ = nullptr;

double Dist(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (a[i] - double(b[i])) * (a[i] - double(b[i]));
  return std::sqrt(s);
}

TEST_F(GatesTest, GateOneIsBitIdentical) {
  const int L = model_->config.n_layers;
  const std::vector<float> plain = Logits(ForwardPlan::Full(L));
  EXPECT_EQ(Logits(Gated(7, 1.0f)), plain);
}

TEST_F(GatesTest, GateZeroEqualsSkippingTheLayer) {
  const int L = model_->config.n_layers;
  for (int l : {3, L - 1}) {
    ForwardPlan skip = ForwardPlan::Full(L);
    skip.layers[l] = LayerMode::kSkip;
    const std::vector<float> want = Logits(skip);
    EXPECT_EQ(Logits(Gated(l, 0.0f)), want) << "layer " << l;
    EXPECT_GT(Dist(want, Logits(ForwardPlan::Full(L))), 1.0) << "the layer matters";
  }
}

TEST_F(GatesTest, GatesBetweenActSmoothly) {
  const int L = model_->config.n_layers, l = 12;
  const std::vector<float> one = Logits(ForwardPlan::Full(L));
  // Just below 1 the scaled path runs; it must agree with the accumulating path.
  const std::vector<float> near = Logits(Gated(l, std::nextafter(1.0f, 0.0f)));
  EXPECT_LT(Dist(near, one), 1e-3 * std::sqrt(double(one.size())));
  // A central second difference is second order in e, the first difference first order.
  const float e = 0.02f;
  const std::vector<float> up = Logits(Gated(l, 1 + e)), down = Logits(Gated(l, 1 - e));
  std::vector<float> second(one.size());
  for (size_t i = 0; i < one.size(); ++i) second[i] = up[i] + down[i] - 2 * one[i];
  const double first = Dist(up, down);
  EXPECT_GT(first, 1e-3);
  EXPECT_LT(Dist(second, std::vector<float>(one.size(), 0.0f)), 0.1 * first);
  // Halfway lies between the ends: closer to each end than the ends are to each other.
  const std::vector<float> zero = Logits(Gated(l, 0.0f)), half = Logits(Gated(l, 0.5f));
  EXPECT_LT(Dist(half, zero), Dist(one, zero));
  EXPECT_LT(Dist(half, one), Dist(one, zero));
}

TEST_F(GatesTest, AddScaledOp) {
  float* x = backend_->Alloc(2 * 5);
  float* y = backend_->Alloc(2 * 6);
  for (int i = 0; i < 10; ++i) x[i] = float(i);
  for (int i = 0; i < 12; ++i) y[i] = 1.0f;
  backend_->AddScaled(x, 5, 0.5f, 2, 4, y, 6);
  EXPECT_FLOAT_EQ(y[0], 1.0f);
  EXPECT_FLOAT_EQ(y[3], 2.5f);
  EXPECT_FLOAT_EQ(y[4], 1.0f);  // past n: untouched
  EXPECT_FLOAT_EQ(y[6], 3.5f);  // row 1 = x[5] * 0.5 + 1
  EXPECT_FLOAT_EQ(y[9], 5.0f);
  backend_->Free(x);
  backend_->Free(y);
}

TEST_F(GatesTest, WrongGateCountIsRejected) {
  const ModelConfig& c = model_->config;
  auto kv = *ContiguousKvCache::Create({c.n_layers, c.n_kv_heads, c.head_dim, KvDtype::kF32}, 1, 8);
  ForwardWorkspace ws(*backend_);
  ForwardPlan p = ForwardPlan::Full(c.n_layers);
  p.gates = {1.0f, 0.5f};
  const int32_t id = 5;
  StepBatch b;
  b.AddSequence(0, &id, 1, 0, 0, true);
  std::vector<float> logits;
  EXPECT_FALSE(Forward(*model_, *backend_, p, b, *kv, ws, &logits).ok());
}

}  // namespace
}  // namespace tripod
