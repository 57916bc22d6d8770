// Tests for the CPU backend's elementwise ops against double-precision references.
#include "common/compute/cpu/cpu_backend.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/compute/cpu/cpu_features.h"
#include "common/compute/cpu/quant_gemv.h"
#include "common/model/gguf.h"
#include "common/model/quant_types.h"
#include "gtest/gtest.h"

namespace tripod {
namespace {

// SwiGLU computes e^-g inline (vectorised); it must stay within a few ulp of silu(g) * u over
// the whole range, including where e^-g over- or underflows.
TEST(CpuBackendTest, SwiGluMatchesDoubleReference) {
  std::unique_ptr<Backend> b = MakeCpuBackend(CpuBackendOptions{});
  const int m = 3, n = 1000;
  std::vector<float> gu(size_t{m} * 2 * n), out(size_t{m} * n, -1.0f);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> wide(-120.0f, 120.0f), narrow(-8.0f, 8.0f);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      gu[i * 2 * n + j] = j % 3 == 0 ? wide(rng) : narrow(rng);
      gu[i * 2 * n + n + j] = narrow(rng);
    }
  }
  const float edges[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 87.0f, -87.0f, 88.5f, -88.5f, 1e4f, -1e4f};
  for (int j = 0; j < 10; ++j) gu[j] = edges[j];
  b->SwiGlu(gu.data(), 2 * n, m, n, out.data(), n);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      const double g = gu[i * 2 * n + j], u = gu[i * 2 * n + n + j];
      const double ref = g / (1.0 + std::exp(-g)) * u;
      const double got = out[i * n + j];
      ASSERT_TRUE(std::isfinite(got)) << "g=" << g;
      // Below 1e-30 (g < -70) the clamped exponent only moves values that are zero to the model.
      ASSERT_NEAR(got, ref, 1e-6 * std::fabs(ref) + 1e-30) << "g=" << g << " u=" << u;
    }
  }
}

}  // namespace
}  // namespace tripod

namespace tripod {
namespace {

// The precision names pick the GEMV modes the README's table gives: fp32 exact throughout, int16
// and int8 for every batch size, auto's int16 below kBf16MinRows rows; an unknown name is refused
// with the names that exist.
TEST(CpuBackendTest, PrecisionNamesPickTheirGemvModes) {
  const CpuBackendOptions fp32 = *CpuOptionsForPrecision("fp32");
  EXPECT_EQ(fp32.gemv, GemvMode::kF32);
  EXPECT_EQ(fp32.gemv_few_rows, GemvMode::kF32);
  EXPECT_EQ(fp32.kv, KvDtype::kF32);
  const CpuBackendOptions i16 = *CpuOptionsForPrecision("int16");
  EXPECT_EQ(i16.gemv, GemvMode::kInt16);
  EXPECT_EQ(i16.gemv_few_rows, GemvMode::kInt16);
  EXPECT_EQ(i16.gemm, GemmPrecision::kF32);
  const CpuBackendOptions i8 = *CpuOptionsForPrecision("int8");
  EXPECT_EQ(i8.gemv_few_rows, GemvMode::kInt8);
  const CpuBackendOptions aut = *CpuOptionsForPrecision("auto");
  EXPECT_EQ(aut.gemv_few_rows, GemvMode::kInt16);
  // bf16 GEMVs and GEMMs only where bf16 products are fast (AMX for the GEMM; AVX512_BF16 dots
  // at the fp32 FMAs' rate for both): on an Intel core without AMX, fp32 and int16.
  const CpuFeatures& cpu = GetCpuFeatures();
  EXPECT_TRUE(!cpu.bf16_dot_fast || cpu.avx512bf16);
  EXPECT_EQ(aut.gemv, cpu.bf16_dot_fast ? GemvMode::kBf16 : GemvMode::kInt16);
  EXPECT_EQ(aut.gemm,
            cpu.bf16_dot_fast || cpu.amx_bf16 ? GemmPrecision::kBF16 : GemmPrecision::kF32);
  EXPECT_EQ(aut.kv, KvDtype::kF16);
  // Without bf16 hardware (here: under an AVX2 cap) auto takes the fp32 tile GEMV for larger
  // batches, instead of oneDNN's fp32 GEMM up to 64 rows; int16 and fp32 never do.
  SetIsaCap(IsaLevel::kAvx2);
  if (ActiveIsa() == IsaLevel::kAvx2) {
    const CpuBackendOptions capped = *CpuOptionsForPrecision("auto");
    EXPECT_EQ(capped.gemv, GemvMode::kInt16);
    EXPECT_GT(capped.gemv_tile_min_rows, kBf16MinRows);
    EXPECT_GE(capped.gemv_max_rows, 64);
    EXPECT_EQ(CpuOptionsForPrecision("int16")->gemv_tile_min_rows, 0);
  }
  SetIsaCap(IsaLevel::kAmx);
  EXPECT_EQ(fp32.gemv_tile_min_rows, 0);
  if (cpu.bf16_dot_fast || cpu.amx_bf16) {
    EXPECT_EQ(aut.gemv_tile_min_rows, 0);
  } else if (ActiveIsa() >= IsaLevel::kAvx2) {
    EXPECT_GT(aut.gemv_tile_min_rows, kBf16MinRows);
  }
  const absl::StatusOr<CpuBackendOptions> bad = CpuOptionsForPrecision("int4");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("int16"), std::string::npos) << bad.status();
}

// A backend's Linear takes the few-rows mode below kBf16MinRows rows and the other mode from
// there: with fp32 few rows and int8 otherwise, 1-3 rows give QuantGemm's fp32 bits and 4 rows
// its int8 bits.
TEST(CpuBackendTest, LinearPicksTheGemvModeByRows) {
  CpuBackendOptions o;
  o.gemv = GemvMode::kInt8;
  o.gemv_few_rows = GemvMode::kF32;
  o.prepack_at_load = false;
  std::unique_ptr<Backend> be = MakeCpuBackend(o);
  const int64_t n = 24, k = 64;
  std::vector<uint8_t> bytes(n * (k / 32) * 34);
  std::mt19937 rng(4);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
  for (int64_t blk = 0; blk < n * (k / 32); ++blk) {
    const uint16_t h = Fp32ToFp16(0.02f);
    std::memcpy(&bytes[blk * 34], &h, 2);
  }
  GgufTensorInfo t;
  t.name = "w";
  t.type = GgmlType::kQ8_0;
  t.dims = {k, n};
  t.data = bytes.data();
  t.n_elements = n * k;
  t.n_bytes = bytes.size();
  const GgufTensorInfo* parts[] = {&t};
  std::unique_ptr<PreparedMatrix> w = *be->PrepareMatrix(parts);
  const QuantMatrix q{GgmlType::kQ8_0, bytes.data(), n, k, k / 32 * 34};
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int m : {1, 3, 4}) {
    std::vector<float> x(m * k), got(m * n), want(m * n);
    for (float& v : x) v = nd(rng);
    be->Linear(*w, x.data(), m, k, got.data(), n, false);
    QuantGemm(q, x.data(), m, k, want.data(), n,
              m < kBf16MinRows ? GemvMode::kF32 : GemvMode::kInt8);
    EXPECT_EQ(got, want) << "m=" << m;
    std::vector<float> other(m * n);
    QuantGemm(q, x.data(), m, k, other.data(), n,
              m < kBf16MinRows ? GemvMode::kInt8 : GemvMode::kF32);
    EXPECT_NE(got, other) << "m=" << m << ": the two modes should differ";
  }
  // With gemv_tile_min_rows set, that many rows and more take kF32Tile (where AVX2 runs it).
  o.gemv_tile_min_rows = 13;
  o.gemv_max_rows = 64;
  be = MakeCpuBackend(o);
  w = *be->PrepareMatrix(parts);
  if (ActiveIsa() >= IsaLevel::kAvx2) {
    for (int m : {12, 13, 40}) {
      std::vector<float> x(m * k), got(m * n), want(m * n), other(m * n);
      for (float& v : x) v = nd(rng);
      be->Linear(*w, x.data(), m, k, got.data(), n, false);
      QuantGemm(q, x.data(), m, k, want.data(), n, m < 13 ? GemvMode::kInt8 : GemvMode::kF32Tile);
      EXPECT_EQ(got, want) << "m=" << m;
      QuantGemm(q, x.data(), m, k, other.data(), n, m < 13 ? GemvMode::kF32Tile : GemvMode::kInt8);
      EXPECT_NE(got, other) << "m=" << m << ": the two modes should differ";
    }
  }
}

}  // namespace
}  // namespace tripod
