// Tests for DnnlLinear: fp32 and bf16 matmuls against a double reference, strided rows, many m
// (more than the primitive cache holds) and bad arguments.
#include "common/compute/cpu/gemm_onednn.h"

#include <cmath>
#include <random>
#include <vector>

#include "common/compute/cpu/cpu_features.h"
#include "gtest/gtest.h"

namespace tripod {
namespace {

void Check(GemmPrecision prec, int64_t n, int64_t k, const std::vector<int64_t>& ms) {
  std::mt19937 rng(42);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> w(n * k);
  for (float& v : w) v = nd(rng);
  auto lin = DnnlLinear::Create(w.data(), n, k, prec);
  const CpuFeatures& f = GetCpuFeatures();
  if (prec == GemmPrecision::kBF16 && !f.amx_bf16 && !f.avx512bf16) {
    // Without bf16 hardware the contract is a clear Unimplemented error, not a slow emulation.
    EXPECT_EQ(lin.status().code(), absl::StatusCode::kUnimplemented) << lin.status();
    return;
  }
  ASSERT_TRUE(lin.ok()) << lin.status();
  EXPECT_EQ((*lin)->n(), n);
  EXPECT_EQ((*lin)->k(), k);
  EXPECT_GT((*lin)->packed_bytes(), 0u);
  // bf16 rounds both operands to 8 significant bits: ~2^-8 relative per product.
  const double rel = prec == GemmPrecision::kF32 ? 1e-5 : 1.2e-2;
  for (int64_t m : ms) {
    const int64_t ldx = k + 7, ldy = n + 3;
    std::vector<float> x(m * ldx);
    for (float& v : x) v = nd(rng);
    std::vector<float> y(m * ldy, -3.0f);
    (*lin)->Run(x.data(), m, ldx, y.data(), ldy);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double ref = 0, mag = 0;
        for (int64_t t = 0; t < k; ++t) {
          ref += double(x[i * ldx + t]) * w[j * k + t];
          mag += std::fabs(double(x[i * ldx + t]) * w[j * k + t]);
        }
        ASSERT_NEAR(y[i * ldy + j], ref, rel * mag + 1e-5) << "m=" << m << " i=" << i << " j=" << j;
      }
      for (int64_t j = n; j < ldy; ++j) ASSERT_EQ(y[i * ldy + j], -3.0f);
    }
  }
}

TEST(DnnlLinearTest, F32) { Check(GemmPrecision::kF32, 67, 96, {1, 5, 64, 130, 5}); }

TEST(DnnlLinearTest, F32ManyShapesEvictCache) {
  std::vector<int64_t> ms;
  for (int64_t m = 1; m <= 20; ++m) ms.push_back(m);
  ms.push_back(3);
  Check(GemmPrecision::kF32, 40, 64, ms);
}

TEST(DnnlLinearTest, Bf16) { Check(GemmPrecision::kBF16, 96, 128, {1, 17, 200}); }

TEST(DnnlLinearTest, RejectsBadShape) {
  std::vector<float> w(4, 1.0f);
  EXPECT_FALSE(DnnlLinear::Create(w.data(), 0, 4, GemmPrecision::kF32).ok());
  EXPECT_FALSE(DnnlLinear::Create(nullptr, 2, 2, GemmPrecision::kF32).ok());
}

}  // namespace
}  // namespace tripod
