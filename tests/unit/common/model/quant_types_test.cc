// Tests for common/model/quant_types: fp16/bf16 conversions and dequantisation of hand-made blocks.
// Expected values are computed from the documented block layouts, element by element.
#include "common/model/quant_types.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tripod {
namespace {

TEST(Fp16Test, KnownValues) {
  EXPECT_EQ(Fp16ToFp32(0x3C00), 1.0f);
  EXPECT_EQ(Fp16ToFp32(0xC000), -2.0f);
  EXPECT_EQ(Fp16ToFp32(0x7BFF), 65504.0f);
  EXPECT_EQ(Fp16ToFp32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(Fp16ToFp32(0x03FF), 1023 * std::ldexp(1.0f, -24));
  EXPECT_EQ(Fp16ToFp32(0x0400), std::ldexp(1.0f, -14));
  EXPECT_EQ(Fp16ToFp32(0x7C00), INFINITY);
  EXPECT_EQ(Fp16ToFp32(0xFC00), -INFINITY);
  EXPECT_TRUE(std::isnan(Fp16ToFp32(0x7E00)));
  EXPECT_TRUE(std::isnan(Fp16ToFp32(0x7C01)));
  EXPECT_EQ(Fp16ToFp32(0x8000), 0.0f);
  EXPECT_TRUE(std::signbit(Fp16ToFp32(0x8000)));
  EXPECT_EQ(Fp32ToFp16(1.0f), 0x3C00);
  EXPECT_EQ(Fp32ToFp16(-0.0f), 0x8000);
  EXPECT_EQ(Fp32ToFp16(INFINITY), 0x7C00);
  EXPECT_EQ(Fp32ToFp16(-INFINITY), 0xFC00);
  EXPECT_EQ(Fp32ToFp16(NAN) & 0x7C00, 0x7C00);
  EXPECT_NE(Fp32ToFp16(NAN) & 0x03FF, 0);
}

TEST(Fp16Test, RoundTripsEveryHalf) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = Fp16ToFp32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(Fp16ToFp32(Fp32ToFp16(f)))) << h;
    } else {
      EXPECT_EQ(Fp32ToFp16(f), h) << h;
    }
  }
}

TEST(Fp16Test, RoundsToNearestEven) {
  const float ulp1 = std::ldexp(1.0f, -10);            // spacing of halves in [1, 2)
  EXPECT_EQ(Fp32ToFp16(1.0f + ulp1 / 2), 0x3C00);      // tie, 0x3C00 is even
  EXPECT_EQ(Fp32ToFp16(1.0f + 3 * ulp1 / 2), 0x3C02);  // tie, rounds up to even
  EXPECT_EQ(Fp32ToFp16(std::nextafter(1.0f + ulp1 / 2, 2.0f)), 0x3C01);
  EXPECT_EQ(Fp32ToFp16(std::nextafter(1.0f + 3 * ulp1 / 2, 0.0f)), 0x3C01);
  EXPECT_EQ(Fp32ToFp16(65519.0f), 0x7BFF);
  EXPECT_EQ(Fp32ToFp16(65520.0f), 0x7C00);  // tie between 65504 (odd) and 65536 (inf)
  EXPECT_EQ(Fp32ToFp16(1e10f), 0x7C00);
  // Subnormals, in units of 2^-24.
  const float unit = std::ldexp(1.0f, -24);
  EXPECT_EQ(Fp32ToFp16(unit / 2), 0x0000);  // tie, 0 is even
  EXPECT_EQ(Fp32ToFp16(std::nextafter(unit / 2, 1.0f)), 0x0001);
  EXPECT_EQ(Fp32ToFp16(1.5f * unit), 0x0002);
  EXPECT_EQ(Fp32ToFp16(2.5f * unit), 0x0002);
  EXPECT_EQ(Fp32ToFp16(unit / 4), 0x0000);
  EXPECT_EQ(Fp32ToFp16(1023.5f * unit), 0x0400);  // tie to the smallest normal (even)
  EXPECT_EQ(Fp32ToFp16(-1022.5f * unit), 0x83FE);
  EXPECT_EQ(Fp32ToFp16(1e-30f), 0x0000);
}

TEST(Fp16Test, MatchesNearestHalfOnRandomFloats) {
  // Reference: the nearest half by exhaustive neighbour search over the two candidates.
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    uint32_t b = bits(rng);
    b = (b & 0x807FFFFF) | ((100 + (b >> 23) % 46) << 23);  // exponents around the half range
    const float f = std::bit_cast<float>(b);
    if (std::fabs(f) >= 65520.0f) continue;  // overflow to infinity is tested above
    const uint16_t h = Fp32ToFp16(f);
    const double err = std::fabs(static_cast<double>(Fp16ToFp32(h)) - f);
    // Neither neighbour may be closer; on a tie the chosen one must be even.
    for (int delta : {-1, 1}) {
      const uint16_t n = static_cast<uint16_t>(h + delta);
      if ((n & 0x7C00) == 0x7C00 || ((n ^ h) & 0x8000)) continue;
      const double nerr = std::fabs(static_cast<double>(Fp16ToFp32(n)) - f);
      ASSERT_LE(err, nerr) << std::hex << b;
      if (err == nerr) {
        ASSERT_EQ(h & 1, 0) << std::hex << b;
      }
    }
  }
}

TEST(Bf16Test, ConversionsAndRounding) {
  EXPECT_EQ(Fp32ToBf16(1.0f), 0x3F80);
  EXPECT_EQ(Bf16ToFp32(0x3F80), 1.0f);
  EXPECT_EQ(Bf16ToFp32(0xC040), -3.0f);
  EXPECT_EQ(Fp32ToBf16(std::bit_cast<float>(0x3F808000u)), 0x3F80);  // tie, even
  EXPECT_EQ(Fp32ToBf16(std::bit_cast<float>(0x3F818000u)), 0x3F82);  // tie, odd rounds up
  EXPECT_EQ(Fp32ToBf16(std::bit_cast<float>(0x3F808001u)), 0x3F81);
  EXPECT_EQ(Fp32ToBf16(std::bit_cast<float>(0x3F807FFFu)), 0x3F80);
  EXPECT_EQ(Fp32ToBf16(std::bit_cast<float>(0x7F7FFFFFu)), 0x7F80);    // rounds up to infinity
  const uint16_t nan = Fp32ToBf16(std::bit_cast<float>(0x7F800001u));  // signalling NaN
  EXPECT_TRUE(std::isnan(Bf16ToFp32(nan)));
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = Bf16ToFp32(static_cast<uint16_t>(h));
    if (!std::isnan(f)) {
      ASSERT_EQ(Fp32ToBf16(f), h) << h;
    }
  }
}

TEST(QuantTypesTest, TypeTableAndRowBytes) {
  EXPECT_EQ(TypeInfo(GgmlType::kQ4_K).block_bytes, 144);
  EXPECT_EQ(TypeInfo(GgmlType::kQ6_K).block_elems, 256);
  EXPECT_EQ(TypeInfo(GgmlType::kQ8_0).name, "Q8_0");
  EXPECT_EQ(*RowBytes(GgmlType::kQ4_K, 512), 288u);
  EXPECT_EQ(*RowBytes(GgmlType::kQ4_1, 576), 360u);
  EXPECT_EQ(*RowBytes(GgmlType::kF32, 10), 40u);
  EXPECT_EQ(*RowBytes(GgmlType::kBF16, 3), 6u);
  EXPECT_FALSE(RowBytes(GgmlType::kQ8_0, 100).ok());
  EXPECT_FALSE(RowBytes(GgmlType::kF32, -1).ok());
  EXPECT_FALSE(RowBytes(GgmlType::kF32, INT64_MAX).ok());  // 4 bytes each overflows
  ASSERT_TRUE(LookupGgmlType(14).ok());
  EXPECT_EQ(LookupGgmlType(14)->type, GgmlType::kQ6_K);
  EXPECT_EQ(LookupGgmlType(30)->type, GgmlType::kBF16);
  EXPECT_EQ(LookupGgmlType(6)->type, GgmlType::kQ5_0);
  EXPECT_EQ(LookupGgmlType(7)->type, GgmlType::kQ5_1);
  EXPECT_EQ(*RowBytes(GgmlType::kQ5_0, 896), 616u);
  EXPECT_EQ(*RowBytes(GgmlType::kQ5_1, 64), 48u);
  auto q2k = LookupGgmlType(10);
  ASSERT_FALSE(q2k.ok());
  EXPECT_NE(q2k.status().message().find("Q2_K"), std::string::npos) << q2k.status();
  EXPECT_FALSE(LookupGgmlType(4).ok());
  EXPECT_FALSE(LookupGgmlType(1000).ok());
}

template <typename Block>
std::vector<float> Dequant(GgmlType type, const std::vector<Block>& blocks) {
  const int64_t n = static_cast<int64_t>(blocks.size()) * TypeInfo(type).block_elems;
  // Copy to an odd address: the file gives no alignment guarantee for blocks.
  std::vector<uint8_t> bytes(sizeof(Block) * blocks.size() + 1);
  std::memcpy(bytes.data() + 1, blocks.data(), sizeof(Block) * blocks.size());
  std::vector<float> out(static_cast<size_t>(n), -12345.0f);
  DequantizeRow(type, bytes.data() + 1, out.data(), n);
  return out;
}

TEST(DequantTest, F32F16Bf16) {
  const float f32[3] = {1.5f, -2.25f, 1e-3f};
  float out[3];
  DequantizeRow(GgmlType::kF32, f32, out, 3);
  EXPECT_EQ(std::memcmp(out, f32, sizeof(out)), 0);
  const uint16_t f16[3] = {0x3C00, 0xC100, 0x0001};
  DequantizeRow(GgmlType::kF16, f16, out, 3);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.5f);
  EXPECT_EQ(out[2], std::ldexp(1.0f, -24));
  const uint16_t bf16[3] = {0x3F80, 0xC020, 0x4049};
  DequantizeRow(GgmlType::kBF16, bf16, out, 3);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.5f);
  EXPECT_EQ(out[2], std::bit_cast<float>(0x40490000u));
}

TEST(DequantTest, Q4_0) {
  std::vector<BlockQ4_0> b(2);
  for (int k = 0; k < 2; ++k) {
    b[k].d = Fp32ToFp16(k == 0 ? 0.5f : -3.0f);
    for (int j = 0; j < 16; ++j) b[k].qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  }
  const auto y = Dequant(GgmlType::kQ4_0, b);
  for (int k = 0; k < 2; ++k) {
    const float d = k == 0 ? 0.5f : -3.0f;
    for (int j = 0; j < 16; ++j) {
      EXPECT_EQ(y[32 * k + j], (j - 8) * d);
      EXPECT_EQ(y[32 * k + j + 16], (15 - j - 8) * d);
    }
  }
}

TEST(DequantTest, Q4_1) {
  std::vector<BlockQ4_1> b(1);
  b[0].d = Fp32ToFp16(0.25f);
  b[0].m = Fp32ToFp16(-1.0f);
  for (int j = 0; j < 16; ++j) b[0].qs[j] = static_cast<uint8_t>(((j * 7) & 15) | (j << 4));
  const auto y = Dequant(GgmlType::kQ4_1, b);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], ((j * 7) & 15) * 0.25f - 1.0f);
    EXPECT_EQ(y[j + 16], j * 0.25f - 1.0f);
  }
}

TEST(DequantTest, Q8_0) {
  std::vector<BlockQ8_0> b(1);
  b[0].d = Fp32ToFp16(2.0f);
  for (int j = 0; j < 32; ++j) b[0].qs[j] = static_cast<int8_t>(j * 8 - 128);
  const auto y = Dequant(GgmlType::kQ8_0, b);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], 2.0f * (j * 8 - 128));
}

// Packs 8 six-bit scales and mins the way Q4_K/Q5_K store them.
void PackScalesK4(const int sc[8], const int m[8], uint8_t out[12]) {
  for (int j = 0; j < 4; ++j) {
    out[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    out[j + 4] = static_cast<uint8_t>((m[j] & 63) | ((m[j + 4] >> 4) << 6));
    out[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
  }
}

TEST(DequantTest, Q4_K) {
  std::mt19937 rng(1);
  std::vector<BlockQ4_K> b(2);
  int sc[2][8], m[2][8];
  for (int k = 0; k < 2; ++k) {
    b[k].d = Fp32ToFp16(k == 0 ? 0.5f : 0.125f);
    b[k].dmin = Fp32ToFp16(k == 0 ? 0.25f : 2.0f);
    for (int s = 0; s < 8; ++s) {
      sc[k][s] = static_cast<int>(rng() % 64);
      m[k][s] = static_cast<int>(rng() % 64);
    }
    sc[k][7] = 63;  // exercise the high bits
    m[k][6] = 48;
    PackScalesK4(sc[k], m[k], b[k].scales);
    for (auto& q : b[k].qs) q = static_cast<uint8_t>(rng());
  }
  const auto y = Dequant(GgmlType::kQ4_K, b);
  for (int k = 0; k < 2; ++k) {
    const float d = Fp16ToFp32(b[k].d), dmin = Fp16ToFp32(b[k].dmin);
    for (int e = 0; e < 256; ++e) {
      const int sb = e / 32, chunk = e / 64, l = e % 32;
      const uint8_t byte = b[k].qs[chunk * 32 + l];
      const int q = (sb % 2 == 0) ? (byte & 15) : (byte >> 4);
      const float want = d * sc[k][sb] * q - dmin * m[k][sb];
      ASSERT_EQ(y[256 * k + e], want) << k << " " << e;
    }
  }
}

TEST(DequantTest, Q5_K) {
  std::mt19937 rng(2);
  std::vector<BlockQ5_K> b(2);
  int sc[2][8], m[2][8];
  for (int k = 0; k < 2; ++k) {
    b[k].d = Fp32ToFp16(k == 0 ? 0.75f : 0.0625f);
    b[k].dmin = Fp32ToFp16(k == 0 ? 1.0f : 0.5f);
    for (int s = 0; s < 8; ++s) {
      sc[k][s] = static_cast<int>(rng() % 64);
      m[k][s] = static_cast<int>(rng() % 64);
    }
    PackScalesK4(sc[k], m[k], b[k].scales);
    for (auto& q : b[k].qs) q = static_cast<uint8_t>(rng());
    for (auto& q : b[k].qh) q = static_cast<uint8_t>(rng());
  }
  const auto y = Dequant(GgmlType::kQ5_K, b);
  for (int k = 0; k < 2; ++k) {
    const float d = Fp16ToFp32(b[k].d), dmin = Fp16ToFp32(b[k].dmin);
    for (int e = 0; e < 256; ++e) {
      const int sb = e / 32, chunk = e / 64, l = e % 32;
      const uint8_t byte = b[k].qs[chunk * 32 + l];
      const int lo = (sb % 2 == 0) ? (byte & 15) : (byte >> 4);
      const int q = lo | (((b[k].qh[l] >> sb) & 1) << 4);
      const float want = d * sc[k][sb] * q - dmin * m[k][sb];
      ASSERT_EQ(y[256 * k + e], want) << k << " " << e;
    }
  }
}

TEST(DequantTest, Q6_K) {
  std::mt19937 rng(3);
  std::vector<BlockQ6_K> b(2);
  for (int k = 0; k < 2; ++k) {
    b[k].d = Fp32ToFp16(k == 0 ? 0.5f : -0.25f);
    for (auto& q : b[k].ql) q = static_cast<uint8_t>(rng());
    for (auto& q : b[k].qh) q = static_cast<uint8_t>(rng());
    for (auto& s : b[k].scales) s = static_cast<int8_t>(rng());
  }
  const auto y = Dequant(GgmlType::kQ6_K, b);
  for (int k = 0; k < 2; ++k) {
    const float d = Fp16ToFp32(b[k].d);
    for (int e = 0; e < 256; ++e) {
      const int half = e / 128, i = e % 128, quarter = i / 32, l = i % 32;
      const uint8_t lbyte = b[k].ql[half * 64 + l + (quarter % 2) * 32];
      const int lo = quarter < 2 ? (lbyte & 15) : (lbyte >> 4);
      const int hi = (b[k].qh[half * 32 + l] >> (2 * quarter)) & 3;
      const float want = d * b[k].scales[e / 16] * ((lo | (hi << 4)) - 32);
      ASSERT_EQ(y[256 * k + e], want) << k << " " << e;
    }
  }
}

}  // namespace
}  // namespace tripod
