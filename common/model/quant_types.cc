// GGML tensor types: the type table, row sizes, fp16/bf16 conversions and scalar dequantisation.
// Arithmetic follows GGML's reference dequantisers operation by operation so results are bit-exact.
#include "common/model/quant_types.h"

#include <array>
#include <bit>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tripod {
namespace {

constexpr GgmlTypeInfo kTypes[] = {
    {GgmlType::kF32, "F32", 1, 4},
    {GgmlType::kF16, "F16", 1, 2},
    {GgmlType::kQ4_0, "Q4_0", 32, static_cast<int>(sizeof(BlockQ4_0))},
    {GgmlType::kQ4_1, "Q4_1", 32, static_cast<int>(sizeof(BlockQ4_1))},
    {GgmlType::kQ5_0, "Q5_0", 32, static_cast<int>(sizeof(BlockQ5_0))},
    {GgmlType::kQ5_1, "Q5_1", 32, static_cast<int>(sizeof(BlockQ5_1))},
    {GgmlType::kQ8_0, "Q8_0", 32, static_cast<int>(sizeof(BlockQ8_0))},
    {GgmlType::kQ4_K, "Q4_K", kQkK, static_cast<int>(sizeof(BlockQ4_K))},
    {GgmlType::kQ5_K, "Q5_K", kQkK, static_cast<int>(sizeof(BlockQ5_K))},
    {GgmlType::kQ6_K, "Q6_K", kQkK, static_cast<int>(sizeof(BlockQ6_K))},
    {GgmlType::kBF16, "BF16", 1, 2},
};

// Names of GGML type ids we do not support, so that the error names the type.
std::string_view UnsupportedTypeName(uint32_t id) {
  static constexpr std::array<std::string_view, 42> kNames = {"F32",
                                                              "F16",
                                                              "Q4_0",
                                                              "Q4_1",
                                                              "Q4_2 (removed)",
                                                              "Q4_3 (removed)",
                                                              "Q5_0",
                                                              "Q5_1",
                                                              "Q8_0",
                                                              "Q8_1",
                                                              "Q2_K",
                                                              "Q3_K",
                                                              "Q4_K",
                                                              "Q5_K",
                                                              "Q6_K",
                                                              "Q8_K",
                                                              "IQ2_XXS",
                                                              "IQ2_XS",
                                                              "IQ3_XXS",
                                                              "IQ1_S",
                                                              "IQ4_NL",
                                                              "IQ3_S",
                                                              "IQ2_S",
                                                              "IQ4_XS",
                                                              "I8",
                                                              "I16",
                                                              "I32",
                                                              "I64",
                                                              "F64",
                                                              "IQ1_M",
                                                              "BF16",
                                                              "",
                                                              "",
                                                              "",
                                                              "TQ1_0",
                                                              "TQ2_0",
                                                              "",
                                                              "",
                                                              "",
                                                              "MXFP4",
                                                              "NVFP4",
                                                              "Q1_0"};
  return id < kNames.size() ? kNames[id] : std::string_view();
}

// This Abseil's string_view is its own type, so std::string_view needs converting for StrCat.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

template <typename Block>
Block LoadBlock(const uint8_t* p) {
  // memcpy: tensor data in a GGUF need not be aligned for the block struct.
  Block b;
  std::memcpy(&b, p, sizeof(Block));
  return b;
}

// The j-th 6-bit scale and min of a Q4_K/Q5_K super-block (GGML's get_scale_min_k4).
inline void ScaleMinK4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

void DequantQ4_0(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, src += sizeof(BlockQ4_0), y += 32) {
    const auto b = LoadBlock<BlockQ4_0>(src);
    const float d = Fp16ToFp32(b.d);
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>((b.qs[j] & 0x0F) - 8) * d;
      y[j + 16] = static_cast<float>((b.qs[j] >> 4) - 8) * d;
    }
  }
}

void DequantQ4_1(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, src += sizeof(BlockQ4_1), y += 32) {
    const auto b = LoadBlock<BlockQ4_1>(src);
    const float d = Fp16ToFp32(b.d);
    const float m = Fp16ToFp32(b.m);
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>(b.qs[j] & 0x0F) * d + m;
      y[j + 16] = static_cast<float>(b.qs[j] >> 4) * d + m;
    }
  }
}

// Q5_0 / Q5_1: the fifth bit of element j is bit j of the little-endian qh word.
template <bool kMin>
void DequantQ5(const uint8_t* src, float* y, int64_t nb) {
  constexpr size_t kBytes = kMin ? sizeof(BlockQ5_1) : sizeof(BlockQ5_0);
  for (int64_t i = 0; i < nb; ++i, src += kBytes, y += 32) {
    uint16_t dh, mh = 0;
    std::memcpy(&dh, src, 2);
    if (kMin) std::memcpy(&mh, src + 2, 2);
    const uint8_t* p = src + (kMin ? 4 : 2);
    uint32_t qh;
    std::memcpy(&qh, p, 4);
    const uint8_t* qs = p + 4;
    const float d = Fp16ToFp32(dh);
    const float m = Fp16ToFp32(mh);
    for (int j = 0; j < 16; ++j) {
      const int lo = (qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1) << 4);
      const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1) << 4);
      if (kMin) {
        y[j] = static_cast<float>(lo) * d + m;
        y[j + 16] = static_cast<float>(hi) * d + m;
      } else {
        y[j] = static_cast<float>(lo - 16) * d;
        y[j + 16] = static_cast<float>(hi - 16) * d;
      }
    }
  }
}

void DequantQ8_0(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, src += sizeof(BlockQ8_0), y += 32) {
    const auto b = LoadBlock<BlockQ8_0>(src);
    const float d = Fp16ToFp32(b.d);
    for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(b.qs[j]) * d;
  }
}

void DequantQ4_K(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, src += sizeof(BlockQ4_K)) {
    const auto b = LoadBlock<BlockQ4_K>(src);
    const float d = Fp16ToFp32(b.d);
    const float min = Fp16ToFp32(b.dmin);
    const uint8_t* q = b.qs;
    for (int j = 0, is = 0; j < kQkK; j += 64, is += 2, q += 32) {
      uint8_t sc, m;
      ScaleMinK4(is, b.scales, &sc, &m);
      const float d1 = d * sc, m1 = min * m;
      ScaleMinK4(is + 1, b.scales, &sc, &m);
      const float d2 = d * sc, m2 = min * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
}

void DequantQ5_K(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, src += sizeof(BlockQ5_K)) {
    const auto b = LoadBlock<BlockQ5_K>(src);
    const float d = Fp16ToFp32(b.d);
    const float min = Fp16ToFp32(b.dmin);
    const uint8_t* ql = b.qs;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0, is = 0; j < kQkK; j += 64, is += 2, ql += 32) {
      uint8_t sc, m;
      ScaleMinK4(is, b.scales, &sc, &m);
      const float d1 = d * sc, m1 = min * m;
      ScaleMinK4(is + 1, b.scales, &sc, &m);
      const float d2 = d * sc, m2 = min * m;
      for (int l = 0; l < 32; ++l) {
        *y++ = d1 * static_cast<float>((ql[l] & 0xF) + ((b.qh[l] & u1) ? 16 : 0)) - m1;
      }
      for (int l = 0; l < 32; ++l) {
        *y++ = d2 * static_cast<float>((ql[l] >> 4) + ((b.qh[l] & u2) ? 16 : 0)) - m2;
      }
      u1 = static_cast<uint8_t>(u1 << 2);
      u2 = static_cast<uint8_t>(u2 << 2);
    }
  }
}

void DequantQ6_K(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, src += sizeof(BlockQ6_K)) {
    const auto b = LoadBlock<BlockQ6_K>(src);
    const float d = Fp16ToFp32(b.d);
    const uint8_t* ql = b.ql;
    const uint8_t* qh = b.qh;
    const int8_t* sc = b.scales;
    for (int n = 0; n < kQkK; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l + 0] = d * sc[is + 0] * static_cast<float>(q1);
        y[l + 32] = d * sc[is + 2] * static_cast<float>(q2);
        y[l + 64] = d * sc[is + 4] * static_cast<float>(q3);
        y[l + 96] = d * sc[is + 6] * static_cast<float>(q4);
      }
    }
  }
}

}  // namespace

absl::StatusOr<GgmlTypeInfo> LookupGgmlType(uint32_t id) {
  for (const GgmlTypeInfo& t : kTypes) {
    if (static_cast<uint32_t>(t.type) == id) return t;
  }
  const std::string_view name = UnsupportedTypeName(id);
  if (!name.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported tensor type ", Sv(name), " (id ", id, ")"));
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown tensor type id ", id));
}

const GgmlTypeInfo& TypeInfo(GgmlType type) {
  for (const GgmlTypeInfo& t : kTypes) {
    if (t.type == type) return t;
  }
  return kTypes[0];  // unreachable for valid enum values
}

absl::StatusOr<size_t> RowBytes(GgmlType type, int64_t n) {
  const GgmlTypeInfo& t = TypeInfo(type);
  if (n < 0 || n % t.block_elems != 0) {
    return absl::InvalidArgumentError(absl::StrCat("row of ", n, " elements is not a multiple of ",
                                                   Sv(t.name), "'s block size ", t.block_elems));
  }
  size_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(n / t.block_elems),
                             static_cast<uint64_t>(t.block_bytes), &bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("row of ", n, " ", Sv(t.name), " elements overflows a byte count"));
  }
  return bytes;
}

void DequantizeRow(GgmlType type, const void* src, float* dst, int64_t n) {
  const auto* s = static_cast<const uint8_t*>(src);
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, s, static_cast<size_t>(n) * sizeof(float));
      return;
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, s + 2 * i, 2);
        dst[i] = Fp16ToFp32(h);
      }
      return;
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, s + 2 * i, 2);
        dst[i] = Bf16ToFp32(h);
      }
      return;
    case GgmlType::kQ4_0:
      return DequantQ4_0(s, dst, n / 32);
    case GgmlType::kQ4_1:
      return DequantQ4_1(s, dst, n / 32);
    case GgmlType::kQ5_0:
      return DequantQ5<false>(s, dst, n / 32);
    case GgmlType::kQ5_1:
      return DequantQ5<true>(s, dst, n / 32);
    case GgmlType::kQ8_0:
      return DequantQ8_0(s, dst, n / 32);
    case GgmlType::kQ4_K:
      return DequantQ4_K(s, dst, n / kQkK);
    case GgmlType::kQ5_K:
      return DequantQ5_K(s, dst, n / kQkK);
    case GgmlType::kQ6_K:
      return DequantQ6_K(s, dst, n / kQkK);
  }
}

float Fp16ToFp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  const uint32_t mant = h & 0x3FF;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in fp32.
    const float v = static_cast<float>(mant) * 0x1p-24f;
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7F800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t Fp32ToFp16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const uint32_t abs = bits & 0x7FFFFFFF;
  if (abs > 0x7F800000) {  // NaN: keep it a quiet NaN with the top payload bits
    return static_cast<uint16_t>(sign | 0x7E00 | ((abs >> 13) & 0x3FF));
  }
  if (abs >= 0x477FF000) return sign | 0x7C00;  // >= 65520 rounds to infinity
  const uint32_t exp = abs >> 23;
  if (exp < 113) {
    // Result is subnormal (or zero): units of 2^-24, round to nearest even.
    if (exp < 102) return sign;  // < 2^-25: rounds to zero
    const uint32_t mant = (abs & 0x7FFFFF) | 0x800000;
    const uint32_t shift = 126 - exp;  // 14..24
    uint32_t q = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t q = ((exp - 112) << 10) | ((abs & 0x7FFFFF) >> 13);
  const uint32_t rem = abs & 0x1FFF;
  if (rem > 0x1000 || (rem == 0x1000 && (q & 1))) ++q;  // a carry moves into the exponent
  return static_cast<uint16_t>(sign | q);
}

float Bf16ToFp32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

uint16_t Fp32ToBf16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  if ((bits & 0x7FFFFFFF) > 0x7F800000) {
    return static_cast<uint16_t>((bits >> 16) | 64);  // NaN: force quiet, as GGML does
  }
  return static_cast<uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}

}  // namespace tripod
