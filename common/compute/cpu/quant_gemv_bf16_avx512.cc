// QuantGemm's bf16 mode on AVX-512 BF16 (Zen 4, Sapphire Rapids and later): x rounded to bf16
// once per call; each 32-weight block dequantised in registers straight to bf16, d * q + m
// rounded to nearest even (the same bf16 weights the bf16 GEMM path prepacks), and vdpbf16ps
// (32 products per instruction, fp32 accumulation) against every x row of the group.
//  - Q4_0 / Q4_1: the 16 values a block's nibbles can take are computed once per block (one FMA
//    over 0..15, one vcvtne2ps2bf16 that also repeats them as a 32-entry table), then one
//    vpermw looks up all 32 weights: the index is each byte (low nibble; vpermw uses the low 5
//    bits, and the table repeats) or the byte shifted right by 4 (high nibble).
//  - Q8_0: the 32 int8 values times d, converted by one vcvtne2ps2bf16.
// One fp32 accumulator per (weight row, x row) runs over the blocks in order and is reduced
// once at the end, so a result does not depend on how many rows the call has: batch-invariant.
// Only called after ActiveIsa() >= kAvx512 and GetCpuFeatures().avx512bf16.
// GCC 12 flags _mm512_undefined_* inside its own intrinsics (GCC PR 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "common/compute/cpu/quant_gemv_internal.h"

namespace tripod::qgemv {
namespace {

inline float Half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

template <GgmlType T>
constexpr int kBlockBytes = T == GgmlType::kQ4_0   ? 18
                            : T == GgmlType::kQ4_1 ? 20
                                                   : 34;

// The block's 32 weights as bf16, in element order, from its quants qs (16 bytes of nibbles or 32
// int8) and its scale d (and Q4_1 minimum mn).
template <GgmlType T>
inline __m512bh WeightsBf16(const uint8_t* qs, float d_s, float mn_s, __m512 iota) {
  const __m512 d = _mm512_set1_ps(d_s);
  if constexpr (T == GgmlType::kQ8_0) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs));
    const __m512 lo =
        _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q))), d);
    const __m512 hi =
        _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1))), d);
    return _mm512_cvtne2ps_pbh(hi, lo);
  } else {
    // Q4_1: n * d + m; Q4_0: (n - 8) * d = n * d - 8 d (exact in fp32 either way).
    const __m512 add =
        T == GgmlType::kQ4_1 ? _mm512_set1_ps(mn_s) : _mm512_mul_ps(d, _mm512_set1_ps(-8.0f));
    const __m512 v = _mm512_fmadd_ps(iota, d, add);
    const __m512i table = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(v, v));
    const __m256i bytes =
        _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
    const __m512i idx =
        _mm512_inserti64x4(_mm512_castsi256_si512(bytes), _mm256_srli_epi16(bytes, 4), 1);
    return reinterpret_cast<__m512bh>(_mm512_permutexvar_epi16(idx, table));
  }
}

// The fp16 scale and minimum of 16 consecutive Q4_1 blocks (320 bytes, read exactly): block j's
// d is word 10 j and its m word 10 j + 1 of the five 64-byte vectors; three word permutes and
// two blends gather them (d in words 0-15, m in 16-31), one vcvtph2ps each converts them. Scalar
// conversions cost ~8 instructions a block, as much as the rest of the block's preparation.
struct Q41ScaleIndex {
  alignas(64) uint16_t a[32], b[32], c[32];
  __mmask32 in_b = 0, in_c = 0;
  constexpr Q41ScaleIndex() : a(), b(), c() {
    for (int lane = 0; lane < 32; ++lane) {
      const int w = lane < 16 ? 10 * lane : 10 * (lane - 16) + 1;
      a[lane] = static_cast<uint16_t>(w < 64 ? w : 0);
      b[lane] = static_cast<uint16_t>(w >= 64 && w < 128 ? w - 64 : 0);
      c[lane] = static_cast<uint16_t>(w >= 128 ? w - 128 : 0);
      if (w >= 64 && w < 128) in_b |= __mmask32{1} << lane;
      if (w >= 128) in_c |= __mmask32{1} << lane;
    }
  }
};
constexpr Q41ScaleIndex kQ41ScaleIndex;

inline void Q41Scales16(const uint8_t* blk, float* d, float* mn) {
  const Q41ScaleIndex& t = kQ41ScaleIndex;
  const __m512i z0 = _mm512_loadu_si512(blk), z1 = _mm512_loadu_si512(blk + 64);
  const __m512i z2 = _mm512_loadu_si512(blk + 128), z3 = _mm512_loadu_si512(blk + 192);
  const __m512i z4 = _mm512_loadu_si512(blk + 256);
  const __m512i ra = _mm512_permutex2var_epi16(z0, _mm512_load_si512(t.a), z1);
  const __m512i rb = _mm512_permutex2var_epi16(z2, _mm512_load_si512(t.b), z3);
  const __m512i rc = _mm512_permutexvar_epi16(_mm512_load_si512(t.c), z4);
  const __m512i r = _mm512_mask_blend_epi16(t.in_c, _mm512_mask_blend_epi16(t.in_b, ra, rb), rc);
  _mm512_storeu_ps(d, _mm512_cvtph_ps(_mm512_castsi512_si256(r)));
  _mm512_storeu_ps(mn, _mm512_cvtph_ps(_mm512_extracti64x4_epi64(r, 1)));
}

// Prefetch distance in the weight stream (the rows of a range are one contiguous stream).
constexpr int kPrefetchBytes = 4096;

// Block b of R weight rows (row r's quants at q + r * rq, scales d[r] and Q4_1 minima mn[r])
// into the R x MG accumulators against MG x rows; row0: the group's stream, for the prefetch.
template <GgmlType T, int R, int MG, int IL>
inline void BlockStep(const uint8_t* row0, const uint8_t* q, int64_t rq, const uint16_t* x,
                      int64_t k, int64_t b, const float* d, const float* mn, __m512 iota,
                      __m512 (&acc)[R][MG]) {
  constexpr int kB = kBlockBytes<T>;
  constexpr int kStep = (IL == 1 ? R : IL) * kB;  // bytes the group's stream advances per block
  const char* pf = reinterpret_cast<const char*>(row0 + kPrefetchBytes + b * kStep);
  _mm_prefetch(pf, _MM_HINT_T0);
  if constexpr (kStep > 64) _mm_prefetch(pf + 64, _MM_HINT_T0);
  if constexpr (kStep > 128) _mm_prefetch(pf + 128, _MM_HINT_T0);
  __m512bh w[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) w[r] = WeightsBf16<T>(q + r * rq, d[r], mn[r], iota);
#pragma GCC unroll 16
  for (int i = 0; i < MG; ++i) {
    const __m512bh xv = reinterpret_cast<__m512bh>(_mm512_loadu_si512(x + i * k + b * 32));
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r][i] = _mm512_dpbf16_ps(acc[r][i], xv, w[r]);
  }
}

// R weight rows against x rows i0 .. i0 + MG - 1. IL = 1: GGUF rows, row r at row0 + r * rs
// (rs: the row bytes). IL > 1 (QuantMatrix::interleave): rows r0 .. r0 + R - 1 of the
// interleaved group at row0 (see IlRunAt).
template <GgmlType T, int R, int MG, int IL>
inline void GroupBf16(const uint8_t* row0, int64_t rs, int r0, const Bf16Act& xa, int i0, float* y,
                      int64_t ldy) {
  constexpr int kB = kBlockBytes<T>, kQ = kIlQuantBytes<T>;
  const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512 acc[R][MG];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int i = 0; i < MG; ++i) acc[r][i] = _mm512_setzero_ps();
  const uint16_t* x = xa.x + int64_t{i0} * xa.k;
  float d[R], mn[R];
  int64_t b = 0;
  if constexpr (T == GgmlType::kQ4_1 && IL == 1) {
    // Whole chunks of 16 blocks of a GGUF row take their scales from Q41Scales16.
    alignas(64) float dc[R][16], mc[R][16];
    for (; b + 16 <= xa.nb; b += 16) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) Q41Scales16(row0 + r * rs + b * kB, dc[r], mc[r]);
      for (int c = 0; c < 16; ++c) {
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          d[r] = dc[r][c];
          mn[r] = mc[r][c];
        }
        BlockStep<T, R, MG, IL>(row0, row0 + (b + c) * kB + (kB - kQ), rs, x, xa.k, b + c, d, mn,
                                iota, acc);
      }
    }
  }
  if constexpr (IL == 1) {
    for (; b < xa.nb; ++b) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const uint8_t* blk = row0 + r * rs + b * kB;
        d[r] = Half(blk);
        mn[r] = T == GgmlType::kQ4_1 ? Half(blk + 2) : 0.0f;
      }
      BlockStep<T, R, MG, IL>(row0, row0 + b * kB + (kB - kQ), rs, x, xa.k, b, d, mn, iota, acc);
    }
  } else {
    // Interleaved: a run's scales are contiguous per row, 8 converted at once.
    alignas(32) float dr[R][kIlRun], mr[R][kIlRun];
    for (int64_t c = 0; c * kIlRun < xa.nb; ++c) {
      const IlRun run = IlRunAt<T>(row0, xa.nb, c);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const uint8_t* pd = run.d(r0 + r, 0);
        const uint8_t* pm = run.m(r0 + r, 0);
        if (run.cnt == kIlRun) {
          _mm256_store_ps(dr[r],
                          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pd))));
          if constexpr (T == GgmlType::kQ4_1) {
            _mm256_store_ps(mr[r],
                            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pm))));
          }
        } else {
          for (int j = 0; j < run.cnt; ++j) {
            dr[r][j] = Half(pd + 2 * j);
            if constexpr (T == GgmlType::kQ4_1) mr[r][j] = Half(pm + 2 * j);
          }
        }
      }
      for (int j = 0; j < run.cnt; ++j) {
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          d[r] = dr[r][j];
          mn[r] = T == GgmlType::kQ4_1 ? mr[r][j] : 0.0f;
        }
        BlockStep<T, R, MG, IL>(row0, run.q(r0, j), kQ, x, xa.k, c * kIlRun + j, d, mn, iota, acc);
      }
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MG; ++i)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) y[(i0 + i) * ldy + r] = _mm512_reduce_add_ps(acc[r][i]);
}

// Weight rows per group for MG x rows: R weight vectors plus R * MG accumulators in 32 registers.
template <int MG>
constexpr int RowsPerGroup() {
  return MG <= 1 ? 8 : MG <= 4 ? 4 : 2;
}

template <GgmlType T, int MG>
void RangeMG(const QuantMatrix& w, const Bf16Act& xa, int i0, float* y, int64_t ldy, int64_t j0,
             int64_t j1) {
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  const int64_t rb = w.row_bytes;
  int64_t j = j0;
  if (w.interleave == kInterleaveRows) {
    constexpr int IL = kInterleaveRows;
    constexpr int R = std::min(IL, RowsPerGroup<MG>());
    static_assert(IL % R == 0);
    const int64_t grouped = std::min(j1, InterleavedRows(w));
    while (j < grouped) {
      const int r0 = static_cast<int>(j % IL);
      const uint8_t* group = base + (j - r0) * rb;
      if (r0 % R == 0 && j + R <= grouped) {
        GroupBf16<T, R, MG, IL>(group, rb, r0, xa, i0, y + j, ldy);
        j += R;
      } else {
        GroupBf16<T, 1, MG, IL>(group, rb, r0, xa, i0, y + j, ldy);
        ++j;
      }
    }
  }
  constexpr int R = RowsPerGroup<MG>();
  for (; j + R <= j1; j += R) GroupBf16<T, R, MG, 1>(base + j * rb, rb, 0, xa, i0, y + j, ldy);
  for (; j < j1; ++j) GroupBf16<T, 1, MG, 1>(base + j * rb, rb, 0, xa, i0, y + j, ldy);
}

template <GgmlType T>
void Range(const QuantMatrix& w, const Bf16Act& xa, float* y, int64_t ldy, int64_t j0, int64_t j1) {
  int i = 0;
  // Groups of at most 8 x rows: 16 rows of a 1536-wide x (48 KB) would not stay in L1, and
  // two weight rows per 8 x rows halve the x loads per dot product.
  for (; i + 8 <= xa.m; i += 8) RangeMG<T, 8>(w, xa, i, y, ldy, j0, j1);
  if (xa.m - i >= 8) {
    RangeMG<T, 8>(w, xa, i, y, ldy, j0, j1);
    i += 8;
  }
  if (xa.m - i >= 4) {
    RangeMG<T, 4>(w, xa, i, y, ldy, j0, j1);
    i += 4;
  }
  if (xa.m - i >= 2) {
    RangeMG<T, 2>(w, xa, i, y, ldy, j0, j1);
    i += 2;
  }
  if (xa.m - i >= 1) RangeMG<T, 1>(w, xa, i, y, ldy, j0, j1);
}

}  // namespace

namespace avx512 {

void ConvertActBf16(const float* x, int m, int64_t ldx, int64_t k, uint16_t* out) {
  for (int i = 0; i < m; ++i) {
    const float* xi = x + i * ldx;
    uint16_t* oi = out + i * k;
    int64_t t = 0;
    for (; t + 32 <= k; t += 32) {
      const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(xi + t + 16), _mm512_loadu_ps(xi + t));
      _mm512_storeu_si512(oi + t, reinterpret_cast<__m512i>(v));
    }
    for (; t < k; ++t) {
      const __m128bh v = _mm_cvtneps_pbh(_mm_set_ss(xi[t]));
      uint16_t h;
      std::memcpy(&h, &v, 2);
      oi[t] = h;
    }
  }
}

bool RowsBf16(const QuantMatrix& w, const Bf16Act& xa, float* y, int64_t ldy, int64_t j0,
              int64_t j1) {
  switch (w.type) {
    case GgmlType::kQ4_0:
      Range<GgmlType::kQ4_0>(w, xa, y, ldy, j0, j1);
      return true;
    case GgmlType::kQ4_1:
      Range<GgmlType::kQ4_1>(w, xa, y, ldy, j0, j1);
      return true;
    case GgmlType::kQ8_0:
      Range<GgmlType::kQ8_0>(w, xa, y, ldy, j0, j1);
      return true;
    default:
      return false;
  }
}

}  // namespace avx512
}  // namespace tripod::qgemv
