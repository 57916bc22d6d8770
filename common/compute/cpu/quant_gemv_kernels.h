// The QuantGemm inner loops on 256-bit vectors, written once and compiled into each ISA file
// (quant_gemv_avx2.cc, quant_gemv_avx512.cc) with that file's flags. Include only from those
// files, after defining `struct Isa` with `static __m256i DotU8S8(__m256i u8, __m256i s8)`:
// the per-32-bit-lane sums of four u8 x s8 products. Everything here has internal linkage so
// that no copy compiled for a wider ISA can be picked by the linker for another file.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "common/compute/cpu/quant_gemv_internal.h"

namespace tripod::qgemv {
namespace {

inline float Hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float HalfToFloat(const uint8_t* p) {
  uint16_t h;
  __builtin_memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// 32 nibbles of a Q4 block as bytes in element order: low nibbles (0..15) then high (16..31).
inline __m256i Q4Bytes(const uint8_t* qs) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m128i lo = _mm_and_si128(q, mask);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
  return _mm256_set_m128i(hi, lo);
}

inline void U8x16ToFloats(__m128i b, __m256* out) {
  out[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));
  out[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(b, 8)));
}

// Dequantises 32 consecutive elements (block b of 32) of a row into w[0..3].
template <GgmlType T>
inline void Dequant32(const uint8_t* row, int64_t b, __m256* w) {
  if constexpr (T == GgmlType::kQ4_0 || T == GgmlType::kQ4_1) {
    constexpr int kBytes = T == GgmlType::kQ4_0 ? 18 : 20;
    const uint8_t* blk = row + b * kBytes;
    const __m256 d = _mm256_set1_ps(HalfToFloat(blk));
    const __m256 off = T == GgmlType::kQ4_0 ? _mm256_mul_ps(d, _mm256_set1_ps(-8.0f))
                                            : _mm256_set1_ps(HalfToFloat(blk + 2));
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kBytes - 16));
    const __m128i mask = _mm_set1_epi8(0x0f);
    U8x16ToFloats(_mm_and_si128(q, mask), w);
    U8x16ToFloats(_mm_and_si128(_mm_srli_epi16(q, 4), mask), w + 2);
    for (int p = 0; p < 4; ++p) w[p] = _mm256_fmadd_ps(w[p], d, off);
  } else if constexpr (T == GgmlType::kQ8_0) {
    const uint8_t* blk = row + b * 34;
    const __m256 d = _mm256_set1_ps(HalfToFloat(blk));
    for (int p = 0; p < 4; ++p) {
      const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 2 + 8 * p));
      w[p] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
    }
  } else if constexpr (T == GgmlType::kF16) {
    const uint8_t* p0 = row + b * 64;
    for (int p = 0; p < 4; ++p) {
      w[p] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p0 + 16 * p)));
    }
  } else if constexpr (T == GgmlType::kBF16) {
    const uint8_t* p0 = row + b * 64;
    for (int p = 0; p < 4; ++p) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p0 + 16 * p));
      w[p] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
  } else {
    const float* p0 = reinterpret_cast<const float*>(row) + b * 32;
    for (int p = 0; p < 4; ++p) w[p] = _mm256_loadu_ps(p0 + 8 * p);
  }
}

// Scalar element t of a float-type row (tails of rows whose length is not a multiple of 32).
template <GgmlType T>
inline float FloatElem(const uint8_t* row, int64_t t) {
  if constexpr (T == GgmlType::kF16) {
    return HalfToFloat(row + 2 * t);
  } else if constexpr (T == GgmlType::kBF16) {
    uint16_t h;
    __builtin_memcpy(&h, row + 2 * t, 2);
    const uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
  } else {
    float f;
    __builtin_memcpy(&f, row + 4 * t, 4);
    return f;
  }
}

// One weight row against MG rows of x. Enough independent accumulators to hide FMA latency:
// 4 per x row when there are few rows, 2 when the MG x rows already give 6-8 chains.
template <GgmlType T, int MG>
inline void RowDotF32(const uint8_t* row, const float* x, int64_t ldx, int64_t k, float* y,
                      int64_t ldy) {
  constexpr int NA = MG <= 2 ? 4 : 2;
  __m256 acc[MG][NA];
  for (int i = 0; i < MG; ++i)
    for (int a = 0; a < NA; ++a) acc[i][a] = _mm256_setzero_ps();
  const int64_t nb = k / 32;
  for (int64_t b = 0; b < nb; ++b) {
    __m256 w[4];
    Dequant32<T>(row, b, w);
    for (int i = 0; i < MG; ++i) {
      const float* xb = x + i * ldx + b * 32;
      for (int p = 0; p < 4; ++p) {
        acc[i][p % NA] = _mm256_fmadd_ps(w[p], _mm256_loadu_ps(xb + 8 * p), acc[i][p % NA]);
      }
    }
  }
  for (int i = 0; i < MG; ++i) {
    __m256 s = acc[i][0];
    for (int a = 1; a < NA; ++a) s = _mm256_add_ps(s, acc[i][a]);
    float r = Hsum(s);
    if constexpr (T == GgmlType::kF32 || T == GgmlType::kF16 || T == GgmlType::kBF16) {
      for (int64_t t = nb * 32; t < k; ++t) r += FloatElem<T>(row, t) * x[i * ldx + t];
    }
    y[i * ldy] = r;
  }
}

template <GgmlType T>
void RowsF32T(const QuantMatrix& w, const float* x, int m, int64_t ldx, float* y, int64_t ldy,
              int64_t j0, int64_t j1) {
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  for (int64_t j = j0; j < j1; ++j) {
    const uint8_t* row = base + j * w.row_bytes;
    int i = 0;
    // Groups of up to 4 x rows; the weight row stays in L1 between groups.
    for (; i + 4 <= m; i += 4) RowDotF32<T, 4>(row, x + i * ldx, ldx, w.k, y + i * ldy + j, ldy);
    switch (m - i) {
      case 3:
        RowDotF32<T, 3>(row, x + i * ldx, ldx, w.k, y + i * ldy + j, ldy);
        break;
      case 2:
        RowDotF32<T, 2>(row, x + i * ldx, ldx, w.k, y + i * ldy + j, ldy);
        break;
      case 1:
        RowDotF32<T, 1>(row, x + i * ldx, ldx, w.k, y + i * ldy + j, ldy);
        break;
      default:
        break;
    }
  }
}

template <class Isa>
bool RowsF32Impl(const QuantMatrix& w, const float* x, int m, int64_t ldx, float* y, int64_t ldy,
                 int64_t j0, int64_t j1) {
  switch (w.type) {
    case GgmlType::kF32:
      RowsF32T<GgmlType::kF32>(w, x, m, ldx, y, ldy, j0, j1);
      return true;
    case GgmlType::kF16:
      RowsF32T<GgmlType::kF16>(w, x, m, ldx, y, ldy, j0, j1);
      return true;
    case GgmlType::kBF16:
      RowsF32T<GgmlType::kBF16>(w, x, m, ldx, y, ldy, j0, j1);
      return true;
    case GgmlType::kQ4_0:
      RowsF32T<GgmlType::kQ4_0>(w, x, m, ldx, y, ldy, j0, j1);
      return true;
    case GgmlType::kQ4_1:
      RowsF32T<GgmlType::kQ4_1>(w, x, m, ldx, y, ldy, j0, j1);
      return true;
    case GgmlType::kQ8_0:
      RowsF32T<GgmlType::kQ8_0>(w, x, m, ldx, y, ldy, j0, j1);
      return true;
    default:
      return false;
  }
}

// One weight row against MG rows of int8 x. Blocks alternate between two accumulator sets so
// the FMA chains are half as long; the offset / minimum terms go to two scalar chains likewise.
template <class Isa, GgmlType T, int MG>
inline void RowDotInt8(const uint8_t* row, const Int8Act& xa, int i0, float* y, int64_t ldy) {
  constexpr int kBytes = T == GgmlType::kQ4_0 ? 18 : T == GgmlType::kQ4_1 ? 20 : 34;
  __m256 acc[MG][2];
  float side[MG][2];
  for (int i = 0; i < MG; ++i) {
    acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    side[i][0] = side[i][1] = 0.0f;
  }
  const int64_t nb = xa.nb;
  const int8_t* xq = xa.q + i0 * xa.k;
  const float* xs = xa.scale + i0 * nb;
  const float* xsum = xa.sum + i0 * nb;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = row + b * kBytes;
    const float dw = HalfToFloat(blk);
    const int par = static_cast<int>(b & 1);
    if constexpr (T == GgmlType::kQ8_0) {
      const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
      const __m256i aw = _mm256_abs_epi8(wv);
      for (int i = 0; i < MG; ++i) {
        const __m256i xv =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + i * xa.k + b * 32));
        const __m256i dot = Isa::DotU8S8(aw, _mm256_sign_epi8(xv, wv));
        acc[i][par] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(dw * xs[i * nb + b]),
                                      acc[i][par]);
      }
    } else {
      const __m256i wv = Q4Bytes(blk + kBytes - 16);
      const float side_w = T == GgmlType::kQ4_1 ? HalfToFloat(blk + 2) : -8.0f * dw;
      for (int i = 0; i < MG; ++i) {
        const __m256i xv =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + i * xa.k + b * 32));
        const __m256i dot = Isa::DotU8S8(wv, xv);
        acc[i][par] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(dw * xs[i * nb + b]),
                                      acc[i][par]);
        side[i][par] += side_w * xsum[i * nb + b];
      }
    }
  }
  for (int i = 0; i < MG; ++i) {
    y[i * ldy] = Hsum(_mm256_add_ps(acc[i][0], acc[i][1])) + (side[i][0] + side[i][1]);
  }
}

template <class Isa, GgmlType T>
void RowsInt8T(const QuantMatrix& w, const Int8Act& xa, float* y, int64_t ldy, int64_t j0,
               int64_t j1) {
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  const int m = xa.m;
  for (int64_t j = j0; j < j1; ++j) {
    const uint8_t* row = base + j * w.row_bytes;
    int i = 0;
    for (; i + 4 <= m; i += 4) RowDotInt8<Isa, T, 4>(row, xa, i, y + i * ldy + j, ldy);
    switch (m - i) {
      case 3:
        RowDotInt8<Isa, T, 3>(row, xa, i, y + i * ldy + j, ldy);
        break;
      case 2:
        RowDotInt8<Isa, T, 2>(row, xa, i, y + i * ldy + j, ldy);
        break;
      case 1:
        RowDotInt8<Isa, T, 1>(row, xa, i, y + i * ldy + j, ldy);
        break;
      default:
        break;
    }
  }
}

template <class Isa>
bool RowsInt8Impl(const QuantMatrix& w, const Int8Act& xa, float* y, int64_t ldy, int64_t j0,
                  int64_t j1) {
  switch (w.type) {
    case GgmlType::kQ4_0:
      RowsInt8T<Isa, GgmlType::kQ4_0>(w, xa, y, ldy, j0, j1);
      return true;
    case GgmlType::kQ4_1:
      RowsInt8T<Isa, GgmlType::kQ4_1>(w, xa, y, ldy, j0, j1);
      return true;
    case GgmlType::kQ8_0:
      RowsInt8T<Isa, GgmlType::kQ8_0>(w, xa, y, ldy, j0, j1);
      return true;
    default:
      return false;
  }
}

}  // namespace
}  // namespace tripod::qgemv
