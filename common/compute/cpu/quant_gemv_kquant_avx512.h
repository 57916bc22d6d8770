// 512-bit kernels for the K-quants, Q5_0 and Q5_1 (GGUF layout, read in place), included only by
// quant_gemv_avx512.cc after quant_gemv_kquant_kernels.h, whose per-type runs and scales they use:
//  - int16 mode: an x block's 32 weights widened to int16 in one zmm (vpmovzxbw of the block's
//    bytes, then its nibble or bits), one vpdpwssd against x's 32 int16 values, one conversion and
//    one FMA with d_s * d_x. Half the instructions of the 256-bit kernel per weight, which on 2
//    threads could not keep up with DRAM (62 % of a plain read of the 1.5B's decode pass on Zen 5).
//  - bf16 mode (4 x rows and more, AVX512_BF16): each block dequantised once to bf16 in registers
//    (d * w + mn in fp32, the reference dequantiser's two roundings, then rounded to nearest even:
//    the bf16 GEMM's weights) and multiplied against every x row of the group by vpdpbf16ps,
//    32 products an instruction with fp32 accumulation; no per-block conversion per x row.
// Both keep one accumulator per (weight row, x row) over the blocks in order, so a row's result
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

// The per-run scale table of GroupK16's, and the minima against x's block sums, folded into the
// zmm accumulators' low half.
template <GgmlType T, int R, int MG>
inline void RunScales512(const uint8_t* run0, int64_t rs, int nc, const float* xs,
                         const float* bsum, int64_t nb, int64_t b0, float (&sc)[R][MG][kIlRun],
                         __m512 (&acc)[R][MG]) {
  using K = KTraits<T>;
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const uint8_t* run = run0 + r * rs;
    _mm_prefetch(reinterpret_cast<const char*>(run + kPrefetchBytes), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(run + kPrefetchBytes + 64), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(run + kPrefetchBytes + 128), _MM_HINT_T0);
    if constexpr (K::kBlockBytes > 192) {
      _mm_prefetch(reinterpret_cast<const char*>(run + kPrefetchBytes + 192), _MM_HINT_T0);
    }
    __m256 d, mn;
    K::Scales(run, nc, &d, &mn);
#pragma GCC unroll 4
    for (int i = 0; i < MG; ++i) {
      const int64_t o = i * nb + b0;
      _mm256_store_ps(sc[r][i], _mm256_mul_ps(d, LoadUpTo8(xs + o, nc)));
      if constexpr (K::kMin) {
        acc[r][i] = _mm512_add_ps(
            acc[r][i], _mm512_zextps256_ps512(_mm256_mul_ps(mn, LoadUpTo8(bsum + o, nc))));
      }
    }
  }
}

template <GgmlType T, int R, int MG>
inline void GroupK16x512(const uint8_t* row0, int64_t rs, const Int16Act& xa, int i0, float* y,
                         int64_t ldy) {
  using K = KTraits<T>;
  const int64_t nb = xa.nb;
  __m512 acc[R][MG];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int i = 0; i < MG; ++i) acc[r][i] = _mm512_setzero_ps();
  alignas(32) float sc[R][MG][kIlRun];
  const int16_t* xq = xa.q + i0 * xa.k;
  const float* xs = xa.scale + i0 * nb;
  const float* bsum = K::kMin ? xa.bsum + i0 * nb : nullptr;
  for (int64_t b0 = 0; b0 < nb; b0 += kIlRun) {
    const int nc = static_cast<int>(std::min<int64_t>(kIlRun, nb - b0));
    const uint8_t* run0 = K::Run(row0, b0);
    RunScales512<T, R, MG>(run0, rs, nc, xs, bsum, nb, b0, sc, acc);
    ForBlocks(nc, [&](auto s) {
      constexpr int S = decltype(s)::value;
      __m512i xv[MG];
#pragma GCC unroll 4
      for (int i = 0; i < MG; ++i) xv[i] = _mm512_loadu_si512(xq + i * xa.k + (b0 + S) * 32);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512i w = Weights512<T, S>(run0 + r * rs);
#pragma GCC unroll 4
        for (int i = 0; i < MG; ++i) {
          const __m512i dot = _mm512_dpwssd_epi32(_mm512_setzero_si512(), w, xv[i]);
          acc[r][i] =
              _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(sc[r][i][S]), acc[r][i]);
        }
      }
    });
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int i = 0; i < MG; ++i) y[i * ldy + r] = _mm512_reduce_add_ps(acc[r][i]);
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
      _mm_prefetch(reinterpret_cast<const char*>(run + kPrefetchBytes), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(run + kPrefetchBytes + 64), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(run + kPrefetchBytes + 128), _MM_HINT_T0);
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

// Rows of one step (RN = 4 or 1) against every x row: int16 in groups of up to 4 x rows (4 weight
// rows at 1-2 x rows, 2 at 3-4), bf16 in groups of up to 8 x rows with 2 weight rows.
template <GgmlType T, int RN>
inline void StepK16x512(const uint8_t* row0, int64_t rs, const Int16Act& xa, float* y,
                        int64_t ldy) {
  constexpr int R12 = std::min(RN, 4), R34 = std::min(RN, 2);
  int i = 0;
  for (; i + 4 <= xa.m; i += 4) {
    for (int r = 0; r < RN; r += R34) {
      GroupK16x512<T, R34, 4>(row0 + r * rs, rs, xa, i, y + i * ldy + r, ldy);
    }
  }
  switch (xa.m - i) {
    case 3:
      for (int r = 0; r < RN; r += R34) {
        GroupK16x512<T, R34, 3>(row0 + r * rs, rs, xa, i, y + i * ldy + r, ldy);
      }
      break;
    case 2:
      for (int r = 0; r < RN; r += R12) {
        GroupK16x512<T, R12, 2>(row0 + r * rs, rs, xa, i, y + i * ldy + r, ldy);
      }
      break;
    case 1:
      for (int r = 0; r < RN; r += R12) {
        GroupK16x512<T, R12, 1>(row0 + r * rs, rs, xa, i, y + i * ldy + r, ldy);
      }
      break;
    default:
      break;
  }
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
inline void RowsInt16K512T(const QuantMatrix& w, const Int16Act& xa, float* y, int64_t ldy,
                           int64_t j0, int64_t j1) {
  RowsK512T<T>(w, xa, y, ldy, j0, j1, StepK16x512<T, 4>, StepK16x512<T, 1>);
}

template <GgmlType T>
inline void RowsBf16KT(const QuantMatrix& w, const Bf16Act& xa, float* y, int64_t ldy, int64_t j0,
                       int64_t j1) {
  RowsK512T<T>(w, xa, y, ldy, j0, j1, StepKBf16<T, 4>, StepKBf16<T, 1>);
}

inline bool RowsInt16K512(const QuantMatrix& w, const Int16Act& xa, float* y, int64_t ldy,
                          int64_t j0, int64_t j1) {
  if (w.interleave != 1) return false;
  return ForKType(w.type,
                  [&](auto t) { RowsInt16K512T<decltype(t)::value>(w, xa, y, ldy, j0, j1); });
}

inline bool RowsBf16K(const QuantMatrix& w, const Bf16Act& xa, float* y, int64_t ldy, int64_t j0,
                      int64_t j1) {
  if (w.interleave != 1) return false;
  return ForKType(w.type, [&](auto t) { RowsBf16KT<decltype(t)::value>(w, xa, y, ldy, j0, j1); });
}

}  // namespace
}  // namespace tripod::qgemv
