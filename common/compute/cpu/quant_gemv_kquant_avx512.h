// 512-bit bf16 kernels for the K-quants, Q5_0 and Q5_1 (GGUF layout, read in place), and the row
// loop the integer kernels of quant_gemv_kquant_vnni_avx512.h share; included only by
// quant_gemv_avx512.cc after quant_gemv_kquant_kernels.h, whose per-type runs and scales they use.
//  - bf16 mode (4 x rows and more, AVX512_BF16): each block dequantised once to bf16 in registers
//    (d * w + mn in fp32, the reference dequantiser's two roundings, then rounded to nearest even:
//    the bf16 GEMM's weights) and multiplied against every x row of the group by vpdpbf16ps,
//    32 products an instruction with fp32 accumulation; no per-block conversion per x row.
// It keeps one accumulator per (weight row, x row) over the blocks in order, so a row's result
// does not depend on the other rows of the call (batch invariance).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "common/compute/cpu/quant_gemv_internal.h"
#include "common/compute/cpu/quant_gemv_kquant_kernels.h"

namespace tripod::qgemv {
namespace {

inline __m512i Widen512(const uint8_t* p) {
  return _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// The 32 integer weights of x block S of a run as int16 (KTraits' Weights, 512 bits wide).
template <GgmlType T, int S>
inline __m512i Weights512(const uint8_t* run) {
  const __m512i low4 = _mm512_set1_epi16(0x0f);
  if constexpr (T == GgmlType::kQ4_K || T == GgmlType::kQ5_K) {
    constexpr bool kFive = T == GgmlType::kQ5_K;
    const __m512i z = Widen512(run + (kFive ? 48 : 16) + 32 * (S / 2));
    __m512i w = (S & 1) ? _mm512_srli_epi16(z, 4) : _mm512_and_si512(z, low4);
    if constexpr (kFive) {
      const __m512i h =
          _mm512_and_si512(_mm512_srli_epi16(Widen512(run + 16), S), _mm512_set1_epi16(1));
      w = _mm512_or_si512(w, _mm512_slli_epi16(h, 4));
    }
    return w;
  } else if constexpr (T == GgmlType::kQ6_K) {
    constexpr int n = S / 4, t = S % 4;
    const __m512i z = Widen512(run + 64 * n + 32 * (t & 1));
    const __m512i nib = (t >> 1) ? _mm512_srli_epi16(z, 4) : _mm512_and_si512(z, low4);
    const __m512i h = _mm512_and_si512(_mm512_srli_epi16(Widen512(run + 128 + 32 * n), 2 * t),
                                       _mm512_set1_epi16(3));
    const __m512i q =
        _mm512_sub_epi16(_mm512_or_si512(nib, _mm512_slli_epi16(h, 4)), _mm512_set1_epi16(32));
    // The 16 scales as int16 in the low half; lanes 0-15 take scale 8n + 2t, 16-31 the next.
    const __m512i sc = _mm512_castsi256_si512(
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(run + 192))));
    const __m512i idx = _mm512_inserti64x4(_mm512_set1_epi16(8 * n + 2 * t),
                                           _mm256_set1_epi16(8 * n + 2 * t + 1), 1);
    return _mm512_mullo_epi16(q, _mm512_permutexvar_epi16(idx, sc));
  } else {  // Q5_0, Q5_1
    constexpr bool kQ51 = T == GgmlType::kQ5_1;
    const uint8_t* blk = run + S * (kQ51 ? 24 : 22);
    uint32_t qh;
    std::memcpy(&qh, blk + (kQ51 ? 4 : 2), 4);
    const __m256i b = _mm256_cvtepu8_epi16(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + (kQ51 ? 8 : 6))));
    const __m512i z =
        _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(b, _mm256_set1_epi16(0x0f))),
                           _mm256_srli_epi16(b, 4), 1);
    // Bit l of qh is element l's fifth bit: one masked add.
    return _mm512_mask_add_epi16(z, static_cast<__mmask32>(qh), z, _mm512_set1_epi16(16));
  }
}

// bf16 mode: weights to bf16 once per block, vpdpbf16ps against each x row.
template <GgmlType T, int R, int MG>
inline void GroupKBf16(const uint8_t* row0, int64_t rs, const Bf16Act& xa, int i0, float* y,
                       int64_t ldy) {
  using K = KTraits<T>;
  const int64_t nb = xa.nb;
  __m512 acc[R][MG];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int i = 0; i < MG; ++i) acc[r][i] = _mm512_setzero_ps();
  alignas(32) float ds[R][kIlRun], ms[R][kIlRun];
  const uint16_t* x = xa.x + i0 * xa.k;
  for (int64_t b0 = 0; b0 < nb; b0 += kIlRun) {
    const int nc = static_cast<int>(std::min<int64_t>(kIlRun, nb - b0));
    const uint8_t* run0 = K::Run(row0, b0);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const uint8_t* run = run0 + r * rs;
      PrefetchRun<K::kBlockBytes>(run + kPrefetchBytes);
      __m256 d, mn;
      K::Scales(run, nc, &d, &mn);
      _mm256_store_ps(ds[r], d);
      _mm256_store_ps(ms[r], mn);
    }
    ForBlocks(nc, [&](auto s) {
      constexpr int S = decltype(s)::value;
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512i w = Weights512<T, S>(run0 + r * rs);
        const __m512 d = _mm512_set1_ps(ds[r][S]), mn = _mm512_set1_ps(ms[r][S]);
        const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_castsi512_si256(w)));
        const __m512 hi =
            _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(w, 1)));
        const __m512bh wb = _mm512_cvtne2ps_pbh(_mm512_add_ps(_mm512_mul_ps(hi, d), mn),
                                                _mm512_add_ps(_mm512_mul_ps(lo, d), mn));
#pragma GCC unroll 8
        for (int i = 0; i < MG; ++i) {
          const __m512i xv = _mm512_loadu_si512(x + i * xa.k + (b0 + S) * 32);
          acc[r][i] = _mm512_dpbf16_ps(acc[r][i], wb, reinterpret_cast<__m512bh>(xv));
        }
      }
    });
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int i = 0; i < MG; ++i) y[i * ldy + r] = _mm512_reduce_add_ps(acc[r][i]);
}

template <GgmlType T, int RN, int MG>
inline void BfGroups(const uint8_t* row0, int64_t rs, const Bf16Act& xa, int i, float* y,
                     int64_t ldy) {
  constexpr int R = std::min(RN, 2);
  for (int r = 0; r < RN; r += R) {
    GroupKBf16<T, R, MG>(row0 + r * rs, rs, xa, i, y + i * ldy + r, ldy);
  }
}

template <GgmlType T, int RN>
inline void StepKBf16(const uint8_t* row0, int64_t rs, const Bf16Act& xa, float* y, int64_t ldy) {
  int i = 0;
  for (; i + 8 <= xa.m; i += 8) BfGroups<T, RN, 8>(row0, rs, xa, i, y, ldy);
  switch (xa.m - i) {
    case 7:
      BfGroups<T, RN, 7>(row0, rs, xa, i, y, ldy);
      break;
    case 6:
      BfGroups<T, RN, 6>(row0, rs, xa, i, y, ldy);
      break;
    case 5:
      BfGroups<T, RN, 5>(row0, rs, xa, i, y, ldy);
      break;
    case 4:
      BfGroups<T, RN, 4>(row0, rs, xa, i, y, ldy);
      break;
    case 3:
      BfGroups<T, RN, 3>(row0, rs, xa, i, y, ldy);
      break;
    case 2:
      BfGroups<T, RN, 2>(row0, rs, xa, i, y, ldy);
      break;
    case 1:
      BfGroups<T, RN, 1>(row0, rs, xa, i, y, ldy);
      break;
    default:
      break;
  }
}

template <GgmlType T, class Act, class Step4, class Step1>
inline void RowsK512T(const QuantMatrix& w, const Act& xa, float* y, int64_t ldy, int64_t j0,
                      int64_t j1, Step4 step4, Step1 step1) {
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  const int64_t rb = w.row_bytes;
  int64_t j = j0;
  for (; j + 4 <= j1; j += 4) step4(base + j * rb, rb, xa, y + j, ldy);
  for (; j < j1; ++j) step1(base + j * rb, rb, xa, y + j, ldy);
}

template <GgmlType T>
inline void RowsBf16KT(const QuantMatrix& w, const Bf16Act& xa, float* y, int64_t ldy, int64_t j0,
                       int64_t j1) {
  RowsK512T<T>(w, xa, y, ldy, j0, j1, StepKBf16<T, 4>, StepKBf16<T, 1>);
}

inline bool RowsBf16K(const QuantMatrix& w, const Bf16Act& xa, float* y, int64_t ldy, int64_t j0,
                      int64_t j1) {
  if (w.interleave != 1) return false;
  return ForKType(w.type, [&](auto t) { RowsBf16KT<decltype(t)::value>(w, xa, y, ldy, j0, j1); });
}

}  // namespace
}  // namespace tripod::qgemv
