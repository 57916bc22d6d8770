// Tests for CPU feature detection and the ISA cap.
#include "common/compute/cpu/cpu_features.h"

#include <string>

#include "gtest/gtest.h"

namespace tripod {
namespace {

TEST(CpuFeaturesTest, ConsistentImplications) {
  const CpuFeatures& f = GetCpuFeatures();
  // Extensions imply their base: the OS-state checks must not grant a subset inconsistently.
  if (f.avx512bw || f.avx512vl || f.avx512dq || f.avx512vnni || f.avx512bf16) {
    EXPECT_TRUE(f.avx512f);
  }
  if (f.amx_bf16 || f.amx_int8) {
    EXPECT_TRUE(f.amx_tile);
  }
  if (f.amx_tile) {
    EXPECT_TRUE(f.avx512f);
  }
}

TEST(CpuFeaturesTest, ActiveIsaMatchesFeatures) {
  SetIsaCap(IsaLevel::kAmx);
  const CpuFeatures& f = GetCpuFeatures();
  const IsaLevel best = ActiveIsa();
  if (best >= IsaLevel::kAvx2) {
    EXPECT_TRUE(f.avx2 && f.fma && f.f16c);
  }
  if (best >= IsaLevel::kAvx512) {
    EXPECT_TRUE(f.avx512vnni && f.avx512bf16 && f.avx512bw);
  }
  if (best == IsaLevel::kAmx) {
    EXPECT_TRUE(f.amx_tile && f.amx_bf16);
  }
  if (f.avx2 && f.fma && f.f16c) {
    EXPECT_GE(best, IsaLevel::kAvx2);
  }
}

TEST(CpuFeaturesTest, CapLimitsLevel) {
  SetIsaCap(IsaLevel::kAmx);
  const IsaLevel best = ActiveIsa();
  SetIsaCap(IsaLevel::kScalar);
  EXPECT_EQ(ActiveIsa(), IsaLevel::kScalar);
  SetIsaCap(IsaLevel::kAvx2);
  EXPECT_EQ(ActiveIsa(), best < IsaLevel::kAvx2 ? best : IsaLevel::kAvx2);
  SetIsaCap(IsaLevel::kAmx);
  EXPECT_EQ(ActiveIsa(), best);
}

TEST(CpuFeaturesTest, Names) {
  EXPECT_EQ(std::string(IsaName(IsaLevel::kScalar)), "scalar");
  EXPECT_EQ(std::string(IsaName(IsaLevel::kAvx2)), "avx2");
  EXPECT_EQ(std::string(IsaName(IsaLevel::kAvx512)), "avx512");
  EXPECT_EQ(std::string(IsaName(IsaLevel::kAmx)), "amx");
  // TRIPOD_MAX_CPU_ISA's values: the names, in any case; anything else is refused.
  for (IsaLevel l : {IsaLevel::kScalar, IsaLevel::kAvx2, IsaLevel::kAvx512, IsaLevel::kAmx}) {
    EXPECT_EQ(ParseIsaName(IsaName(l)), l);
  }
  EXPECT_EQ(ParseIsaName("AVX2"), IsaLevel::kAvx2);
  EXPECT_EQ(ParseIsaName("avx"), std::nullopt);
  EXPECT_EQ(ParseIsaName("avx2 "), std::nullopt);
  EXPECT_EQ(ParseIsaName(""), std::nullopt);
}

}  // namespace
}  // namespace tripod
