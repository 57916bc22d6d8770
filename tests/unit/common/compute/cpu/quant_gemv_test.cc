// Tests for QuantGemm: every ISA path on this CPU against a double-precision reference built
// from the model library's dequantiser, for every weight type, odd m / n and row tails.
#include "common/compute/cpu/quant_gemv.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/compute/cpu/cpu_features.h"
#include "common/compute/cpu/quant_gemv_internal.h"
#include "gtest/gtest.h"

namespace tripod::quant_gemv_test {
namespace {

std::vector<IsaLevel> Levels() {
  SetIsaCap(IsaLevel::kAmx);
  std::vector<IsaLevel> out;
  for (IsaLevel l : {IsaLevel::kScalar, IsaLevel::kAvx2, IsaLevel::kAvx512}) {
    if (l <= ActiveIsa()) out.push_back(l);
  }
  return out;
}

struct TestMatrix {
  std::vector<uint8_t> bytes;
  std::vector<float> deq;  // n x k, via DequantizeRow
  QuantMatrix m;
};

void PutHalf(uint8_t* p, float f) {
  const uint16_t h = Fp32ToFp16(f);
  std::memcpy(p, &h, 2);
}

TestMatrix MakeMatrix(GgmlType type, int64_t n, int64_t k, std::mt19937& rng) {
  TestMatrix t;
  const int64_t row_bytes = RowBytes(type, k).value();
  t.bytes.resize(n * row_bytes);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const int be = TypeInfo(type).block_elems, bb = TypeInfo(type).block_bytes;
  for (int64_t j = 0; j < n; ++j) {
    uint8_t* row = t.bytes.data() + j * row_bytes;
    if (type == GgmlType::kF32) {
      for (int64_t i = 0; i < k; ++i) {
        const float f = u(rng);
        std::memcpy(row + 4 * i, &f, 4);
      }
      continue;
    }
    if (type == GgmlType::kF16 || type == GgmlType::kBF16) {
      for (int64_t i = 0; i < k; ++i) {
        const uint16_t h = type == GgmlType::kF16 ? Fp32ToFp16(u(rng)) : Fp32ToBf16(u(rng));
        std::memcpy(row + 2 * i, &h, 2);
      }
      continue;
    }
    for (int64_t i = 0; i < row_bytes; ++i) row[i] = static_cast<uint8_t>(byte(rng));
    // Sane fp16 scales (random bits could be inf / NaN).
    for (int64_t b = 0; b < k / be; ++b) {
      uint8_t* blk = row + b * bb;
      switch (type) {
        case GgmlType::kQ4_0:
        case GgmlType::kQ8_0:
          PutHalf(blk, 0.01f + 0.05f * std::fabs(u(rng)));
          break;
        case GgmlType::kQ4_1:
        case GgmlType::kQ5_1:
          PutHalf(blk, 0.01f + 0.05f * std::fabs(u(rng)));
          PutHalf(blk + 2, 0.3f * u(rng));
          break;
        case GgmlType::kQ5_0:
          PutHalf(blk, 0.01f + 0.05f * std::fabs(u(rng)));
          break;
        case GgmlType::kQ4_K:
        case GgmlType::kQ5_K:
          PutHalf(blk, 0.001f + 0.01f * std::fabs(u(rng)));
          PutHalf(blk + 2, 0.001f + 0.01f * std::fabs(u(rng)));
          break;
        case GgmlType::kQ6_K:
          PutHalf(blk + 208, 0.001f + 0.01f * std::fabs(u(rng)));
          break;
        default:
          break;
      }
    }
  }
  t.deq.resize(n * k);
  for (int64_t j = 0; j < n; ++j)
    DequantizeRow(type, t.bytes.data() + j * row_bytes, &t.deq[j * k], k);
  t.m = QuantMatrix{type, t.bytes.data(), n, k, row_bytes};
  return t;
}

struct Case {
  GgmlType type;
  int64_t n, k;
};

void CheckAll(const Case& c, GemvMode mode) {
  std::mt19937 rng(1234 + static_cast<int>(c.type) * 7 + static_cast<int>(c.k));
  TestMatrix t = MakeMatrix(c.type, c.n, c.k, rng);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int m : {1, 2, 3, 4, 5, 7, 16, 21}) {
    const int64_t ldx = c.k + 3, ldy = c.n + 5;
    std::vector<float> x(m * ldx);
    for (float& v : x) v = nd(rng);
    // Int8 / int16 modes: the error of quantising x is bounded per block by d_x / 2 * sum |w|,
    // d_x = amax / 127 or amax / 32767.
    const bool block_type =
        c.type == GgmlType::kQ4_0 || c.type == GgmlType::kQ4_1 || c.type == GgmlType::kQ8_0;
    // K-quants, Q5_0 and Q5_1 take int8 kernels in the int8 mode on AVX-512 and in the scalar
    // reference, and the int16 ones on AVX2 and in the int16 mode (the tile mode is fp32 for
    // them).
    const bool int_block = qgemv::IsIntBlockType(c.type);
    std::vector<float> scalar_y, avx2_y;
    std::vector<double> mags(m * ldy, 0.0);
    for (IsaLevel isa : Levels()) {
      SetIsaCap(isa);
      const bool int8_here = isa == IsaLevel::kScalar || ActiveIsa() >= IsaLevel::kAvx512;
      const bool int8 = mode == GemvMode::kInt8 && (block_type || (int_block && int8_here));
      const bool int16 = (mode == GemvMode::kInt16 && (block_type || int_block)) ||
                         (mode == GemvMode::kInt8 && int_block && !int8_here);
      // An int8 scalar result is checked against the int8 kernels only.
      const bool same_as_scalar = !(mode == GemvMode::kInt8 && int_block && !int8_here);
      const double levels = int8 ? 127.0 : 32767.0;
      std::vector<float> y(m * ldy, -7.0f);
      QuantGemm(t.m, x.data(), m, ldx, y.data(), ldy, mode);
      for (int i = 0; i < m; ++i) {
        for (int64_t j = 0; j < c.n; ++j) {
          double ref = 0, mag = 0, qerr = 0;
          for (int64_t b = 0; b < c.k; b += 32) {
            double amax = 0, wsum = 0;
            for (int64_t t2 = b; t2 < std::min<int64_t>(b + 32, c.k); ++t2) {
              const double w = t.deq[j * c.k + t2], xv = x[i * ldx + t2];
              ref += w * xv;
              mag += std::fabs(w * xv);
              amax = std::max(amax, std::fabs(xv));
              wsum += std::fabs(w);
            }
            qerr += amax / levels / 2.0 * wsum;
          }
          mags[i * ldy + j] = mag;
          const double tol = int8 || int16 ? qerr * 1.01 + 1e-5 * mag + 1e-6 : 1e-5 * mag + 1e-6;
          ASSERT_NEAR(y[i * ldy + j], ref, tol)
              << TypeInfo(c.type).name << " isa=" << IsaName(isa) << " m=" << m << " i=" << i
              << " j=" << j << " k=" << c.k;
        }
        // Padding between rows is untouched.
        for (int64_t j = c.n; j < ldy; ++j) ASSERT_EQ(y[i * ldy + j], -7.0f);
      }
      if ((int8 || int16) && same_as_scalar) {
        // Vector int8 / int16 paths do the same integer arithmetic as the scalar one.
        if (isa == IsaLevel::kScalar) {
          scalar_y = y;
        } else {
          for (size_t e = 0; e < y.size(); ++e) {
            ASSERT_NEAR(y[e], scalar_y[e], 1e-5 * mags[e] + 1e-6) << IsaName(isa) << " e=" << e;
          }
        }
      }
      if (int16 && block_type) {
        // The AVX2 and AVX-512 int16 kernels: exact integer dots and the same fp32 steps (the
        // K-quants' AVX-512 kernels are 512 bits wide: their sums run in another order).
        if (isa == IsaLevel::kAvx2) {
          avx2_y = y;
        } else if (isa == IsaLevel::kAvx512) {
          ASSERT_EQ(y, avx2_y) << TypeInfo(c.type).name << " m=" << m;
        }
      }
    }
  }
  SetIsaCap(IsaLevel::kAmx);
}

// Shapes cover: rows not a multiple of the 4 / 8-row groups, fewer than 8 blocks per row, block
// counts that leave a partial group of 8 scales, and more than one 64-block scale table.
const Case kCases[] = {
    {GgmlType::kQ4_0, 37, 64},   {GgmlType::kQ4_1, 300, 576}, {GgmlType::kQ4_1, 5, 32},
    {GgmlType::kQ8_0, 129, 576}, {GgmlType::kQ8_0, 3, 96},    {GgmlType::kQ4_1, 19, 2240},
    {GgmlType::kQ4_0, 13, 1536}, {GgmlType::kQ8_0, 11, 2080}, {GgmlType::kF32, 17, 37},
    {GgmlType::kF32, 40, 576},   {GgmlType::kF16, 33, 100},   {GgmlType::kBF16, 19, 71},
    {GgmlType::kF16, 8, 5},      {GgmlType::kQ4_K, 9, 512},   {GgmlType::kQ5_K, 4, 256},
    {GgmlType::kQ6_K, 6, 256},   {GgmlType::kQ5_0, 37, 64},   {GgmlType::kQ5_0, 13, 896},
    {GgmlType::kQ5_1, 9, 288},   {GgmlType::kQ5_1, 4, 32},    {GgmlType::kQ4_K, 13, 1536},
    {GgmlType::kQ6_K, 11, 2304}, {GgmlType::kQ5_K, 7, 768},   {GgmlType::kQ4_K, 3, 256},
};

TEST(QuantGemmTest, F32ModeMatchesDoubleReference) {
  for (const Case& c : kCases) CheckAll(c, GemvMode::kF32);
}

TEST(QuantGemmTest, F32TileModeMatchesDoubleReference) {
  for (const Case& c : kCases) CheckAll(c, GemvMode::kF32Tile);
}

TEST(QuantGemmTest, Int8ModeWithinQuantisationError) {
  for (const Case& c : kCases) CheckAll(c, GemvMode::kInt8);
}

TEST(QuantGemmTest, Int16ModeWithinQuantisationError) {
  for (const Case& c : kCases) CheckAll(c, GemvMode::kInt16);
}

// bf16 mode: x and the dequantised weights rounded to bf16 (nearest even), products summed in
// fp32, so it must match the double sum of the same rounded values; and a row's results must be
// the same bits whatever the other rows of the call (batch invariance). Where the CPU has no
// AVX512_BF16, and below kBf16MinRows rows, the mode is the fp32 one, bit for bit.
TEST(QuantGemmTest, Bf16ModeMatchesRoundedReferenceAndIsBatchInvariant) {
  SetIsaCap(IsaLevel::kAmx);
  const bool hw = ActiveIsa() >= IsaLevel::kAvx512 && GetCpuFeatures().avx512bf16;
  const Case cases[] = {
      {GgmlType::kQ4_0, 37, 64},   {GgmlType::kQ4_1, 300, 576}, {GgmlType::kQ4_1, 5, 32},
      {GgmlType::kQ8_0, 129, 576}, {GgmlType::kQ8_0, 3, 96},    {GgmlType::kQ4_1, 19, 2240},
      {GgmlType::kQ4_0, 13, 1536}, {GgmlType::kF16, 9, 100},    {GgmlType::kQ4_K, 11, 1536},
      {GgmlType::kQ6_K, 7, 512},   {GgmlType::kQ5_K, 5, 256},   {GgmlType::kQ5_0, 9, 896},
      {GgmlType::kQ5_1, 6, 96}};
  auto bf = [](double v) { return static_cast<double>(Bf16ToFp32(Fp32ToBf16(float(v)))); };
  for (const Case& c : cases) {
    std::mt19937 rng(99 + static_cast<int>(c.k));
    TestMatrix t = MakeMatrix(c.type, c.n, c.k, rng);
    const bool block = c.type != GgmlType::kF16;
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int m : {1, 2, 3, 4, 5, 8, 16, 21, 40}) {
      const int64_t ldx = c.k + 3, ldy = c.n + 5;
      std::vector<float> x(m * ldx);
      for (float& v : x) v = nd(rng);
      std::vector<float> y(m * ldy, -7.0f), y32(m * ldy, -7.0f);
      QuantGemm(t.m, x.data(), m, ldx, y.data(), ldy, GemvMode::kBf16);
      if (!hw || !block || m < kBf16MinRows) {
        // Below it the mode is the fp32 one, or for K-quants, Q5_0 and Q5_1 the int16 one.
        const GemvMode below = qgemv::IsIntBlockType(c.type) ? GemvMode::kInt16 : GemvMode::kF32;
        QuantGemm(t.m, x.data(), m, ldx, y32.data(), ldy, below);
        ASSERT_EQ(0, std::memcmp(y.data(), y32.data(), y.size() * sizeof(float)))
            << TypeInfo(c.type).name << " m=" << m;
        continue;
      }
      for (int i = 0; i < m; ++i) {
        for (int64_t j = 0; j < c.n; ++j) {
          double ref = 0, mag = 0;
          for (int64_t e = 0; e < c.k; ++e) {
            const double p = bf(t.deq[j * c.k + e]) * bf(x[i * ldx + e]);
            ref += p;
            mag += std::fabs(p);
          }
          ASSERT_NEAR(y[i * ldy + j], ref, 2e-6 * mag + 1e-6)
              << TypeInfo(c.type).name << " m=" << m << " i=" << i << " j=" << j;
        }
        for (int64_t j = c.n; j < ldy; ++j) ASSERT_EQ(y[i * ldy + j], -7.0f);
        // Row i among kBf16MinRows copies of itself.
        std::vector<float> xi(kBf16MinRows * c.k), alone(kBf16MinRows * c.n);
        for (int r = 0; r < kBf16MinRows; ++r) {
          std::memcpy(&xi[r * c.k], &x[i * ldx], c.k * sizeof(float));
        }
        QuantGemm(t.m, xi.data(), kBf16MinRows, c.k, alone.data(), c.n, GemvMode::kBf16);
        ASSERT_EQ(0, std::memcmp(alone.data(), y.data() + i * ldy, c.n * sizeof(float)))
            << TypeInfo(c.type).name << " m=" << m << " row " << i << " differs";
      }
    }
  }
}

TEST(QuantGemmTest, InvalidRowLengthGivesNaN) {
  std::vector<uint8_t> bytes(64, 0);
  QuantMatrix w{GgmlType::kQ4_1, bytes.data(), 2, 33, 40};  // 33 is not a multiple of 32
  std::vector<float> x(33, 1.0f), y(2, 0.0f);
  QuantGemm(w, x.data(), 1, 33, y.data(), 2, GemvMode::kF32);
  EXPECT_TRUE(std::isnan(y[0]) && std::isnan(y[1]));
}

// The vector quantisers must reproduce the scalar one bit for bit (the int8 kernels are only
// compared with the scalar path through them), including all-zero blocks and ties at .5.
TEST(QuantGemmTest, VectorActivationQuantisationIsBitIdentical) {
  SetIsaCap(IsaLevel::kAmx);
  const IsaLevel top = ActiveIsa();
  const int m = 3;
  const int64_t k = 160, ldx = 170, nb = k / 32;
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> x(m * ldx);
  for (float& v : x) v = nd(rng);
  for (int j = 32; j < 64; ++j) x[j] = 0.0f;  // an all-zero block
  // A block whose values hit exact halves after scaling by 127 / amax = 1.
  for (int j = 0; j < 32; ++j) x[ldx + 64 + j] = (j == 0) ? 127.0f : -63.5f + 2.0f * j;
  std::vector<int8_t> q0(m * k), q1(m * k);
  std::vector<float> s0(m * nb), s1(m * nb), u0(m * nb), u1(m * nb);
  qgemv::scalar::QuantizeActInt8(x.data(), m, ldx, k, q0.data(), s0.data(), u0.data());
  for (IsaLevel isa : {IsaLevel::kAvx2, IsaLevel::kAvx512}) {
    if (isa > top) continue;
    if (isa == IsaLevel::kAvx2) {
      qgemv::avx2::QuantizeActInt8(x.data(), m, ldx, k, q1.data(), s1.data(), u1.data());
    } else {
      qgemv::avx512::QuantizeActInt8(x.data(), m, ldx, k, q1.data(), s1.data(), u1.data());
    }
    EXPECT_EQ(q0, q1) << IsaName(isa);
    EXPECT_EQ(s0, s1) << IsaName(isa);
    EXPECT_EQ(u0, u1) << IsaName(isa);
  }
  EXPECT_EQ(q0[40], 0);
  EXPECT_EQ(q0[k + 64], 127);

  // int16: a block whose values hit exact halves after scaling by 32767 / amax = 1.
  for (int j = 0; j < 32; ++j) x[2 * ldx + j] = (j == 0) ? 32767.0f : -1000.5f + 2.0f * j;
  std::vector<int16_t> h0(m * k), h1(m * k);
  qgemv::scalar::QuantizeActInt16(x.data(), m, ldx, k, h0.data(), s0.data());
  for (IsaLevel isa : {IsaLevel::kAvx2, IsaLevel::kAvx512}) {
    if (isa > top) continue;
    if (isa == IsaLevel::kAvx2) {
      qgemv::avx2::QuantizeActInt16(x.data(), m, ldx, k, h1.data(), s1.data());
    } else {
      qgemv::avx512::QuantizeActInt16(x.data(), m, ldx, k, h1.data(), s1.data());
    }
    EXPECT_EQ(h0, h1) << IsaName(isa);
    EXPECT_EQ(s0, s1) << IsaName(isa);
  }
  EXPECT_EQ(h0[40], 0);
  EXPECT_EQ(h0[2 * k], 32767);
  EXPECT_EQ(h0[2 * k + 1], -998);  // -998.5 rounds to even
  EXPECT_EQ(h0[2 * k + 2], -996);  // -996.5 rounds to even
}

TEST(QuantGemmTest, ZeroActivationsGiveZero) {
  std::mt19937 rng(5);
  TestMatrix t = MakeMatrix(GgmlType::kQ4_1, 10, 64, rng);
  std::vector<float> x(64, 0.0f), y(10, 1.0f);
  for (IsaLevel isa : Levels()) {
    SetIsaCap(isa);
    for (GemvMode mode : {GemvMode::kInt8, GemvMode::kInt16}) {
      QuantGemm(t.m, x.data(), 1, 64, y.data(), 10, mode);
      for (float v : y) EXPECT_EQ(v, 0.0f) << IsaName(isa);
    }
  }
  SetIsaCap(IsaLevel::kAmx);
}

// Parts of mixed types in one call, plain and accumulating, give each part's own result bit
// for bit (the same kernels; x prepared once), in every mode and at every ISA.
// The interleaved layout (what the CPU backend prepares) gives the same bits as the GGUF rows in
// every mode, ISA and batch size, including row ranges that start or end inside a group and the
// rows past the last whole group; CopyRowOut gives the GGUF rows back.
// The interleaved layout as qgemv::IlRunAt documents it, byte for byte: per 8-block run of a
// 4-row group, the rows' scales (d, then Q4_1's m) and then the quants block by block; the last
// run of a 17-block row holds one block.
TEST(QuantGemmTest, InterleavedLayoutKeepsScalesAheadOfQuantsInEachRun) {
  for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ8_0}) {
    std::mt19937 rng(11);
    const int64_t n = 8, k = 17 * 32, nb = k / 32;
    TestMatrix t = MakeMatrix(type, n, k, rng);
    std::vector<uint8_t> il(t.bytes.size());
    InterleaveRows(t.m, il.data());
    const int bb = TypeInfo(type).block_bytes;
    const int sb = type == GgmlType::kQ4_1 ? 4 : 2, qb = bb - sb;
    for (int64_t g = 0; g < n; g += kInterleaveRows) {
      const uint8_t* group = il.data() + g * t.m.row_bytes;
      for (int64_t c = 0; c * qgemv::kIlRun < nb; ++c) {
        qgemv::IlRun run{};
        switch (type) {
          case GgmlType::kQ4_0:
            run = qgemv::IlRunAt<GgmlType::kQ4_0>(group, nb, c);
            break;
          case GgmlType::kQ4_1:
            run = qgemv::IlRunAt<GgmlType::kQ4_1>(group, nb, c);
            break;
          default:
            run = qgemv::IlRunAt<GgmlType::kQ8_0>(group, nb, c);
            break;
        }
        ASSERT_EQ(run.cnt, c == 2 ? 1 : 8);
        ASSERT_EQ(run.base, group + c * qgemv::kIlRun * kInterleaveRows * bb);
        for (int r = 0; r < kInterleaveRows; ++r) {
          for (int j = 0; j < run.cnt; ++j) {
            const uint8_t* blk = t.bytes.data() + (g + r) * t.m.row_bytes + (c * 8 + j) * bb;
            const std::string_view name = TypeInfo(type).name;
            EXPECT_EQ(0, std::memcmp(run.base + (r * run.cnt + j) * 2, blk, 2)) << name;
            if (sb == 4) {
              EXPECT_EQ(0, std::memcmp(run.base + (kInterleaveRows + r) * run.cnt * 2 + j * 2,
                                       blk + 2, 2))
                  << name;
            }
            EXPECT_EQ(0, std::memcmp(run.quants + (j * kInterleaveRows + r) * qb, blk + sb, qb))
                << name << " group " << g << " run " << c << " row " << r << " block " << j;
          }
        }
      }
    }
  }
}

TEST(QuantGemmTest, InterleavedRowsGiveTheSameBits) {
  const Case cases[] = {{GgmlType::kQ4_1, 37, 576}, {GgmlType::kQ4_1, 64, 1536},
                        {GgmlType::kQ4_0, 13, 64},  {GgmlType::kQ8_0, 42, 576},
                        {GgmlType::kQ8_0, 3, 96},   {GgmlType::kQ4_1, 9, 544}};
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const Case& c : cases) {
    std::mt19937 rng(7 + static_cast<int>(c.n));
    TestMatrix t = MakeMatrix(c.type, c.n, c.k, rng);
    ASSERT_TRUE(CanInterleave(t.m));
    std::vector<uint8_t> il(t.bytes.size());
    InterleaveRows(t.m, il.data());
    QuantMatrix w = t.m;
    w.data = il.data();
    w.interleave = kInterleaveRows;
    EXPECT_FALSE(CanInterleave(w));  // already interleaved
    EXPECT_EQ(InterleavedRows(w), c.n / kInterleaveRows * kInterleaveRows);
    if (c.n >= kInterleaveRows) {
      EXPECT_NE(il, t.bytes) << TypeInfo(c.type).name;
    }
    std::vector<uint8_t> row(t.m.row_bytes);
    for (int64_t j = 0; j < c.n; ++j) {
      CopyRowOut(w, j, row.data());
      ASSERT_EQ(0, std::memcmp(row.data(), t.bytes.data() + j * t.m.row_bytes, row.size()))
          << TypeInfo(c.type).name << " row " << j;
    }
    for (IsaLevel isa : Levels()) {
      SetIsaCap(isa);
      for (GemvMode mode : {GemvMode::kF32, GemvMode::kInt8, GemvMode::kInt16, GemvMode::kBf16,
                            GemvMode::kF32Tile}) {
        for (int m : {1, 2, 3, 4, 5, 8, 11, 17}) {
          const int64_t ldx = c.k + 3, ldy = c.n + 5;
          std::vector<float> x(m * ldx);
          for (float& v : x) v = nd(rng);
          std::vector<float> want(m * ldy, -7.0f), got(m * ldy, -7.0f);
          QuantGemm(t.m, x.data(), m, ldx, want.data(), ldy, mode);
          QuantGemm(w, x.data(), m, ldx, got.data(), ldy, mode);
          ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
              << TypeInfo(c.type).name << " " << IsaName(isa) << " mode " << int(mode) << " m "
              << m;
        }
      }
      // Kernel row ranges that cut groups: [j0, j1) for every j0 and a few j1.
      std::vector<float> x(c.k);
      for (float& v : x) v = nd(rng);
      std::vector<int16_t> q(c.k);
      std::vector<float> sc(c.k / 32), bs(c.k / 32);
      qgemv::scalar::QuantizeActInt16(x.data(), 1, c.k, c.k, q.data(), sc.data());
      qgemv::scalar::BlockSums(x.data(), 1, c.k, c.k, bs.data());
      const qgemv::Int16Act xa{q.data(), sc.data(), bs.data(), 1, c.k, c.k / 32};
      for (int64_t j0 = 0; j0 < c.n; ++j0) {
        for (int64_t j1 : {j0 + 1, std::min<int64_t>(c.n, j0 + 6), c.n}) {
          std::vector<float> want(c.n, -7.0f), got(c.n, -7.0f);
          bool ok_want = false, ok_got = false;
          if (isa >= IsaLevel::kAvx512) {
            ok_want = qgemv::avx512::RowsInt16(t.m, xa, want.data(), c.n, j0, j1);
            ok_got = qgemv::avx512::RowsInt16(w, xa, got.data(), c.n, j0, j1);
          } else if (isa >= IsaLevel::kAvx2) {
            ok_want = qgemv::avx2::RowsInt16(t.m, xa, want.data(), c.n, j0, j1);
            ok_got = qgemv::avx2::RowsInt16(w, xa, got.data(), c.n, j0, j1);
          } else {
            ok_want = qgemv::scalar::RowsInt16(t.m, xa, want.data(), c.n, j0, j1);
            ok_got = qgemv::scalar::RowsInt16(w, xa, got.data(), c.n, j0, j1);
          }
          ASSERT_TRUE(ok_want && ok_got);
          ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
              << TypeInfo(c.type).name << " " << IsaName(isa) << " rows " << j0 << ".." << j1;
        }
      }
    }
    SetIsaCap(IsaLevel::kAmx);
  }
  // Types the kernels read as floats, and K-quants, keep the GGUF layout.
  std::mt19937 rng(3);
  EXPECT_FALSE(CanInterleave(MakeMatrix(GgmlType::kF16, 8, 64, rng).m));
  EXPECT_FALSE(CanInterleave(MakeMatrix(GgmlType::kQ6_K, 8, 256, rng).m));
}

TEST(QuantGemmTest, StackedPartsAndAccumulateEqualSeparateCalls) {
  std::mt19937 rng(21);
  const int64_t k = 128;
  TestMatrix a = MakeMatrix(GgmlType::kQ4_1, 40, k, rng);
  TestMatrix b = MakeMatrix(GgmlType::kQ8_0, 17, k, rng);
  TestMatrix c = MakeMatrix(GgmlType::kF16, 9, k, rng);
  TestMatrix d = MakeMatrix(GgmlType::kQ6_K, 8, 256, rng);  // other k: only as its own part
  const int64_t n = 40 + 17 + 9;
  const QuantPart parts[] = {{a.m, 0}, {b.m, 40}, {c.m, 57}};
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (IsaLevel isa : Levels()) {
    SetIsaCap(isa);
    for (GemvMode mode : {GemvMode::kF32, GemvMode::kInt8, GemvMode::kInt16, GemvMode::kBf16}) {
      for (int m : {1, 3, 5}) {
        const int64_t ldx = k + 1, ldy = n + 2;
        std::vector<float> x(m * ldx), base(m * ldy);
        for (float& v : x) v = nd(rng);
        for (float& v : base) v = nd(rng);
        std::vector<float> want(m * ldy, -3.0f), want_acc = base;
        QuantGemm(a.m, x.data(), m, ldx, want.data(), ldy, mode);
        QuantGemm(b.m, x.data(), m, ldx, want.data() + 40, ldy, mode);
        QuantGemm(c.m, x.data(), m, ldx, want.data() + 57, ldy, mode);
        for (int i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) want_acc[i * ldy + j] += want[i * ldy + j];
        std::vector<float> got(m * ldy, -3.0f), got_acc = base;
        QuantGemm(parts, x.data(), m, ldx, got.data(), ldy, mode, false);
        QuantGemm(parts, x.data(), m, ldx, got_acc.data(), ldy, mode, true);
        ASSERT_EQ(got, want) << IsaName(isa) << " mode " << int(mode) << " m " << m;
        ASSERT_EQ(got_acc, want_acc) << IsaName(isa) << " mode " << int(mode) << " m " << m;
      }
    }
    // A part whose k differs from the first part's is refused with NaNs, the others computed.
    const QuantPart mixed[] = {{a.m, 0}, {d.m, 40}};
    std::vector<float> x(256, 0.5f), y(48, 0.0f);
    QuantGemm(mixed, x.data(), 1, 256, y.data(), 48, GemvMode::kF32, false);
    EXPECT_TRUE(std::isnan(y[40])) << IsaName(isa);
    EXPECT_FALSE(std::isnan(y[0])) << IsaName(isa);
  }
  SetIsaCap(IsaLevel::kAmx);
}

// The prefill GEMM's tiles: DequantizeMatrixRow equals the reference dequantiser (within one
// rounding) for every type, in both layouts, on every ISA.
TEST(QuantGemmTest, DequantizeMatrixRowMatchesReference) {
  const Case cases[] = {{GgmlType::kQ4_1, 37, 576}, {GgmlType::kQ4_0, 13, 64},
                        {GgmlType::kQ8_0, 9, 96},   {GgmlType::kQ5_0, 7, 896},
                        {GgmlType::kQ5_1, 5, 288},  {GgmlType::kQ4_K, 6, 1536},
                        {GgmlType::kQ5_K, 3, 768},  {GgmlType::kQ6_K, 5, 2304},
                        {GgmlType::kF16, 4, 100},   {GgmlType::kF32, 3, 37}};
  for (const Case& c : cases) {
    std::mt19937 rng(11 + static_cast<int>(c.k));
    TestMatrix t = MakeMatrix(c.type, c.n, c.k, rng);
    std::vector<uint8_t> il(t.bytes.size());
    QuantMatrix wil = t.m;
    if (CanInterleave(t.m)) {
      InterleaveRows(t.m, il.data());
      wil.data = il.data();
      wil.interleave = kInterleaveRows;
    }
    for (IsaLevel isa : Levels()) {
      SetIsaCap(isa);
      for (const QuantMatrix& w : {t.m, wil}) {
        std::vector<float> row(c.k, -7.0f);
        for (int64_t j = 0; j < c.n; ++j) {
          DequantizeMatrixRow(w, j, row.data());
          // One rounding of the row's scale (Q4_1's d * q + m may be fused).
          float big = 0.0f;
          for (int64_t e = 0; e < c.k; ++e) big = std::max(big, std::fabs(t.deq[j * c.k + e]));
          for (int64_t e = 0; e < c.k; ++e) {
            const float want = t.deq[j * c.k + e];
            ASSERT_NEAR(row[e], want, 1e-6f * (std::fabs(want) + big))
                << TypeInfo(c.type).name << " " << IsaName(isa) << " interleave " << w.interleave
                << " row " << j << " element " << e;
          }
        }
      }
    }
    SetIsaCap(IsaLevel::kAmx);
  }
}

}  // namespace
}  // namespace tripod::quant_gemv_test
