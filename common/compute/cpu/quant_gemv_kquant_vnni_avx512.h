// Decode GEMV kernels for the K-quants, Q5_0 and Q5_1 on AVX-512 VNNI (GGUF layout, read in
// place), included only by quant_gemv_avx512.cc after quant_gemv_kquant_kernels.h and
// quant_gemv_kquant_avx512.h, whose per-type runs, scales and row loops they use.
//
// Two x blocks (64 elements) at a time: their 64 integer weights are unpacked as unsigned bytes
// into one zmm (nibbles, plus the fifth and sixth bits by byte masks and vpternlog), then dotted
// exactly with x:
//  - int8 x: one vpdpbusd, 16 int32 sums of 4 products;
//  - int16 x: the bytes widened in-lane (vpunpcklbw / vpunpckhbw with zero, no cross-lane
//    shuffle) and two vpdpwssd against x stored in the order those unpacks leave the elements
//    (Int16Act::qp, see PairOrderInt16), 16 int32 sums of 4 products.
// Either way lanes 0-7 hold the first block and 8-15 the second (Q6_K: lanes 4c .. 4c + 3 hold
// 16-element group c), so the sums are converted once and multiplied by the run's scale table
// d_s * dx_s permuted to the lanes (Q6_K: d * sc_g * dx). The 256-bit int16 kernel widens with
// cross-lane vpmovzxbw, and does a conversion and an FMA for every 32 weights (Q6_K twice the
// unpacking); here they serve 64, which lets one core keep up with DRAM on Q6_K as well.
//
// Minimum terms: mn_s times x's block sums (int8: dx_s * sum(q_x), Int8Act::sum; int16: the exact
// fp32 sums, Int16Act::bsum); Q6_K's offset, -32 * sum_g d * sc_g * dx * sum(q_x over g), from
// the plain sums of x's integers over each 16 elements (sum16). Every product is exact: |w| <= 63
// against |q_x| <= 32767.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "common/compute/cpu/quant_gemv_internal.h"
#include "common/compute/cpu/quant_gemv_kquant_avx512.h"
#include "common/compute/cpu/quant_gemv_kquant_kernels.h"

namespace tripod::qgemv {
namespace {

// Software prefetch distance of these kernels' row streams (docs/cpu-kernels.md, "Figures behind
// the code's constants").
constexpr int kPrefetchBytesV = 8192;

// vpternlog(a, b, c) as the bit select "c ? b : a".
constexpr int kSelect = 0xD8;

// The weights of x blocks 2P and 2P + 1 of a run as 64 unsigned bytes (Q4_K, Q5_K, Q5_0, Q5_1;
// kHalf: block 2P alone, the upper 32 bytes zero).
template <GgmlType T, int P, bool kHalf = false>
inline __m512i PairBytes(const uint8_t* run) {
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  if constexpr (T == GgmlType::kQ4_K || T == GgmlType::kQ5_K) {
    constexpr bool kFive = T == GgmlType::kQ5_K;
    const __m256i q = Load256(run + (kFive ? 48 : 16) + 32 * P);
    __m512i z = _mm512_and_si512(
        _mm512_inserti64x4(_mm512_castsi256_si512(q), _mm256_srli_epi16(q, 4), 1), low4);
    if constexpr (kFive) {
      // Block s's fifth bits are bit s of the 32 qh bytes.
      const __m512i qh = _mm512_broadcast_i64x4(Load256(run + 16));
      const __m512i bit = _mm512_inserti64x4(_mm512_set1_epi8(static_cast<char>(1 << (2 * P))),
                                             _mm256_set1_epi8(static_cast<char>(2 << (2 * P))), 1);
      z = _mm512_mask_add_epi8(z, _mm512_test_epi8_mask(qh, bit), z, _mm512_set1_epi8(16));
    }
    return z;
  } else {  // Q5_0, Q5_1: per block 16 bytes of nibbles (elements 0-15 low, 16-31 high), 32 qh bits
    constexpr bool kQ51 = T == GgmlType::kQ5_1;
    constexpr int kBytes = kQ51 ? 24 : 22, kQs = kQ51 ? 8 : 6, kQh = kQ51 ? 4 : 2;
    const uint8_t* b0 = run + 2 * P * kBytes;
    uint32_t h0, h1 = 0;
    std::memcpy(&h0, b0 + kQh, 4);
    __m256i y;
    if constexpr (kHalf) {
      y = _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + kQs)));
    } else {
      std::memcpy(&h1, b0 + kBytes + kQh, 4);
      y = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(b0 + kBytes + kQs),
                              reinterpret_cast<const __m128i*>(b0 + kQs));
    }
    // [qs0, qs0, qs1, qs1], the second copy of each shifted down a nibble.
    const __m512i yz = _mm512_castsi256_si512(y);
    const __m512i shift = _mm512_setr_epi64(0, 0, 0x0004000400040004, 0x0004000400040004, 0, 0,
                                            0x0004000400040004, 0x0004000400040004);
    __m512i z = _mm512_and_si512(
        _mm512_srlv_epi16(_mm512_shuffle_i64x2(yz, yz, _MM_SHUFFLE(1, 1, 0, 0)), shift), low4);
    const __mmask64 fifth = static_cast<uint64_t>(h0) | (static_cast<uint64_t>(h1) << 32);
    z = _mm512_mask_add_epi8(z, fifth, z, _mm512_set1_epi8(16));
    if constexpr (kHalf) z = _mm512_maskz_mov_epi8(0xffffffffull, z);
    return z;
  }
}

// Q6_K's half N (128 elements, x blocks 4N .. 4N + 3) as two zmm of 6-bit values: blocks 4N, 4N+1
// and blocks 4N+2, 4N+3. The 64 ql bytes hold the four blocks' low nibbles (blocks 4N+2, 4N+3 in
// the high nibbles), the 32 qh bytes their high bit pairs (block 4N + t at bits 2t, 2t + 1).
template <int N>
inline void Q6Halves(const uint8_t* run, __m512i* q01, __m512i* q23) {
  const __m512i l = _mm512_loadu_si512(run + 64 * N);
  const __m512i h = _mm512_broadcast_i64x4(Load256(run + 128 + 32 * N));
  // Upper 32 bytes shifted down 2 bits: bits 0-1 then hold blocks 4N / 4N+1, bits 4-5 4N+2 / 4N+3.
  const __m512i shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
  const __m512i hs = _mm512_and_si512(_mm512_srlv_epi16(h, shift), _mm512_set1_epi8(0x33));
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  *q01 = _mm512_ternarylogic_epi32(_mm512_slli_epi16(hs, 4), l, low4, kSelect);
  *q23 = _mm512_ternarylogic_epi32(hs, _mm512_srli_epi16(l, 4), low4, kSelect);
}

// Lane l of the pair / group scale vectors: permutation indices into the run's table.
inline __m512i PairIndex(int p) {  // lanes 0-7: block 2p, 8-15: block 2p + 1
  return _mm512_inserti64x4(_mm512_set1_epi32(2 * p), _mm256_set1_epi32(2 * p + 1), 1);
}
inline __m512i GroupIndex(int z) {  // lanes 4c .. 4c + 3: group 4z + c
  return _mm512_add_epi32(_mm512_set1_epi32(4 * z),
                          _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3));
}

// The integer side of each kernel: x's values for a pair of blocks and their dot with the pair's
// weight bytes, and the x block sums the minima multiply.
struct Int8Side {
  using Act = Int8Act;
  struct X {
    __m512i v;
  };
  static const float* Sums(const Act& xa) { return xa.sum; }
  // Row i's x pair starting at element e (kHalf: the first block only, the rest zero).
  template <bool kHalf>
  static X Load(const Act& xa, int i, int64_t e) {
    const int8_t* p = xa.q + i * xa.k + e;
    return {kHalf ? _mm512_maskz_loadu_epi8(0xffffffffull, p) : _mm512_loadu_si512(p)};
  }
  struct W {
    __m512i b;
  };
  static W Prepare(__m512i bytes) { return {bytes}; }
  static __m512i Dot(const W& w, const X& x) {
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), w.b, x.v);
  }
};

struct Int16Side {
  using Act = Int16Act;
  struct X {
    __m512i lo, hi;
  };
  static const float* Sums(const Act& xa) { return xa.bsum; }
  // qp rows are padded to an even block count with zeros: no partial load.
  template <bool kHalf>
  static X Load(const Act& xa, int i, int64_t e) {
    const int16_t* p = xa.qp + i * xa.kp + e;
    return {_mm512_loadu_si512(p), _mm512_loadu_si512(p + 32)};
  }
  struct W {
    __m512i lo, hi;
  };
  static W Prepare(__m512i bytes) {
    const __m512i z = _mm512_setzero_si512();
    return {_mm512_unpacklo_epi8(bytes, z), _mm512_unpackhi_epi8(bytes, z)};
  }
  static __m512i Dot(const W& w, const X& x) {
    return _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(_mm512_setzero_si512(), w.lo, x.lo), w.hi, x.hi);
  }
};

// R weight rows (row0, rows rs bytes apart) against x rows i0 .. i0 + MG - 1.
template <GgmlType T, int R, int MG, class Side>
inline void GroupKV512(const uint8_t* row0, int64_t rs, const typename Side::Act& xa, int i0,
                       float* y, int64_t ldy) {
  using K = KTraits<T>;
  constexpr bool kQ6 = T == GgmlType::kQ6_K;
  const int64_t nb = xa.nb;
  __m512 acc[R][MG], off[R][MG];
  // Per run and (row, x row): the 8 block scales d_s * dx_s (Q6_K: the 16 group scales).
  __m512 tab[R][MG];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int i = 0; i < MG; ++i) acc[r][i] = off[r][i] = _mm512_setzero_ps();
  const float* xs = xa.scale + i0 * nb;
  const float* xsum = kQ6 ? nullptr : Side::Sums(xa) + i0 * nb;
  const float* xsum16 = kQ6 ? xa.sum16 + 2 * i0 * nb : nullptr;
  // dx of each 16-element group: block s's scale twice.
  const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  for (int64_t b0 = 0; b0 < nb; b0 += kIlRun) {
    const int nc = static_cast<int>(std::min<int64_t>(kIlRun, nb - b0));
    const uint8_t* run0 = K::Run(row0, b0);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const uint8_t* run = run0 + r * rs;
      PrefetchRun<K::kBlockBytes>(run + kPrefetchBytesV);
      if constexpr (kQ6) {
        const __m512 sc = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                                            reinterpret_cast<const __m128i*>(run + 192)))),
                                        _mm512_set1_ps(HalfToFloat(run + 208)));
#pragma GCC unroll 4
        for (int i = 0; i < MG; ++i) {
          const int64_t o = i * nb + b0;
          const __m512 dx =
              _mm512_permutexvar_ps(dup, _mm512_zextps256_ps512(_mm256_loadu_ps(xs + o)));
          tab[r][i] = _mm512_mul_ps(sc, dx);
          off[r][i] = _mm512_fmadd_ps(tab[r][i], _mm512_loadu_ps(xsum16 + 2 * o), off[r][i]);
        }
      } else {
        __m256 d, mn;
        K::Scales(run, nc, &d, &mn);
#pragma GCC unroll 4
        for (int i = 0; i < MG; ++i) {
          const int64_t o = i * nb + b0;
          tab[r][i] = _mm512_zextps256_ps512(_mm256_mul_ps(d, LoadUpTo8(xs + o, nc)));
          off[r][i] = _mm512_add_ps(
              off[r][i], _mm512_zextps256_ps512(_mm256_mul_ps(mn, LoadUpTo8(xsum + o, nc))));
        }
      }
    }
    // The pair of blocks at element e of the rows against each x row, scaled by idx's lanes.
    auto dot_pair = [&](const typename Side::X(&xv)[MG], const typename Side::W& w, int r,
                        __m512i idx) {
#pragma GCC unroll 4
      for (int i = 0; i < MG; ++i) {
        const __m512i dot = Side::Dot(w, xv[i]);
        acc[r][i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_permutexvar_ps(idx, tab[r][i]),
                                    acc[r][i]);
      }
    };
    if constexpr (kQ6) {
      auto half = [&](auto nn) {
        constexpr int N = decltype(nn)::value;
        typename Side::X x01[MG], x23[MG];
#pragma GCC unroll 4
        for (int i = 0; i < MG; ++i) {
          x01[i] = Side::template Load<false>(xa, i0 + i, b0 * 32 + 128 * N);
          x23[i] = Side::template Load<false>(xa, i0 + i, b0 * 32 + 128 * N + 64);
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          __m512i q01, q23;
          Q6Halves<N>(run0 + r * rs, &q01, &q23);
          dot_pair(x01, Side::Prepare(q01), r, GroupIndex(2 * N));
          dot_pair(x23, Side::Prepare(q23), r, GroupIndex(2 * N + 1));
        }
      };
      half(std::integral_constant<int, 0>{});
      half(std::integral_constant<int, 1>{});
    } else {
      auto pair = [&](auto pp, auto half_only) {
        constexpr int P = decltype(pp)::value;
        constexpr bool kHalf = decltype(half_only)::value;
        typename Side::X xv[MG];
#pragma GCC unroll 4
        for (int i = 0; i < MG; ++i) {
          xv[i] = Side::template Load<kHalf>(xa, i0 + i, (b0 + 2 * P) * 32);
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          dot_pair(xv, Side::Prepare(PairBytes<T, P, kHalf>(run0 + r * rs)), r, PairIndex(P));
        }
      };
      using Full = std::false_type;
      if (nc == kIlRun) {
        pair(std::integral_constant<int, 0>{}, Full{});
        pair(std::integral_constant<int, 1>{}, Full{});
        pair(std::integral_constant<int, 2>{}, Full{});
        pair(std::integral_constant<int, 3>{}, Full{});
      } else {
        // A row's last, partial run (Q5_0 / Q5_1 rows whose block count is not a multiple of 8).
        ForBlocks(nc / 2, [&](auto pp) { pair(pp, Full{}); });
        if (nc & 1) {
          ForBlocks(kIlRun / 2, [&](auto pp) {
            if (decltype(pp)::value == nc / 2) pair(pp, std::true_type{});
          });
        }
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int i = 0; i < MG; ++i) {
      // Q6_K's off holds the offset's group sums (times -32); the others' their minimum terms.
      const __m512 o = kQ6 ? _mm512_mul_ps(off[r][i], _mm512_set1_ps(-32.0f)) : off[r][i];
      y[i * ldy + r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][i], o));
    }
}

// Rows of one step (RN = 4 or 1) against every x row, in groups of up to 4 x rows: 2 weight rows
// at a time for a group of 4, one at a time for the last 1-3 x rows. Why one: at 1-3 x rows the
// pass streams the weights from DRAM, and a thread reading one row after another (one sequential
// stream) ran the 1.5B's decode pass 1.3x faster on Zen 5 than 4 rows taken together (4
// interleaved streams, which the hardware prefetchers follow worse), though the 4-row group is
// 1.25x faster with the rows in L2 (x's loads shared); docs/cpu-kernels.md, "One weight row at a
// time at 1-3 rows". Each row's sums are the same either way.
template <GgmlType T, int RN, class Side>
inline void StepKV512(const uint8_t* row0, int64_t rs, const typename Side::Act& xa, float* y,
                      int64_t ldy) {
  constexpr int R4 = std::min(RN, 2);
  int i = 0;
  for (; i + 4 <= xa.m; i += 4) {
    for (int r = 0; r < RN; r += R4) {
      GroupKV512<T, R4, 4, Side>(row0 + r * rs, rs, xa, i, y + i * ldy + r, ldy);
    }
  }
  auto tail = [&](auto mg) {
    constexpr int MG = decltype(mg)::value;
    for (int r = 0; r < RN; ++r) {
      GroupKV512<T, 1, MG, Side>(row0 + r * rs, rs, xa, i, y + i * ldy + r, ldy);
    }
  };
  switch (xa.m - i) {
    case 3:
      tail(std::integral_constant<int, 3>{});
      break;
    case 2:
      tail(std::integral_constant<int, 2>{});
      break;
    case 1:
      tail(std::integral_constant<int, 1>{});
      break;
    default:
      break;
  }
}

template <class Side>
inline bool RowsKV512(const QuantMatrix& w, const typename Side::Act& xa, float* y, int64_t ldy,
                      int64_t j0, int64_t j1) {
  if (w.interleave != 1) return false;
  return ForKType(w.type, [&](auto t) {
    constexpr GgmlType T = decltype(t)::value;
    RowsK512T<T>(w, xa, y, ldy, j0, j1, StepKV512<T, 4, Side>, StepKV512<T, 1, Side>);
  });
}

// x's int16 values of each pair of blocks (64 elements, rows padded to an even block count with
// zeros) in the order the kernel's in-lane unpacks leave the weights: per 128-bit lane c (16 bytes
// of weights), vpunpcklbw takes bytes 16c .. 16c + 7 and vpunpckhbw 16c + 8 .. 16c + 15, so the
// first 32 values are elements 0-7, 16-23, 32-39, 48-55 and the next 32 elements 8-15, 24-31,
// 40-47, 56-63.
inline void PairOrderInt16(const int16_t* q, int m, int64_t k, int16_t* qp, int64_t kp) {
  alignas(64) static constexpr int16_t kLo[32] = {0,  1,  2,  3,  4,  5,  6,  7,  16, 17, 18,
                                                  19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37,
                                                  38, 39, 48, 49, 50, 51, 52, 53, 54, 55};
  const __m512i lo_idx = _mm512_load_si512(kLo);
  const __m512i hi_idx = _mm512_add_epi16(lo_idx, _mm512_set1_epi16(8));
  for (int i = 0; i < m; ++i) {
    const int16_t* src = q + i * k;
    int16_t* dst = qp + i * kp;
    for (int64_t e = 0; e < kp; e += 64) {
      const int64_t left = k - e;
      const __mmask32 m0 = left >= 32 ? ~0u : left > 0 ? (1u << left) - 1 : 0u;
      const __mmask32 m1 = left >= 64 ? ~0u : left > 32 ? (1u << (left - 32)) - 1 : 0u;
      const __m512i a = _mm512_maskz_loadu_epi16(m0, src + e);
      const __m512i b = _mm512_maskz_loadu_epi16(m1, src + e + 32);
      _mm512_storeu_si512(dst + e, _mm512_permutex2var_epi16(a, lo_idx, b));
      _mm512_storeu_si512(dst + e + 32, _mm512_permutex2var_epi16(a, hi_idx, b));
    }
  }
}

}  // namespace
}  // namespace tripod::qgemv
