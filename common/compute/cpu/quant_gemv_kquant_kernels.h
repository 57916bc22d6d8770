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

// 32 bytes as int16 in lane order, each 128-bit lane widened in place: lo holds bytes 0-7 and
// 16-23, hi bytes 8-15 and 24-31 (two in-lane unpacks instead of an extract and two cross-lane
// widenings; the decode kernel reads x in the same order, Int16Act::qp, see LaneOrderInt16).
inline void WidenLane(__m256i v, __m256i* lo, __m256i* hi) {
  *lo = _mm256_unpacklo_epi8(v, _mm256_setzero_si256());
  *hi = _mm256_unpackhi_epi8(v, _mm256_setzero_si256());
}

template <bool kLane>
inline void WidenAs(__m256i v, __m256i* lo, __m256i* hi) {
  if constexpr (kLane) {
    WidenLane(v, lo, hi);
  } else {
    Widen(v, lo, hi);
  }
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

// Per type: where run c starts, its scales, and the int16 weights of its x block s, in natural
// order (elements 0-15 in lo, 16-31 in hi) or with kLane in WidenLane's order.
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
  template <int S, bool kLane = false>
  static void Weights(const uint8_t* run, __m256i* lo, __m256i* hi) {
    const __m256i q = Load256(run + 16 + 32 * (S / 2));
    const __m256i v = (S & 1) ? _mm256_srli_epi16(q, 4) : q;
    WidenAs<kLane>(_mm256_and_si256(v, _mm256_set1_epi8(0x0f)), lo, hi);
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
  template <int S, bool kLane = false>
  static void Weights(const uint8_t* run, __m256i* lo, __m256i* hi) {
    const __m256i q = Load256(run + 48 + 32 * (S / 2));
    const __m256i v = (S & 1) ? _mm256_srli_epi16(q, 4) : q;
    const __m256i h = BitTo4<S>(Load256(run + 16));
    WidenAs<kLane>(_mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi8(0x0f)), h), lo, hi);
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
  template <int S, bool kLane = false>
  static void Weights(const uint8_t* run, __m256i* lo, __m256i* hi) {
    constexpr int n = S / 4, t = S % 4;
    const __m256i q = Load256(run + 64 * n + 32 * (t & 1));
    const __m256i v = (t >> 1) ? _mm256_srli_epi16(q, 4) : q;
    const __m256i h = Bits2To45<t>(Load256(run + 128 + 32 * n));
    WidenAs<kLane>(_mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi8(0x0f)), h), lo, hi);
    const __m256i off = _mm256_set1_epi16(32);
    const auto* sc = reinterpret_cast<const int8_t*>(run + 192 + 8 * n + 2 * t);
    if constexpr (kLane) {
      // Lane order: the low 128 bits of lo and hi are elements 0-15 (scale sc[0]), the high 16-31.
      const __m256i s = _mm256_set_m128i(_mm_set1_epi16(sc[1]), _mm_set1_epi16(sc[0]));
      *lo = _mm256_mullo_epi16(_mm256_sub_epi16(*lo, off), s);
      *hi = _mm256_mullo_epi16(_mm256_sub_epi16(*hi, off), s);
    } else {
      *lo = _mm256_mullo_epi16(_mm256_sub_epi16(*lo, off), _mm256_set1_epi16(sc[0]));
      *hi = _mm256_mullo_epi16(_mm256_sub_epi16(*hi, off), _mm256_set1_epi16(sc[1]));
    }
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
  template <int S, bool kLane = false>
  static void Weights(const uint8_t* run, __m256i* lo, __m256i* hi) {
    const uint8_t* blk = run + S * kBlockBytes;
    uint32_t qh;
    std::memcpy(&qh, blk + (kQ51 ? 4 : 2), 4);
    const auto* qs = reinterpret_cast<const __m128i*>(blk + (kQ51 ? 8 : 6));
    if constexpr (kLane) {
      // Byte e of one vector is element e's value: the 16 bytes in both lanes, the high lane's
      // shifted to their upper nibbles (elements 16-31), and qh's bit e put in byte e by a
      // shuffle of its bytes and a per-byte bit test; then WidenLane. 11 ops, where widening
      // first (below) and regrouping the halves took 18.
      const __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128(qs));
      const __m256i nib = _mm256_and_si256(
          _mm256_srlv_epi32(q, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)), _mm256_set1_epi8(0x0f));
      const __m256i spread =
          _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)),
                              _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2,
                                               2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
      const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
      const __m256i fifth = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit),
                                             _mm256_set1_epi8(0x10));
      WidenLane(_mm256_or_si256(nib, fifth), lo, hi);
    } else {
      const __m256i a = _mm256_cvtepu8_epi16(_mm_loadu_si128(qs));
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

// One weight row against x rows i0 .. i0 + MG - 1, x in lane order (xa.qp, LaneOrderInt16) to
// match Weights<S, true>. Blocks are scaled in pairs, the pair's sum added to the accumulator
// once: one dependent add per two blocks, where an FMA per block into the accumulator made its
// 4-cycle latency the bound at one weight row.
template <class Isa, GgmlType T, int MG>
inline void RowK16(const uint8_t* row, const Int16Act& xa, int i0, float* y, int64_t ldy) {
  using K = KTraits<T>;
  const int64_t nb = xa.nb;
  __m256 acc[1][MG], pair[MG];
#pragma GCC unroll 4
  for (int i = 0; i < MG; ++i) acc[0][i] = pair[i] = _mm256_setzero_ps();
  alignas(32) float sc[MG][kIlRun];
  const int16_t* xq = xa.qp + i0 * xa.kp;
  const float* xs = xa.scale + i0 * nb;
  const float* bsum = K::kMin ? xa.bsum + i0 * nb : nullptr;
  for (int64_t b0 = 0; b0 < nb; b0 += kIlRun) {
    const int nc = static_cast<int>(std::min<int64_t>(kIlRun, nb - b0));
    const uint8_t* run = K::Run(row, b0);
    PrefetchRun<K::kBlockBytes>(run + kPrefetchBytes);
    __m256 d, mn;
    K::Scales(run, nc, &d, &mn);
#pragma GCC unroll 4
    for (int i = 0; i < MG; ++i) {
      const int64_t o = i * nb + b0;
      _mm256_store_ps(sc[i], _mm256_mul_ps(d, LoadUpTo8(xs + o, nc)));
      if constexpr (K::kMin) acc[0][i] = _mm256_fmadd_ps(mn, LoadUpTo8(bsum + o, nc), acc[0][i]);
    }
    ForBlocks(nc, [&](auto s) {
      constexpr int S = decltype(s)::value;
      __m256i lo, hi;
      K::template Weights<S, true>(run, &lo, &hi);
#pragma GCC unroll 4
      for (int i = 0; i < MG; ++i) {
        const int16_t* xb = xq + i * xa.kp + (b0 + S) * 32;
        const __m256i xl = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb));
        const __m256i xh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + 16));
        const __m256 p = _mm256_cvtepi32_ps(Isa::DotS16x2(lo, xl, hi, xh));
        const __m256 dv = _mm256_broadcast_ss(&sc[i][S]);
        if constexpr (S % 2 == 0) {
          pair[i] = _mm256_mul_ps(p, dv);
          // A run of odd length (Q5_0 / Q5_1 at a row's end) leaves its last block unpaired.
          if (S + 1 == nc) acc[0][i] = _mm256_add_ps(acc[0][i], pair[i]);
        } else {
          acc[0][i] = _mm256_add_ps(acc[0][i], _mm256_fmadd_ps(p, dv, pair[i]));
        }
      }
    });
  }
  StoreSums<1, MG>(acc, y, ldy);
}

// Rows of one step (RN = 4 or 1) against every x row, in groups of up to 4 x rows, one weight
// row at a time. Why one: at 1-3 x rows the pass streams the weights from DRAM, where one row
// after another (one sequential stream per thread) measured as fast as 4 rows together on Zen 3
// and faster on Zen 5; in L2 the paired kernel at one row is faster than at two or four; and at 4
// x rows the pairs' accumulators leave no registers for a second row (docs/cpu-kernels.md, "One
// weight row at a time at 1-3 rows" and "AVX2 decode: in-lane widening, blocks scaled in pairs").
// Each row's sums are the same whatever the group.
template <class Isa, GgmlType T, int RN>
inline void OuterStepK16(const uint8_t* row0, int64_t rs, const Int16Act& xa, float* y,
                         int64_t ldy) {
  auto group = [&](auto mg, int i) {
    constexpr int MG = decltype(mg)::value;
    for (int r = 0; r < RN; ++r) {
      RowK16<Isa, T, MG>(row0 + r * rs, xa, i, y + i * ldy + r, ldy);
    }
  };
  int i = 0;
  for (; i + 4 <= xa.m; i += 4) group(std::integral_constant<int, 4>{}, i);
  switch (xa.m - i) {
    case 3:
      group(std::integral_constant<int, 3>{}, i);
      break;
    case 2:
      group(std::integral_constant<int, 2>{}, i);
      break;
    case 1:
      group(std::integral_constant<int, 1>{}, i);
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
  if (w.interleave != 1 || xa.qp == nullptr) return false;
  return ForKType(w.type,
                  [&](auto t) { RowsK16T<Isa, decltype(t)::value>(w, xa, y, ldy, j0, j1); });
}

// Int16Act::qp for these kernels: each 32-element block of x's m rows (k values, a multiple of 32)
// as elements 0-7, 16-23, 8-15, 24-31, WidenLane's order (two 16-value vectors per block).
inline void LaneOrderInt16Impl(const int16_t* q, int m, int64_t k, int16_t* qp) {
  for (int64_t e = 0; e < m * k; e += 32) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + e));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + e + 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qp + e), _mm256_permute2x128_si256(a, b, 0x20));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qp + e + 16),
                        _mm256_permute2x128_si256(a, b, 0x31));
  }
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
