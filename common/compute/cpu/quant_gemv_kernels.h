// The QuantGemm inner loops on 256-bit vectors, written once and compiled into each ISA file
// (quant_gemv_avx2.cc, quant_gemv_avx512.cc) with that file's flags. Include only from those
// files, after defining `struct Isa` with
//   static __m256i DotU8S8(__m256i u8, __m256i s8): per-32-bit-lane sums of four u8 x s8
//     products;
//   static __m256i DotS16x2(__m256i a0, __m256i b0, __m256i a1, __m256i b1): per-32-bit-lane
//     sums of the two s16 x s16 products of a0 * b0 and of a1 * b1 (exact: no operand is
//     -32768);
//   static constexpr int kRowsOuter: weight rows per outer step (a power of two, <= 8);
//   static constexpr int kAccumulators, kAccumulatorsF32: vector accumulators a row group may
//     hold in the integer (int8, int16) / fp32 kernels.
// Everything here has internal linkage so that no copy compiled for a wider ISA can be picked by
// the linker for another file.
//
// Design (decode: m = 1..4 rows of x against a quantised matrix, bound by reading the weights):
//  - R weight rows x MG x rows per pass over the blocks, so each x load and each loop overhead is
//    shared, and R * MG independent accumulators hide the FMA latency.
//  - The per-block fp16 scales are converted 8 blocks at a time (packed into one vector, one
//    vcvtph2ps) into a small table, already multiplied by x's block scales (int8 mode); the
//    inner loop reads them with broadcast loads, which cost no ALU slot.
//  - Q4_1's minimum and Q4_0's offset never touch the inner loop: they multiply per-block sums
//    of x (int8: d_x * sum(q_x); fp32: sum(x)), 8 blocks per FMA into the same accumulators.
//  - fp32 mode multiplies x by the integer nibble values and applies d once per block:
//    d * sum(q * x) + m * sum(x) is the block's dot product in exact fp32 arithmetic.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "common/compute/cpu/quant_gemv_internal.h"

namespace tripod::qgemv {
namespace {

// Same association as Hsum4, ((v0+v1)+(v2+v3)) + ((v4+v5)+(v6+v7)), so that a row's result does
// not depend on how many rows a kernel group holds (batch invariance).
inline float Hsum(__m256 v) {
  const __m256 h = _mm256_hadd_ps(v, v);
  const __m256 h2 = _mm256_hadd_ps(h, h);
  return _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(h2), _mm256_extractf128_ps(h2, 1)));
}

// Lane r of the result is the horizontal sum of v_r.
inline __m128 Hsum4(__m256 v0, __m256 v1, __m256 v2, __m256 v3) {
  const __m256 a = _mm256_hadd_ps(v0, v1);
  const __m256 b = _mm256_hadd_ps(v2, v3);
  const __m256 c = _mm256_hadd_ps(a, b);
  return _mm_add_ps(_mm256_castps256_ps128(c), _mm256_extractf128_ps(c, 1));
}

inline float HalfToFloat(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

inline uint64_t Load16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Loads 8 floats, or only the first cnt (< 8) with the rest 0: never reads past them.
inline __m256 LoadUpTo8(const float* p, int cnt) {
  if (cnt >= 8) return _mm256_loadu_ps(p);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_maskload_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32(cnt), lane));
}

template <GgmlType T>
constexpr int kBlockBytes = T == GgmlType::kQ4_0   ? 18
                            : T == GgmlType::kQ4_1 ? 20
                                                   : 34;

// 8 fp16 values at p, p + stride, ..., p + 7 * stride (only the first cnt, the rest 0) as
// floats. Packed in two general registers and converted by one vcvtph2ps; this is several times
// cheaper than a gather or a conversion per block.
template <int kStride>
inline __m256 Halves8(const uint8_t* p, int cnt) {
  // Two scalars, not an array: an array would go through the stack, and reloading two 8-byte
  // stores as one 16-byte vector stalls store forwarding.
  uint64_t lo = 0, hi = 0;
  if (cnt >= 8) {
    lo = Load16(p) | (Load16(p + kStride) << 16) | (Load16(p + 2 * kStride) << 32) |
         (Load16(p + 3 * kStride) << 48);
    const uint8_t* q = p + 4 * kStride;
    hi = Load16(q) | (Load16(q + kStride) << 16) | (Load16(q + 2 * kStride) << 32) |
         (Load16(q + 3 * kStride) << 48);
  } else {
    for (int j = 0; j < cnt && j < 4; ++j) lo |= Load16(p + j * kStride) << (16 * j);
    for (int j = 4; j < cnt; ++j) hi |= Load16(p + j * kStride) << (16 * (j - 4));
  }
  return _mm256_cvtph_ps(_mm_set_epi64x(static_cast<int64_t>(hi), static_cast<int64_t>(lo)));
}

// The first 4 bytes of 8 blocks at stride kB as one vector, block j in dword j: eight 32-bit
// loads combined by unpacks (cheaper in context than gathers or per-block inserts).
template <int kB>
inline __m256i Dwords8(const uint8_t* blk) {
  auto ld = [blk](int j) {
    uint32_t v;
    std::memcpy(&v, blk + j * kB, 4);
    return _mm_cvtsi32_si128(static_cast<int>(v));
  };
  const __m128i a =
      _mm_unpacklo_epi64(_mm_unpacklo_epi32(ld(0), ld(1)), _mm_unpacklo_epi32(ld(2), ld(3)));
  const __m128i b =
      _mm_unpacklo_epi64(_mm_unpacklo_epi32(ld(4), ld(5)), _mm_unpacklo_epi32(ld(6), ld(7)));
  return _mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1);
}

// Scales of the cnt (1..8) blocks starting at blk, kB bytes apart, lanes >= cnt zero: d[j] = the
// block's fp16 scale; for Q4_1 mn[j] = its fp16 minimum (else 0).
template <GgmlType T, int kB>
inline void Scales8(const uint8_t* blk, int cnt, __m256* d, __m256* mn) {
  if (cnt >= 8) {
    // Per 128-bit lane the words d0 x0 d1 x1 d2 x2 d3 x3 (x: Q4_1's minimum, else the next
    // bytes) -> d0 d1 d2 d3 x0 x1 x2 x3; then the d quarters of both lanes to the low lane.
    const __m256i pick = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0,
                                          1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
    const __m256i dm = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(Dwords8<kB>(blk), pick),
                                                _MM_SHUFFLE(3, 1, 2, 0));
    *d = _mm256_cvtph_ps(_mm256_castsi256_si128(dm));
    *mn = T == GgmlType::kQ4_1 ? _mm256_cvtph_ps(_mm256_extracti128_si256(dm, 1))
                               : _mm256_setzero_ps();
    return;
  }
  *d = Halves8<kB>(blk, cnt);
  *mn = T == GgmlType::kQ4_1 ? Halves8<kB>(blk + 2, cnt) : _mm256_setzero_ps();
}

// Software prefetch distance in the weight stream. The rows of a range are one contiguous
// stream, but the hardware prefetcher alone left the DRAM-bound decode pass slower; 4 KB measured
// best (docs/cpu-kernels.md, "Figures behind the code's constants").
constexpr int kPrefetchBytes = 4096;

// Prefetches the part of the stream a row group will read kPrefetchBytes later: the group
// reads kStep bytes per block step (R rows' blocks), i.e. up to three cache lines.
template <int kStep>
inline void PrefetchAhead(const uint8_t* row0, int64_t b) {
  const char* p = reinterpret_cast<const char*>(row0 + kPrefetchBytes + b * kStep);
  _mm_prefetch(p, _MM_HINT_T0);
  if constexpr (kStep > 64) _mm_prefetch(p + 64, _MM_HINT_T0);
  if constexpr (kStep > 128) _mm_prefetch(p + 128, _MM_HINT_T0);
}

// Bytes a group of R rows reads per block step: R blocks, or with interleaving the whole
// interleaved group's step (its other rows' blocks share the cache lines).
template <GgmlType T, int R, int IL>
constexpr int kStepBytes = ((IL == 1 ? R : IL) * kBlockBytes<T>);

// A run's kIlRun fp16 values at p, contiguous (only the first cnt, the rest 0), as floats.
inline __m256 HalvesRun(const uint8_t* p, int cnt) {
  if (cnt >= 8) return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return Halves8<2>(p, cnt);
}

// The rows of a kernel group: IL = 1 (GGUF layout), row r at row0 + r * rs (rs: the row bytes);
// IL > 1 (interleaved), rows r0 + r of the interleaved group starting at row0 (see IlRunAt; rs
// unused). Blocks are visited in runs of kIlRun, the interleaved layout's runs.
// Scales d (and Q4_1 minima mn, else 0) of blocks [b0, b0 + cnt) of kernel row r; b0 is a
// multiple of kIlRun and cnt <= kIlRun (the run's size when interleaved).
template <GgmlType T, int IL>
inline void RowScales8(const uint8_t* row0, int64_t rs, int r0, int r, int64_t nb, int64_t b0,
                       int cnt, __m256* d, __m256* mn) {
  static_assert(kIlRun == 8);
  if constexpr (IL == 1) {
    Scales8<T, kBlockBytes<T>>(row0 + r * rs + b0 * kBlockBytes<T>, cnt, d, mn);
  } else {
    const uint8_t* p = IlRunAt<T>(row0, nb, b0 / kIlRun).base + (r0 + r) * cnt * 2;
    *d = HalvesRun(p, cnt);
    *mn = T == GgmlType::kQ4_1 ? HalvesRun(p + IL * cnt * 2, cnt) : _mm256_setzero_ps();
  }
}

// The quants (16 bytes of nibbles, or 32 int8) of a run's blocks: at(r, j) for kernel row r and
// the run's block j.
template <GgmlType T, int IL>
struct RunQuants {
  const uint8_t* q;
  int64_t rs;
  const uint8_t* at(int r, int j) const {
    if constexpr (IL == 1) {
      return q + r * rs + j * kBlockBytes<T>;
    } else {
      return q + (j * IL + r) * kIlQuantBytes<T>;
    }
  }
};

// The run of cnt blocks from block b0 (a multiple of kIlRun).
template <GgmlType T, int IL>
inline RunQuants<T, IL> RunQuantsAt(const uint8_t* row0, int64_t rs, int r0, int64_t nb, int64_t b0,
                                    int cnt) {
  if constexpr (IL == 1) {
    return {row0 + b0 * kBlockBytes<T> + (kBlockBytes<T> - kIlQuantBytes<T>), rs};
  } else {
    const uint8_t* base = IlRunAt<T>(row0, nb, b0 / kIlRun).base;
    return {base + IL * cnt * kIlScaleBytes<T> + r0 * kIlQuantBytes<T>, 0};
  }
}

// How a block kernel multiplies: fp32 x against the weights' integer values, or x quantised to
// int8 / int16 with integer dot products.
enum class Dot { kF32, kInt8, kInt16 };

// Rows per group for MG x rows: as many as the accumulator budget allows, a power of two that
// divides kRowsOuter. At 3-4 x rows the fp32 and int16 kernels keep 8-16 x vectors live, so
// their budget halves there (two rows spill; docs/cpu-kernels.md, "Figures behind the code's
// constants").
template <class Isa, Dot D, int MG>
constexpr int RowsPerGroup() {
  int r = Isa::kRowsOuter;
  const int budget = D == Dot::kInt8 ? Isa::kAccumulators
                     : D == Dot::kInt16
                         ? (MG <= 2 ? Isa::kAccumulators : Isa::kAccumulators / 2)
                         : (MG <= 2 ? Isa::kAccumulatorsF32 : Isa::kAccumulatorsF32 / 2);
  while (r > 1 && r * MG > budget) r /= 2;
  return r;
}

// Writes the R x MG accumulators' sums: y[i * ldy + r] (y at column j of x row i0).
template <int R, int MG>
inline void StoreSums(__m256 (&acc)[R][MG], float* y, int64_t ldy) {
#pragma GCC unroll 4
  for (int i = 0; i < MG; ++i) {
    float* yi = y + i * ldy;
    if constexpr (R >= 4) {
      for (int r = 0; r < R; r += 4) {
        _mm_storeu_ps(yi + r, Hsum4(acc[r][i], acc[r + 1][i], acc[r + 2][i], acc[r + 3][i]));
      }
    } else {
      for (int r = 0; r < R; ++r) yi[r] = Hsum(acc[r][i]);
    }
  }
}

// The kernels walk the blocks run by run (kIlRun blocks, the interleaved layout's runs): first
// the run's scale table (weight scales times x's, and the minimum / offset terms), then its blocks.
// A full run's table is built with kIlRun as a constant, so that its loads need no masks (tables
// built further ahead, and masked loads in full runs, measured slower: docs/cpu-kernels.md,
// "Figures behind the code's constants").
template <class Prep>
inline void PrepRun(int cnt, Prep&& prep) {
  if (cnt == kIlRun) {
    prep(std::integral_constant<int, kIlRun>{});
  } else {
    prep(cnt);
  }
}

// R weight rows (row0, rs, r0, layout IL: see RowScales8) against x rows i0 .. i0 + MG - 1,
// int8 mode.
template <class Isa, GgmlType T, int R, int MG, int IL>
inline void GroupInt8(const uint8_t* row0, int64_t rs, int r0, const Int8Act& xa, int i0, float* y,
                      int64_t ldy) {
  const int64_t nb = xa.nb;
  __m256 acc[R][MG];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int i = 0; i < MG; ++i) acc[r][i] = _mm256_setzero_ps();
  alignas(32) float sc[R][MG][kIlRun];
  const int8_t* xq = xa.q + i0 * xa.k;
  const float* xs = xa.scale + i0 * nb;
  const float* xsum = xa.sum + i0 * nb;
  const __m256i nibble = _mm256_set1_epi8(0x0f);
  const __m256i hi_shift = _mm256_setr_epi64x(0, 0, 4, 4);  // high lane: the high nibbles
  for (int64_t b0 = 0; b0 < nb; b0 += kIlRun) {
    const int nc = static_cast<int>(std::min<int64_t>(kIlRun, nb - b0));
    PrepRun(nc, [&](auto cnt) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        __m256 d, mn;
        RowScales8<T, IL>(row0, rs, r0, r, nb, b0, cnt, &d, &mn);
        if constexpr (T == GgmlType::kQ4_0) mn = _mm256_mul_ps(d, _mm256_set1_ps(-8.0f));
#pragma GCC unroll 4
        for (int i = 0; i < MG; ++i) {
          const int64_t o = i * nb + b0;
          _mm256_store_ps(sc[r][i], _mm256_mul_ps(d, LoadUpTo8(xs + o, cnt)));
          if constexpr (T != GgmlType::kQ8_0) {
            acc[r][i] = _mm256_fmadd_ps(mn, LoadUpTo8(xsum + o, cnt), acc[r][i]);
          }
        }
      }
    });
    const RunQuants<T, IL> rq = RunQuantsAt<T, IL>(row0, rs, r0, nb, b0, nc);
    for (int j = 0; j < nc; ++j) {
      PrefetchAhead<kStepBytes<T, R, IL>>(row0, b0 + j);
      __m256i xv[MG];
#pragma GCC unroll 4
      for (int i = 0; i < MG; ++i) {
        xv[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + i * xa.k + (b0 + j) * 32));
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const uint8_t* qs = rq.at(r, j);
        if constexpr (T == GgmlType::kQ8_0) {
          // u8 x s8 multiplies: |w| against x carrying w's sign.
          const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs));
          const __m256i aw = _mm256_abs_epi8(wv);
#pragma GCC unroll 4
          for (int i = 0; i < MG; ++i) {
            const __m256i dot = Isa::DotU8S8(aw, _mm256_sign_epi8(xv[i], wv));
            acc[r][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_broadcast_ss(&sc[r][i][j]),
                                        acc[r][i]);
          }
        } else {
          // 16 bytes in both lanes; the high lane shifted by 4: low nibbles (elements 0..15)
          // then high nibbles (16..31), x's element order.
          const __m256i q =
              _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
          const __m256i wv = _mm256_and_si256(_mm256_srlv_epi64(q, hi_shift), nibble);
#pragma GCC unroll 4
          for (int i = 0; i < MG; ++i) {
            const __m256i dot = Isa::DotU8S8(wv, xv[i]);
            acc[r][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_broadcast_ss(&sc[r][i][j]),
                                        acc[r][i]);
          }
        }
      }
    }
  }
  StoreSums<R, MG>(acc, y, ldy);
}

// R weight rows (as GroupInt8's) against x rows i0 .. i0 + MG - 1, fp32 mode (Q4_0, Q4_1, Q8_0).
template <GgmlType T, int R, int MG, int IL>
inline void GroupF32(const uint8_t* row0, int64_t rs, int r0, const F32Act& xa, int i0, float* y,
                     int64_t ldy) {
  const int64_t nb = xa.nb;
  __m256 acc[R][MG];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int i = 0; i < MG; ++i) acc[r][i] = _mm256_setzero_ps();
  alignas(32) float sc[R][kIlRun];
  const float* x = xa.x + i0 * xa.ldx;
  const float* bsum = T == GgmlType::kQ8_0 ? nullptr : xa.bsum + i0 * nb;
  const __m256i nibble = _mm256_set1_epi32(0x0f);
  for (int64_t b0 = 0; b0 < nb; b0 += kIlRun) {
    const int nc = static_cast<int>(std::min<int64_t>(kIlRun, nb - b0));
    PrepRun(nc, [&](auto cnt) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        __m256 d, mn;
        RowScales8<T, IL>(row0, rs, r0, r, nb, b0, cnt, &d, &mn);
        _mm256_store_ps(sc[r], d);
        if constexpr (T != GgmlType::kQ8_0) {
          if constexpr (T == GgmlType::kQ4_0) mn = _mm256_mul_ps(d, _mm256_set1_ps(-8.0f));
#pragma GCC unroll 4
          for (int i = 0; i < MG; ++i) {
            acc[r][i] = _mm256_fmadd_ps(mn, LoadUpTo8(bsum + i * nb + b0, cnt), acc[r][i]);
          }
        }
      }
    });
    const RunQuants<T, IL> rq = RunQuantsAt<T, IL>(row0, rs, r0, nb, b0, nc);
    for (int j = 0; j < nc; ++j) {
      PrefetchAhead<kStepBytes<T, R, IL>>(row0, b0 + j);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const uint8_t* qs = rq.at(r, j);
        // The block's integer weights as floats, elements 0-7, 8-15, 16-23, 24-31.
        __m256 w[4];
        if constexpr (T == GgmlType::kQ8_0) {
#pragma GCC unroll 4
          for (int p = 0; p < 4; ++p) {
            w[p] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                _mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + 8 * p))));
          }
        } else {
          const __m256i v0 =
              _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs)));
          const __m256i v1 =
              _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + 8)));
          w[0] = _mm256_cvtepi32_ps(_mm256_and_si256(v0, nibble));
          w[1] = _mm256_cvtepi32_ps(_mm256_and_si256(v1, nibble));
          w[2] = _mm256_cvtepi32_ps(_mm256_srli_epi32(v0, 4));
          w[3] = _mm256_cvtepi32_ps(_mm256_srli_epi32(v1, 4));
        }
        const __m256 d = _mm256_broadcast_ss(&sc[r][j]);
#pragma GCC unroll 4
        for (int i = 0; i < MG; ++i) {
          const float* xb = x + i * xa.ldx + (b0 + j) * 32;
          __m256 t = _mm256_mul_ps(w[0], _mm256_loadu_ps(xb));
          t = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xb + 8), t);
          t = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xb + 16), t);
          t = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xb + 24), t);
          acc[r][i] = _mm256_fmadd_ps(t, d, acc[r][i]);
        }
      }
    }
  }
  StoreSums<R, MG>(acc, y, ldy);
}

// R weight rows (as GroupInt8's) against x rows i0 .. i0 + MG - 1, int16 mode (Q4_0, Q4_1, Q8_0):
// per block, the exact integer dot of the weights' values with x's int16 values (two 16-pair
// steps), converted once and scaled by d_w * d_x; Q4_1's minimum (Q4_0's -8 d) multiplies x's
// fp32 block sums, 8 blocks per FMA as in fp32 mode. Its scale tables are built as GroupInt8's,
// written out again: a shared helper taking the tables and accumulators by reference measured
// slower (docs/cpu-kernels.md, "Figures behind the code's constants").
template <class Isa, GgmlType T, int R, int MG, int IL>
inline void GroupInt16(const uint8_t* row0, int64_t rs, int r0, const Int16Act& xa, int i0,
                       float* y, int64_t ldy) {
  const int64_t nb = xa.nb;
  __m256 acc[R][MG];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int i = 0; i < MG; ++i) acc[r][i] = _mm256_setzero_ps();
  alignas(32) float sc[R][MG][kIlRun];
  const int16_t* xq = xa.q + i0 * xa.k;
  const float* xs = xa.scale + i0 * nb;
  const float* bsum = T == GgmlType::kQ8_0 ? nullptr : xa.bsum + i0 * nb;
  const __m256i nibble = _mm256_set1_epi16(0x0f);
  for (int64_t b0 = 0; b0 < nb; b0 += kIlRun) {
    const int nc = static_cast<int>(std::min<int64_t>(kIlRun, nb - b0));
    PrepRun(nc, [&](auto cnt) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        __m256 d, mn;
        RowScales8<T, IL>(row0, rs, r0, r, nb, b0, cnt, &d, &mn);
        if constexpr (T == GgmlType::kQ4_0) mn = _mm256_mul_ps(d, _mm256_set1_ps(-8.0f));
#pragma GCC unroll 4
        for (int i = 0; i < MG; ++i) {
          const int64_t o = i * nb + b0;
          _mm256_store_ps(sc[r][i], _mm256_mul_ps(d, LoadUpTo8(xs + o, cnt)));
          if constexpr (T != GgmlType::kQ8_0) {
            acc[r][i] = _mm256_fmadd_ps(mn, LoadUpTo8(bsum + o, cnt), acc[r][i]);
          }
        }
      }
    });
    const RunQuants<T, IL> rq = RunQuantsAt<T, IL>(row0, rs, r0, nb, b0, nc);
    for (int j = 0; j < nc; ++j) {
      PrefetchAhead<kStepBytes<T, R, IL>>(row0, b0 + j);
      __m256i xl[MG], xh[MG];  // x's elements 0-15 and 16-31
#pragma GCC unroll 4
      for (int i = 0; i < MG; ++i) {
        const int16_t* xb = xq + i * xa.k + (b0 + j) * 32;
        xl[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb));
        xh[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + 16));
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const uint8_t* qs = rq.at(r, j);
        __m256i lo, hi;  // the block's integer weights, elements 0-15 and 16-31, as int16
        if constexpr (T == GgmlType::kQ8_0) {
          lo = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
          hi = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + 16)));
        } else {
          const __m256i a =
              _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
          lo = _mm256_and_si256(a, nibble);
          hi = _mm256_srli_epi16(a, 4);
        }
#pragma GCC unroll 4
        for (int i = 0; i < MG; ++i) {
          const __m256i dot = Isa::DotS16x2(lo, xl[i], hi, xh[i]);
          acc[r][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_broadcast_ss(&sc[r][i][j]),
                                      acc[r][i]);
        }
      }
    }
  }
  StoreSums<R, MG>(acc, y, ldy);
}

template <class Isa, GgmlType T, Dot D, int R, int MG, int IL, class Act>
inline void Group(const uint8_t* row0, int64_t rs, int r0, const Act& xa, int i0, float* y,
                  int64_t ldy) {
  if constexpr (D == Dot::kInt8) {
    GroupInt8<Isa, T, R, MG, IL>(row0, rs, r0, xa, i0, y, ldy);
  } else if constexpr (D == Dot::kInt16) {
    GroupInt16<Isa, T, R, MG, IL>(row0, rs, r0, xa, i0, y, ldy);
  } else {
    GroupF32<T, R, MG, IL>(row0, rs, r0, xa, i0, y, ldy);
  }
}

// Rows R0 .. R0 + RN - 1 of one outer step against every x row, in x-row groups of up to 4 (the
// weight rows stay in L1 between x-row groups). IL: the rows' layout (see RowScales8). IL = 1:
// row0 is the step's first row; IL > 1: the RN rows (RN == IL or RN == 1) are rows r0 .. of the
// interleaved group at row0.
template <class Isa, GgmlType T, Dot D, int RN, int IL, class Act>
inline void OuterStep(const uint8_t* row0, int64_t rb, int r0, const Act& xa, float* y,
                      int64_t ldy) {
  static_assert(IL == 1 || RN == IL || RN == 1);
  // Where the Group call for rows r .. of the step finds them: GGUF rows at their addresses,
  // interleaved rows by their index in the group.
  auto at = [&](int r) { return IL == 1 ? row0 + r * rb : row0; };
  auto idx = [&](int r) { return IL == 1 ? 0 : r0 + r; };
  constexpr int R4 = std::min(RN, RowsPerGroup<Isa, D, 4>());
  constexpr int R3 = std::min(RN, RowsPerGroup<Isa, D, 3>());
  constexpr int R2 = std::min(RN, RowsPerGroup<Isa, D, 2>());
  // One x row, GGUF layout: Q8_0 (the tied output head, 49152 rows of 612 bytes) in groups of 2
  // rows, not 4. In cache 4 rows share each x load and are faster, but from DRAM 2 interleaved
  // row streams stream better than 4 (docs/cpu-kernels.md, "Figures behind the code's constants").
  // Interleaved rows are one stream whatever the group.
  constexpr int R1 = std::min(
      {RN, RowsPerGroup<Isa, D, 1>(), T == GgmlType::kQ8_0 && IL == 1 ? 2 : Isa::kRowsOuter});
  int i = 0;
  for (; i + 4 <= xa.m; i += 4) {
    for (int r = 0; r < RN; r += R4) {
      Group<Isa, T, D, R4, 4, IL>(at(r), rb, idx(r), xa, i, y + i * ldy + r, ldy);
    }
  }
  switch (xa.m - i) {
    case 3:
      for (int r = 0; r < RN; r += R3) {
        Group<Isa, T, D, R3, 3, IL>(at(r), rb, idx(r), xa, i, y + i * ldy + r, ldy);
      }
      break;
    case 2:
      for (int r = 0; r < RN; r += R2) {
        Group<Isa, T, D, R2, 2, IL>(at(r), rb, idx(r), xa, i, y + i * ldy + r, ldy);
      }
      break;
    case 1:
      for (int r = 0; r < RN; r += R1) {
        Group<Isa, T, D, R1, 1, IL>(at(r), rb, idx(r), xa, i, y + i * ldy + r, ldy);
      }
      break;
    default:
      break;
  }
}

template <class Isa, GgmlType T, Dot D, class Act>
void RowsBlockT(const QuantMatrix& w, const Act& xa, float* y, int64_t ldy, int64_t j0,
                int64_t j1) {
  static_assert(Isa::kRowsOuter >= 1 && Isa::kRowsOuter <= 8 &&
                (Isa::kRowsOuter & (Isa::kRowsOuter - 1)) == 0);
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  const int64_t rb = w.row_bytes;
  int64_t j = j0;
  if (w.interleave == kInterleaveRows) {
    static_assert(Isa::kRowsOuter == kInterleaveRows);
    constexpr int IL = kInterleaveRows;
    const int64_t grouped = std::min(j1, InterleavedRows(w));
    for (; j < grouped;) {
      if (j % IL == 0 && j + IL <= grouped) {
        OuterStep<Isa, T, D, IL, IL>(base + j * rb, rb, 0, xa, y + j, ldy);
        j += IL;
      } else {  // a range that starts or ends inside a group
        OuterStep<Isa, T, D, 1, IL>(base + (j - j % IL) * rb, rb, static_cast<int>(j % IL), xa,
                                    y + j, ldy);
        ++j;
      }
    }
  }
  for (; j + Isa::kRowsOuter <= j1; j += Isa::kRowsOuter) {
    OuterStep<Isa, T, D, Isa::kRowsOuter, 1>(base + j * rb, rb, 0, xa, y + j, ldy);
  }
  for (; j < j1; ++j) OuterStep<Isa, T, D, 1, 1>(base + j * rb, rb, 0, xa, y + j, ldy);
}

// ---- fp32 mode for float weight types (F32, F16, BF16): one row against MG x rows. ----

// Converts 32 consecutive elements (block b of 32) of a float-type row into w[0..3].
template <GgmlType T>
inline void FloatBlock32(const uint8_t* row, int64_t b, __m256* w) {
  if constexpr (T == GgmlType::kF16) {
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
    const uint32_t u = static_cast<uint32_t>(Load16(row + 2 * t)) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  } else {
    float f;
    std::memcpy(&f, row + 4 * t, 4);
    return f;
  }
}

// Enough independent accumulators to hide FMA latency: 4 per x row when there are few rows, 2
// when the MG x rows already give 6-8 chains.
template <GgmlType T, int MG>
inline void FloatRowDot(const uint8_t* row, const float* x, int64_t ldx, int64_t k, float* y,
                        int64_t ldy) {
  constexpr int NA = MG <= 2 ? 4 : 2;
  __m256 acc[MG][NA];
  for (int i = 0; i < MG; ++i)
    for (int a = 0; a < NA; ++a) acc[i][a] = _mm256_setzero_ps();
  const int64_t nb = k / 32;
  for (int64_t b = 0; b < nb; ++b) {
    __m256 w[4];
    FloatBlock32<T>(row, b, w);
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
    for (int64_t t = nb * 32; t < k; ++t) r += FloatElem<T>(row, t) * x[i * ldx + t];
    y[i * ldy] = r;
  }
}

template <GgmlType T>
void FloatRowsT(const QuantMatrix& w, const F32Act& xa, float* y, int64_t ldy, int64_t j0,
                int64_t j1) {
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  const float* x = xa.x;
  const int64_t ldx = xa.ldx;
  for (int64_t j = j0; j < j1; ++j) {
    const uint8_t* row = base + j * w.row_bytes;
    int i = 0;
    for (; i + 4 <= xa.m; i += 4) {
      FloatRowDot<T, 4>(row, x + i * ldx, ldx, w.k, y + i * ldy + j, ldy);
    }
    switch (xa.m - i) {
      case 3:
        FloatRowDot<T, 3>(row, x + i * ldx, ldx, w.k, y + i * ldy + j, ldy);
        break;
      case 2:
        FloatRowDot<T, 2>(row, x + i * ldx, ldx, w.k, y + i * ldy + j, ldy);
        break;
      case 1:
        FloatRowDot<T, 1>(row, x + i * ldx, ldx, w.k, y + i * ldy + j, ldy);
        break;
      default:
        break;
    }
  }
}

// ---- fp32 tile mode (kF32Tile): each weight row dequantised once for all x rows. ----
//
// The block kernels above unpack a weight block once per group of up to 4 x rows; with 16 rows a
// block is unpacked 4 times and every (block, x row) pair pays an int-to-float conversion and a
// scale FMA besides its dot. Here kTileRows weight rows are dequantised to fp32, a run of
// kIlRun blocks at a time, into an L1 buffer; a register tile of kTileRows weight rows x 16 x
// rows (x transposed: 16 rows' values of one column in two vectors) then does one broadcast and
// two FMAs per weight element and row pair, so the FMA units set the pace (the gain over the
// int16 kernel at 16 rows: docs/cpu-kernels.md, "Figures behind the code's constants").
inline constexpr int kTileRows = 6;   // 12 accumulators at 16 x rows, 2 x vectors, 1 broadcast
inline constexpr int kTileCols = 16;  // x rows per group of the transposed activations
inline constexpr int kTileRun = kIlRun * 32;  // weight elements dequantised per step

// One weight row's run of cnt blocks from block b0 as fp32 values d * q + m (Q4_0: d * (q - 8),
// Q8_0: d * q), out[0 .. 32 * cnt) (any alignment). row0, rs, r0: as RowScales8's, for kernel
// row 0.
template <GgmlType T, int IL>
inline void DequantRun(const uint8_t* row0, int64_t rs, int r0, int64_t nb, int64_t b0, int cnt,
                       float* out) {
  __m256 d, mn;
  RowScales8<T, IL>(row0, rs, r0, 0, nb, b0, cnt, &d, &mn);
  if constexpr (T == GgmlType::kQ4_0) mn = _mm256_mul_ps(d, _mm256_set1_ps(-8.0f));
  alignas(32) float ds[kIlRun], ms[kIlRun];
  _mm256_store_ps(ds, d);
  _mm256_store_ps(ms, mn);
  const RunQuants<T, IL> rq = RunQuantsAt<T, IL>(row0, rs, r0, nb, b0, cnt);
  const __m256i nibble = _mm256_set1_epi32(0x0f);
  for (int j = 0; j < cnt; ++j) {
    const uint8_t* qs = rq.at(0, j);
    const __m256 dj = _mm256_broadcast_ss(&ds[j]);
    float* o = out + j * 32;
    if constexpr (T == GgmlType::kQ8_0) {
#pragma GCC unroll 4
      for (int p = 0; p < 4; ++p) {
        const __m256 q = _mm256_cvtepi32_ps(
            _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + 8 * p))));
        _mm256_storeu_ps(o + 8 * p, _mm256_mul_ps(q, dj));
      }
    } else {
      const __m256 mj = _mm256_broadcast_ss(&ms[j]);
      const __m256i v0 =
          _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs)));
      const __m256i v1 =
          _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + 8)));
      const __m256i q[4] = {_mm256_and_si256(v0, nibble), _mm256_and_si256(v1, nibble),
                            _mm256_srli_epi32(v0, 4), _mm256_srli_epi32(v1, 4)};
#pragma GCC unroll 4
      for (int p = 0; p < 4; ++p) {
        _mm256_storeu_ps(o + 8 * p, _mm256_fmadd_ps(_mm256_cvtepi32_ps(q[p]), dj, mj));
      }
    }
  }
}

// The register tile over kc columns: am[r][v] (8 lanes: x rows 8v .. 8v + 7 of the group) +=
// sum_t wt[r][t] * xt[t][8v + lane]. The sums start from zero per run and are then added to
// am, so a row's sum is a short chain per run. Not inlined: inside the caller's loops GCC kept
// the accumulators in memory.
template <int MV>
__attribute__((noinline)) void TileMicro(const float (*wt)[kTileRun], const float* xt, int kc,
                                         float* am) {
  __m256 acc[kTileRows][MV];
#pragma GCC unroll 8
  for (int r = 0; r < kTileRows; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < MV; ++v) acc[r][v] = _mm256_setzero_ps();
#pragma GCC unroll 4
  for (int t = 0; t < kc; ++t) {
    __m256 xv[MV];
#pragma GCC unroll 2
    for (int v = 0; v < MV; ++v) xv[v] = _mm256_loadu_ps(xt + t * kTileCols + 8 * v);
#pragma GCC unroll 8
    for (int r = 0; r < kTileRows; ++r) {
      const __m256 b = _mm256_broadcast_ss(&wt[r][t]);
#pragma GCC unroll 2
      for (int v = 0; v < MV; ++v) acc[r][v] = _mm256_fmadd_ps(b, xv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < kTileRows; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < MV; ++v) {
      float* a = am + (r * 2 + v) * 8;
      _mm256_storeu_ps(a, _mm256_add_ps(_mm256_loadu_ps(a), acc[r][v]));
    }
}

// Output rows [j0, j1) of y = x * W^T from the transposed activations (see F32TileAct). No
// software prefetch: the pass is bound by the FMAs here, and two runs ahead changed nothing
// measurable (docs/cpu-kernels.md, "Figures behind the code's constants").
// deq(row, b0, cnt, out): row `row`'s blocks [b0, b0 + cnt) of 32 as fp32 into out.
template <class Deq>
void TileRowsWith(const QuantMatrix& w, const F32TileAct& xa, float* y, int64_t ldy, int64_t j0,
                  int64_t j1, Deq&& deq) {
  const int64_t nb = xa.nb;
  const int groups = (xa.m + kTileCols - 1) / kTileCols;
  alignas(64) float wt[kTileRows][kTileRun];
  // Per x-row group: kTileRows x 2 vectors of sums.
  constexpr int kGroupSums = kTileRows * 2 * 8;
  thread_local std::vector<float> sums;
  sums.resize(static_cast<size_t>(groups) * kGroupSums);
  for (int64_t j = j0; j < j1; j += kTileRows) {
    const int nr = static_cast<int>(std::min<int64_t>(kTileRows, j1 - j));
    std::fill(sums.begin(), sums.end(), 0.0f);
    if (nr < kTileRows) std::memset(wt[nr], 0, sizeof(float) * kTileRun * (kTileRows - nr));
    for (int64_t b0 = 0; b0 < nb; b0 += kIlRun) {
      const int cnt = static_cast<int>(std::min<int64_t>(kIlRun, nb - b0));
      for (int r = 0; r < nr; ++r) deq(j + r, b0, cnt, wt[r]);
      for (int g = 0; g < groups; ++g) {
        const float* xt = xa.xt + (g * xa.k + b0 * 32) * kTileCols;
        float* am = sums.data() + g * kGroupSums;
        if (xa.m - g * kTileCols > 8) {
          TileMicro<2>(wt, xt, cnt * 32, am);
        } else {
          TileMicro<1>(wt, xt, cnt * 32, am);
        }
      }
    }
    for (int g = 0; g < groups; ++g) {
      const float* am = sums.data() + g * kGroupSums;
      const int rows = std::min(kTileCols, xa.m - g * kTileCols);
      for (int c = 0; c < rows; ++c) {
        float* yi = y + (g * kTileCols + c) * ldy + j;
        for (int r = 0; r < nr; ++r) yi[r] = am[(r * 2 + c / 8) * 8 + c % 8];
      }
    }
  }
}

template <GgmlType T>
void TileRowsT(const QuantMatrix& w, const F32TileAct& xa, float* y, int64_t ldy, int64_t j0,
               int64_t j1) {
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  const int64_t rb = w.row_bytes, nb = xa.nb, il_rows = InterleavedRows(w);
  TileRowsWith(w, xa, y, ldy, j0, j1, [&](int64_t row, int64_t b0, int cnt, float* out) {
    if (row < il_rows) {
      const int r0 = static_cast<int>(row % kInterleaveRows);
      DequantRun<T, kInterleaveRows>(base + (row - r0) * rb, rb, r0, nb, b0, cnt, out);
    } else {
      DequantRun<T, 1>(base + row * rb, rb, 0, nb, b0, cnt, out);
    }
  });
}

// Columns of x in groups of kTileCols rows: xt[(g * k + t) * kTileCols + c] = x[g * 16 + c][t],
// zero for rows past m; 8 x 8 blocks transposed in registers. k a multiple of 8.
inline void TransposeActImpl(const float* x, int m, int64_t ldx, int64_t k, float* xt) {
  const int groups = (m + kTileCols - 1) / kTileCols;
  for (int g = 0; g < groups; ++g) {
    for (int c0 = 0; c0 < kTileCols; c0 += 8) {
      const int i0 = g * kTileCols + c0;
      const int live = std::max(0, std::min(8, m - i0));
      float* out = xt + static_cast<int64_t>(g) * k * kTileCols + c0;
      for (int64_t t = 0; t < k; t += 8) {
        __m256 v[8];
        for (int c = 0; c < 8; ++c) {
          v[c] = c < live ? _mm256_loadu_ps(x + (i0 + c) * ldx + t) : _mm256_setzero_ps();
        }
        // 8 x 8 transpose: unpack pairs, then 4-element shuffles, then 128-bit halves.
        const __m256 a0 = _mm256_unpacklo_ps(v[0], v[1]), a1 = _mm256_unpackhi_ps(v[0], v[1]);
        const __m256 a2 = _mm256_unpacklo_ps(v[2], v[3]), a3 = _mm256_unpackhi_ps(v[2], v[3]);
        const __m256 a4 = _mm256_unpacklo_ps(v[4], v[5]), a5 = _mm256_unpackhi_ps(v[4], v[5]);
        const __m256 a6 = _mm256_unpacklo_ps(v[6], v[7]), a7 = _mm256_unpackhi_ps(v[6], v[7]);
        const __m256 b0 = _mm256_shuffle_ps(a0, a2, _MM_SHUFFLE(1, 0, 1, 0));
        const __m256 b1 = _mm256_shuffle_ps(a0, a2, _MM_SHUFFLE(3, 2, 3, 2));
        const __m256 b2 = _mm256_shuffle_ps(a1, a3, _MM_SHUFFLE(1, 0, 1, 0));
        const __m256 b3 = _mm256_shuffle_ps(a1, a3, _MM_SHUFFLE(3, 2, 3, 2));
        const __m256 b4 = _mm256_shuffle_ps(a4, a6, _MM_SHUFFLE(1, 0, 1, 0));
        const __m256 b5 = _mm256_shuffle_ps(a4, a6, _MM_SHUFFLE(3, 2, 3, 2));
        const __m256 b6 = _mm256_shuffle_ps(a5, a7, _MM_SHUFFLE(1, 0, 1, 0));
        const __m256 b7 = _mm256_shuffle_ps(a5, a7, _MM_SHUFFLE(3, 2, 3, 2));
        const __m256 o[8] = {
            _mm256_permute2f128_ps(b0, b4, 0x20), _mm256_permute2f128_ps(b1, b5, 0x20),
            _mm256_permute2f128_ps(b2, b6, 0x20), _mm256_permute2f128_ps(b3, b7, 0x20),
            _mm256_permute2f128_ps(b0, b4, 0x31), _mm256_permute2f128_ps(b1, b5, 0x31),
            _mm256_permute2f128_ps(b2, b6, 0x31), _mm256_permute2f128_ps(b3, b7, 0x31)};
        for (int e = 0; e < 8; ++e) _mm256_storeu_ps(out + (t + e) * kTileCols, o[e]);
      }
    }
  }
}

template <class Isa>
bool RowsF32TileImpl(const QuantMatrix& w, const F32TileAct& xa, float* y, int64_t ldy, int64_t j0,
                     int64_t j1) {
  switch (w.type) {
    case GgmlType::kQ4_0:
      TileRowsT<GgmlType::kQ4_0>(w, xa, y, ldy, j0, j1);
      return true;
    case GgmlType::kQ4_1:
      TileRowsT<GgmlType::kQ4_1>(w, xa, y, ldy, j0, j1);
      return true;
    case GgmlType::kQ8_0:
      TileRowsT<GgmlType::kQ8_0>(w, xa, y, ldy, j0, j1);
      return true;
    default:
      return false;
  }
}

// ---- Entry points ----

template <class Isa>
bool RowsF32Impl(const QuantMatrix& w, const F32Act& xa, float* y, int64_t ldy, int64_t j0,
                 int64_t j1) {
  switch (w.type) {
    case GgmlType::kF32:
      FloatRowsT<GgmlType::kF32>(w, xa, y, ldy, j0, j1);
      return true;
    case GgmlType::kF16:
      FloatRowsT<GgmlType::kF16>(w, xa, y, ldy, j0, j1);
      return true;
    case GgmlType::kBF16:
      FloatRowsT<GgmlType::kBF16>(w, xa, y, ldy, j0, j1);
      return true;
    case GgmlType::kQ4_0:
      if (xa.bsum == nullptr) return false;
      RowsBlockT<Isa, GgmlType::kQ4_0, Dot::kF32>(w, xa, y, ldy, j0, j1);
      return true;
    case GgmlType::kQ4_1:
      if (xa.bsum == nullptr) return false;
      RowsBlockT<Isa, GgmlType::kQ4_1, Dot::kF32>(w, xa, y, ldy, j0, j1);
      return true;
    case GgmlType::kQ8_0:
      RowsBlockT<Isa, GgmlType::kQ8_0, Dot::kF32>(w, xa, y, ldy, j0, j1);
      return true;
    default:
      return false;
  }
}

// Int8 and int16 modes: Q4_0, Q4_1 and Q8_0 only.
template <class Isa, Dot D, class Act>
bool RowsIntImpl(const QuantMatrix& w, const Act& xa, float* y, int64_t ldy, int64_t j0,
                 int64_t j1) {
  switch (w.type) {
    case GgmlType::kQ4_0:
      RowsBlockT<Isa, GgmlType::kQ4_0, D>(w, xa, y, ldy, j0, j1);
      return true;
    case GgmlType::kQ4_1:
      RowsBlockT<Isa, GgmlType::kQ4_1, D>(w, xa, y, ldy, j0, j1);
      return true;
    case GgmlType::kQ8_0:
      RowsBlockT<Isa, GgmlType::kQ8_0, D>(w, xa, y, ldy, j0, j1);
      return true;
    default:
      return false;
  }
}

inline float HmaxPs(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline int HsumEpi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

// Same arithmetic as scalar::QuantizeActInt8 (amax / 127, round half to even, clamp to
// +-127), so the results are bit-identical.
inline void QuantizeActInt8Impl(const float* x, int m, int64_t ldx, int64_t k, int8_t* q,
                                float* scale, float* sum) {
  const int64_t nb = k / 32;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int i = 0; i < m; ++i) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + i * ldx + b * 32;
      __m256 v[4];
      for (int p = 0; p < 4; ++p) v[p] = _mm256_loadu_ps(xb + 8 * p);
      const __m256 mx =
          _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                        _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
      const float amax = HmaxPs(mx);
      const float d = amax / 127.0f;
      const __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
      __m256i qi[4];
      for (int p = 0; p < 4; ++p) {
        qi[p] = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v[p], inv)), lo),
                                 hi);
      }
      const int s = HsumEpi32(
          _mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3])));
      // packs interleave 4-element pieces per 128-bit lane; the permutation restores order.
      const __m256i packed =
          _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i * k + b * 32),
                          _mm256_permutevar8x32_epi32(packed, order));
      scale[i * nb + b] = d;
      sum[i * nb + b] = d * static_cast<float>(s);
    }
  }
}

// Same arithmetic as scalar::QuantizeActInt16 (amax / 32767, round half to even, clamp to
// +-32767), so the results are bit-identical.
inline void QuantizeActInt16Impl(const float* x, int m, int64_t ldx, int64_t k, int16_t* q,
                                 float* scale) {
  const int64_t nb = k / 32;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i lo = _mm256_set1_epi32(-32767), hi = _mm256_set1_epi32(32767);
  for (int i = 0; i < m; ++i) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + i * ldx + b * 32;
      __m256 v[4];
      for (int p = 0; p < 4; ++p) v[p] = _mm256_loadu_ps(xb + 8 * p);
      const __m256 mx =
          _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                        _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
      const float amax = HmaxPs(mx);
      const __m256 inv = _mm256_set1_ps(amax > 0.0f ? 32767.0f / amax : 0.0f);
      __m256i qi[4];
      for (int p = 0; p < 4; ++p) {
        qi[p] = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v[p], inv)), lo),
                                 hi);
      }
      // packs interleaves 4-element pieces per 128-bit lane; the permutation restores order.
      int16_t* qb = q + i * k + b * 32;
      for (int h = 0; h < 2; ++h) {
        const __m256i packed = _mm256_permute4x64_epi64(
            _mm256_packs_epi32(qi[2 * h], qi[2 * h + 1]), _MM_SHUFFLE(3, 1, 2, 0));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb + 16 * h), packed);
      }
      scale[i * nb + b] = amax / 32767.0f;
    }
  }
}

inline void BlockSumsImpl(const float* x, int m, int64_t ldx, int64_t k, float* sums) {
  const int64_t nb = k / 32;
  for (int i = 0; i < m; ++i) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + i * ldx + b * 32;
      const __m256 s =
          _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(xb), _mm256_loadu_ps(xb + 8)),
                        _mm256_add_ps(_mm256_loadu_ps(xb + 16), _mm256_loadu_ps(xb + 24)));
      sums[i * nb + b] = Hsum(s);
    }
  }
}

}  // namespace
}  // namespace tripod::qgemv
