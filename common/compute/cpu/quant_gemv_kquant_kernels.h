// The int16 decode GEMV for the K-quants (Q4_K, Q5_K, Q6_K) and Q5_0 / Q5_1, on 256-bit vectors,
// compiled into each ISA file (quant_gemv_avx2.cc, quant_gemv_avx512.cc) after its `struct Isa`
// and quant_gemv_kernels.h (whose helpers it uses). Weights are read in their GGUF layout, in
// place (the file's mapping: no copy, no repacking), so that workers on one host share the pages.
//
// Every type is walked in runs of 8 x blocks of 32 elements (x's int16 scale blocks): a K-quant
// super-block (256 elements) is one run; Q5_0 / Q5_1 runs are 8 consecutive blocks (fewer at the
// row's end). Per run and weight row the 8 block scales d_s (and minima mn_s) are decoded into one
// vector and multiplied by x's 8 block scales into a table; per x block the weights are unpacked
// to int16 and dotted exactly with x's int16 values (vpdpwssd / vpmaddwd), and the int32 sums
// scaled once per block:
//   y += sum_s d_s * dx_s * dot(w_s, qx_s) + mn_s * sum(x_s)
// where w_s are the block's integer weights (Q6_K: q * its 16-element scale, so d_s is the
// super-block's d alone), and sum(x_s) x's exact fp32 block sums (the minima of Q4_K, Q5_K and
// Q5_1, and Q5_0's -16 d). Products stay far from int32's range: |w| <= 32 * 128 against |qx|
// <= 32767 gives at most 4 * 2^27 per lane and block.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/compute/cpu/quant_gemv_internal.h"

namespace tripod::qgemv {
namespace {

inline __m256i Load256(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// The two 16-element halves of 32 bytes as int16.
inline void Widen(__m256i v, __m256i* lo, __m256i* hi) {
  *lo = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(v));
  *hi = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(v, 1));
}

// Bit b of each byte of v moved to bit 4 (the fifth bit of a 5-bit value), other bits cleared.
// 16-bit shifts move no bit across a byte for b < 8 once masked.
template <int kBit>
inline __m256i BitTo4(__m256i v) {
  const __m256i m = _mm256_set1_epi8(0x10);
  if constexpr (kBit < 4) return _mm256_and_si256(_mm256_slli_epi16(v, 4 - kBit), m);
  if constexpr (kBit == 4) return _mm256_and_si256(v, m);
  return _mm256_and_si256(_mm256_srli_epi16(v, kBit - 4), m);
}

// Bits 2t and 2t + 1 of each byte moved to bits 4 and 5 (Q6_K's high bits), others cleared.
template <int kT>
inline __m256i Bits2To45(__m256i v) {
  const __m256i m = _mm256_set1_epi8(0x30);
  if constexpr (kT < 2) return _mm256_and_si256(_mm256_slli_epi16(v, 4 - 2 * kT), m);
  if constexpr (kT == 2) return _mm256_and_si256(v, m);
  return _mm256_and_si256(_mm256_srli_epi16(v, 2 * kT - 4), m);
}

// The 6-bit scales and minima of a Q4_K / Q5_K super-block (12 bytes) as 8 floats each.
inline void KScales(const uint8_t* s12, __m256* sc, __m256* mn) {
  uint32_t u[3];
  std::memcpy(u, s12, 12);
  const uint32_t sc_lo = u[0] & 0x3f3f3f3fu, mn_lo = u[1] & 0x3f3f3f3fu;
  const uint32_t sc_hi = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);
  const uint32_t mn_hi = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);
  const __m128i s = _mm_setr_epi32(static_cast<int>(sc_lo), static_cast<int>(sc_hi), 0, 0);
  const __m128i m = _mm_setr_epi32(static_cast<int>(mn_lo), static_cast<int>(mn_hi), 0, 0);
  *sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(s));
  *mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(m));
}

// Per type: where run c starts, its scales, and the int16 weights of its x block s.
template <GgmlType T>
struct KTraits;

template <>
struct KTraits<GgmlType::kQ4_K> {
  static constexpr int kBlockBytes = 144;
  static constexpr bool kMin = true;
  static const uint8_t* Run(const uint8_t* row, int64_t b0) { return row + b0 / 8 * kBlockBytes; }
  static void Scales(const uint8_t* run, int, __m256* d, __m256* mn) {
    __m256 sc, m;
    KScales(run + 4, &sc, &m);
    *d = _mm256_mul_ps(sc, _mm256_set1_ps(HalfToFloat(run)));
    *mn = _mm256_mul_ps(m, _mm256_set1_ps(-HalfToFloat(run + 2)));
  }
  template <int S>
  static void Weights(const uint8_t* run, __m256i* lo, __m256i* hi) {
    const __m256i q = Load256(run + 16 + 32 * (S / 2));
    const __m256i v = (S & 1) ? _mm256_srli_epi16(q, 4) : q;
    Widen(_mm256_and_si256(v, _mm256_set1_epi8(0x0f)), lo, hi);
  }
};

template <>
struct KTraits<GgmlType::kQ5_K> {
  static constexpr int kBlockBytes = 176;
  static constexpr bool kMin = true;
  static const uint8_t* Run(const uint8_t* row, int64_t b0) { return row + b0 / 8 * kBlockBytes; }
  static void Scales(const uint8_t* run, int cnt, __m256* d, __m256* mn) {
    KTraits<GgmlType::kQ4_K>::Scales(run, cnt, d, mn);
  }
  template <int S>
  static void Weights(const uint8_t* run, __m256i* lo, __m256i* hi) {
    const __m256i q = Load256(run + 48 + 32 * (S / 2));
    const __m256i v = (S & 1) ? _mm256_srli_epi16(q, 4) : q;
    const __m256i h = BitTo4<S>(Load256(run + 16));
    Widen(_mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi8(0x0f)), h), lo, hi);
  }
};

template <>
struct KTraits<GgmlType::kQ6_K> {
  static constexpr int kBlockBytes = 210;
  static constexpr bool kMin = false;
  static const uint8_t* Run(const uint8_t* row, int64_t b0) { return row + b0 / 8 * kBlockBytes; }
  static void Scales(const uint8_t* run, int, __m256* d, __m256* mn) {
    *d = _mm256_set1_ps(HalfToFloat(run + 208));
    *mn = _mm256_setzero_ps();
  }
  // x block S = 4 n + t: ql bytes 64 n + 32 (t & 1), nibble t >> 1, qh bits 2t of bytes 32 n,
  // scales 8 n + 2 t (elements 0-15) and + 1 (16-31).
  template <int S>
  static void Weights(const uint8_t* run, __m256i* lo, __m256i* hi) {
    constexpr int n = S / 4, t = S % 4;
    const __m256i q = Load256(run + 64 * n + 32 * (t & 1));
    const __m256i v = (t >> 1) ? _mm256_srli_epi16(q, 4) : q;
    const __m256i h = Bits2To45<t>(Load256(run + 128 + 32 * n));
    Widen(_mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi8(0x0f)), h), lo, hi);
    const __m256i off = _mm256_set1_epi16(32);
    const auto* sc = reinterpret_cast<const int8_t*>(run + 192 + 8 * n + 2 * t);
    *lo = _mm256_mullo_epi16(_mm256_sub_epi16(*lo, off), _mm256_set1_epi16(sc[0]));
    *hi = _mm256_mullo_epi16(_mm256_sub_epi16(*hi, off), _mm256_set1_epi16(sc[1]));
  }
};

// Q5_0 (kMinTerm false: value d (q - 16), the -16 d against x's block sums) and Q5_1 (d q + m).
template <bool kQ51>
struct Q5Traits {
  static constexpr int kBlockBytes = kQ51 ? 24 : 22;
  static constexpr bool kMin = true;
  static const uint8_t* Run(const uint8_t* row, int64_t b0) { return row + b0 * kBlockBytes; }
  static void Scales(const uint8_t* run, int cnt, __m256* d, __m256* mn) {
    *d = Halves8<kBlockBytes>(run, cnt);
    *mn = kQ51 ? Halves8<kBlockBytes>(run + 2, cnt) : _mm256_mul_ps(*d, _mm256_set1_ps(-16.0f));
  }
  template <int S>
  static void Weights(const uint8_t* run, __m256i* lo, __m256i* hi) {
    const uint8_t* blk = run + S * kBlockBytes;
    uint32_t qh;
    std::memcpy(&qh, blk + (kQ51 ? 4 : 2), 4);
    const __m256i a = _mm256_cvtepu8_epi16(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + (kQ51 ? 8 : 6))));
    const __m256i bit = _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096,
                                          8192, 16384, static_cast<int16_t>(-32768));
    const __m256i five = _mm256_set1_epi16(16);
    auto fifth = [&](uint32_t half) {
      const __m256i m = _mm256_and_si256(_mm256_set1_epi16(static_cast<int16_t>(half)), bit);
      return _mm256_and_si256(_mm256_cmpeq_epi16(m, bit), five);
    };
    *lo = _mm256_or_si256(_mm256_and_si256(a, _mm256_set1_epi16(0x0f)), fifth(qh & 0xffffu));
    *hi = _mm256_or_si256(_mm256_srli_epi16(a, 4), fifth(qh >> 16));
  }
};
template <>
struct KTraits<GgmlType::kQ5_0> : Q5Traits<false> {};
template <>
struct KTraits<GgmlType::kQ5_1> : Q5Traits<true> {};

// Calls f(integral_constant<S>) for S = 0 .. cnt - 1 (cnt <= 8), unrolled.
template <int S = 0, class F>
inline void ForBlocks(int cnt, F&& f) {
  if constexpr (S < kIlRun) {
    if (S >= cnt) return;
    f(std::integral_constant<int, S>{});
    ForBlocks<S + 1>(cnt, f);
  }
}

// The lines of a run at p, the run kPrefetchBytes (or another distance) ahead in a row's stream
// (K-quant runs span 3-4 lines).
template <int kRunBytes>
inline void PrefetchRun(const uint8_t* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(p + 64), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(p + 128), _MM_HINT_T0);
  if constexpr (kRunBytes > 192) _mm_prefetch(reinterpret_cast<const char*>(p + 192), _MM_HINT_T0);
}

// R weight rows (row0, rows rs bytes apart) against x rows i0 .. i0 + MG - 1.
template <class Isa, GgmlType T, int R, int MG>
inline void GroupK16(const uint8_t* row0, int64_t rs, const Int16Act& xa, int i0, float* y,
                     int64_t ldy) {
  using K = KTraits<T>;
  const int64_t nb = xa.nb;
  __m256 acc[R][MG];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int i = 0; i < MG; ++i) acc[r][i] = _mm256_setzero_ps();
  alignas(32) float sc[R][MG][kIlRun];
  const int16_t* xq = xa.q + i0 * xa.k;
  const float* xs = xa.scale + i0 * nb;
  const float* bsum = K::kMin ? xa.bsum + i0 * nb : nullptr;
  for (int64_t b0 = 0; b0 < nb; b0 += kIlRun) {
    const int nc = static_cast<int>(std::min<int64_t>(kIlRun, nb - b0));
    const uint8_t* run0 = K::Run(row0, b0);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const uint8_t* run = run0 + r * rs;
      PrefetchRun<K::kBlockBytes>(run + kPrefetchBytes);
      __m256 d, mn;
      K::Scales(run, nc, &d, &mn);
#pragma GCC unroll 4
      for (int i = 0; i < MG; ++i) {
        const int64_t o = i * nb + b0;
        _mm256_store_ps(sc[r][i], _mm256_mul_ps(d, LoadUpTo8(xs + o, nc)));
        if constexpr (K::kMin) acc[r][i] = _mm256_fmadd_ps(mn, LoadUpTo8(bsum + o, nc), acc[r][i]);
      }
    }
    ForBlocks(nc, [&](auto s) {
      constexpr int S = decltype(s)::value;
      __m256i xl[MG], xh[MG];
#pragma GCC unroll 4
      for (int i = 0; i < MG; ++i) {
        const int16_t* xb = xq + i * xa.k + (b0 + S) * 32;
        xl[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb));
        xh[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + 16));
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        __m256i lo, hi;
        K::template Weights<S>(run0 + r * rs, &lo, &hi);
#pragma GCC unroll 4
        for (int i = 0; i < MG; ++i) {
          const __m256i dot = Isa::DotS16x2(lo, xl[i], hi, xh[i]);
          acc[r][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_broadcast_ss(&sc[r][i][S]),
                                      acc[r][i]);
        }
      }
    });
  }
  StoreSums<R, MG>(acc, y, ldy);
}

// Rows R per group at MG x rows: 4 at 1-2 x rows, 2 at 3-4 (the accumulators, x and weight
// vectors then fit 16 registers).
template <class Isa, GgmlType T, int RN>
inline void OuterStepK16(const uint8_t* row0, int64_t rs, const Int16Act& xa, float* y,
                         int64_t ldy) {
  constexpr int R12 = std::min(RN, 4), R34 = std::min(RN, 2);
  int i = 0;
  for (; i + 4 <= xa.m; i += 4) {
    for (int r = 0; r < RN; r += R34) {
      GroupK16<Isa, T, R34, 4>(row0 + r * rs, rs, xa, i, y + i * ldy + r, ldy);
    }
  }
  switch (xa.m - i) {
    case 3:
      for (int r = 0; r < RN; r += R34) {
        GroupK16<Isa, T, R34, 3>(row0 + r * rs, rs, xa, i, y + i * ldy + r, ldy);
      }
      break;
    case 2:
      for (int r = 0; r < RN; r += R12) {
        GroupK16<Isa, T, R12, 2>(row0 + r * rs, rs, xa, i, y + i * ldy + r, ldy);
      }
      break;
    case 1:
      for (int r = 0; r < RN; r += R12) {
        GroupK16<Isa, T, R12, 1>(row0 + r * rs, rs, xa, i, y + i * ldy + r, ldy);
      }
      break;
    default:
      break;
  }
}

template <class Isa, GgmlType T>
void RowsK16T(const QuantMatrix& w, const Int16Act& xa, float* y, int64_t ldy, int64_t j0,
              int64_t j1) {
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  const int64_t rb = w.row_bytes;
  int64_t j = j0;
  for (; j + 4 <= j1; j += 4) OuterStepK16<Isa, T, 4>(base + j * rb, rb, xa, y + j, ldy);
  for (; j < j1; ++j) OuterStepK16<Isa, T, 1>(base + j * rb, rb, xa, y + j, ldy);
}

// f(integral_constant<GgmlType, T>) for the types these kernels take; false for the others.
template <class F>
inline bool ForKType(GgmlType t, F&& f) {
  switch (t) {
    case GgmlType::kQ4_K:
      f(std::integral_constant<GgmlType, GgmlType::kQ4_K>{});
      return true;
    case GgmlType::kQ5_K:
      f(std::integral_constant<GgmlType, GgmlType::kQ5_K>{});
      return true;
    case GgmlType::kQ6_K:
      f(std::integral_constant<GgmlType, GgmlType::kQ6_K>{});
      return true;
    case GgmlType::kQ5_0:
      f(std::integral_constant<GgmlType, GgmlType::kQ5_0>{});
      return true;
    case GgmlType::kQ5_1:
      f(std::integral_constant<GgmlType, GgmlType::kQ5_1>{});
      return true;
    default:
      return false;
  }
}

// The int16 entry point for these types (GGUF layout only); false for the others.
template <class Isa>
bool RowsInt16KImpl(const QuantMatrix& w, const Int16Act& xa, float* y, int64_t ldy, int64_t j0,
                    int64_t j1) {
  if (w.interleave != 1) return false;
  return ForKType(w.type,
                  [&](auto t) { RowsK16T<Isa, decltype(t)::value>(w, xa, y, ldy, j0, j1); });
}

// Row j of w as fp32 values d * w + mn (the prefill GEMM's tiles): the K-quants, Q5_0 and Q5_1
// (GGUF layout) and Q4_0, Q4_1 and Q8_0 (either layout); false for the other types.
// A run's nc x blocks (from block b0 of the row) as fp32 values d * w + mn into out[0, 32 nc).
template <GgmlType T>
inline void DequantRunK(const uint8_t* row, int64_t b0, int nc, float* out) {
  using K = KTraits<T>;
  const uint8_t* run = K::Run(row, b0);
  __m256 d, mn;
  K::Scales(run, nc, &d, &mn);
  alignas(32) float ds[kIlRun], ms[kIlRun];
  _mm256_store_ps(ds, d);
  _mm256_store_ps(ms, mn);
  ForBlocks(nc, [&](auto s) {
    constexpr int S = decltype(s)::value;
    __m256i w[2];
    K::template Weights<S>(run, &w[0], &w[1]);
    const __m256 dv = _mm256_broadcast_ss(&ds[S]), mv = _mm256_broadcast_ss(&ms[S]);
    float* o = out + S * 32;
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m256 a = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(w[h])));
      const __m256 b = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(w[h], 1)));
      // Product, then sum (no FMA): the reference dequantiser's two roundings.
      _mm256_storeu_ps(o + 16 * h, _mm256_add_ps(_mm256_mul_ps(a, dv), mv));
      _mm256_storeu_ps(o + 16 * h + 8, _mm256_add_ps(_mm256_mul_ps(b, dv), mv));
    }
  });
}

template <GgmlType T>
inline void DequantRowKT(const uint8_t* row, int64_t nb, float* out) {
  for (int64_t b0 = 0; b0 < nb; b0 += kIlRun) {
    DequantRunK<T>(row, b0, static_cast<int>(std::min<int64_t>(kIlRun, nb - b0)), out + b0 * 32);
  }
}

template <GgmlType T>
inline void DequantRowBlockT(const QuantMatrix& w, int64_t j, float* out) {
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  const int64_t nb = w.k / 32;
  const bool il = j < InterleavedRows(w);
  for (int64_t b0 = 0; b0 < nb; b0 += kIlRun) {
    const int cnt = static_cast<int>(std::min<int64_t>(kIlRun, nb - b0));
    if (il) {
      const int r0 = static_cast<int>(j % kInterleaveRows);
      DequantRun<T, kInterleaveRows>(base + (j - r0) * w.row_bytes, w.row_bytes, r0, nb, b0, cnt,
                                     out + b0 * 32);
    } else {
      DequantRun<T, 1>(base + j * w.row_bytes, w.row_bytes, 0, nb, b0, cnt, out + b0 * 32);
    }
  }
}

inline bool DequantRowImpl(const QuantMatrix& w, int64_t j, float* out) {
  const uint8_t* row = static_cast<const uint8_t*>(w.data) + j * w.row_bytes;
  const int64_t nb = w.k / 32;
  if (IsIntBlockType(w.type)) {
    return w.interleave == 1 &&
           ForKType(w.type, [&](auto t) { DequantRowKT<decltype(t)::value>(row, nb, out); });
  }
  switch (w.type) {
    case GgmlType::kQ4_0:
      DequantRowBlockT<GgmlType::kQ4_0>(w, j, out);
      return true;
    case GgmlType::kQ4_1:
      DequantRowBlockT<GgmlType::kQ4_1>(w, j, out);
      return true;
    case GgmlType::kQ8_0:
      DequantRowBlockT<GgmlType::kQ8_0>(w, j, out);
      return true;
    default:
      return false;
  }
}

// fp32 mode for the types DequantRowImpl takes in GGUF layout (the K-quants, Q5_0, Q5_1): each
// weight row dequantised once into an L1 buffer, then the float-row dot against every x row (fp32
// products and sums, as the other fp32 kernels).
inline bool RowsF32KImpl(const QuantMatrix& w, const F32Act& xa, float* y, int64_t ldy, int64_t j0,
                         int64_t j1) {
  if (!IsIntBlockType(w.type) || w.interleave != 1) return false;
  thread_local std::vector<float> buf;
  buf.resize(w.k);
  const auto* row = reinterpret_cast<const uint8_t*>(buf.data());
  for (int64_t j = j0; j < j1; ++j) {
    DequantRowImpl(w, j, buf.data());
    int i = 0;
    for (; i + 4 <= xa.m; i += 4) {
      FloatRowDot<GgmlType::kF32, 4>(row, xa.x + i * xa.ldx, xa.ldx, w.k, y + i * ldy + j, ldy);
    }
    switch (xa.m - i) {
      case 3:
        FloatRowDot<GgmlType::kF32, 3>(row, xa.x + i * xa.ldx, xa.ldx, w.k, y + i * ldy + j, ldy);
        break;
      case 2:
        FloatRowDot<GgmlType::kF32, 2>(row, xa.x + i * xa.ldx, xa.ldx, w.k, y + i * ldy + j, ldy);
        break;
      case 1:
        FloatRowDot<GgmlType::kF32, 1>(row, xa.x + i * xa.ldx, xa.ldx, w.k, y + i * ldy + j, ldy);
        break;
      default:
        break;
    }
  }
  return true;
}

// The fp32 tile path (kF32Tile, AVX2 CPUs' batched decode) for these types: the tile kernel of
// quant_gemv_kernels.h over runs dequantised by DequantRunK (a K-quant run is one super-block).
inline bool RowsF32TileKImpl(const QuantMatrix& w, const F32TileAct& xa, float* y, int64_t ldy,
                             int64_t j0, int64_t j1) {
  if (!IsIntBlockType(w.type) || w.interleave != 1) return false;
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  return ForKType(w.type, [&](auto t) {
    constexpr GgmlType T = decltype(t)::value;
    TileRowsWith(w, xa, y, ldy, j0, j1, [&](int64_t row, int64_t b0, int cnt, float* out) {
      DequantRunK<T>(base + row * w.row_bytes, b0, cnt, out);
    });
  });
}

}  // namespace
}  // namespace tripod::qgemv
