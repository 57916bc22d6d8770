// Attention kernels for AVX-512 (16-wide fp32). Only called
// after ActiveIsa() >= kAvx512.
// GCC 12 flags _mm512_undefined_* inside its own intrinsics as (maybe-)uninitialized (GCC PR
// 105593); the sanitizer build's inlining gives the definite form too.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include "common/compute/cpu/attention_internal.h"

namespace tripod::attn {
namespace {

struct Vec {
  using T = __m512;
  static constexpr int W = 16;
  static constexpr int kCV = 4;   // S micro-tile: 4 rows x 64 slots
  static constexpr int kDCV = 4;  // PV micro-tile: 4 rows x 64 dims
  static T Load(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, T v) { _mm512_storeu_ps(p, v); }
  static T Set1(float f) { return _mm512_set1_ps(f); }
  static T Zero() { return _mm512_setzero_ps(); }
  static T Fma(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static T Mul(T a, T b) { return _mm512_mul_ps(a, b); }
  static T Add(T a, T b) { return _mm512_add_ps(a, b); }
  static T Sub(T a, T b) { return _mm512_sub_ps(a, b); }
  static T Max(T a, T b) { return _mm512_max_ps(a, b); }
  static float ReduceAdd(T v) { return _mm512_reduce_add_ps(v); }
  static float ReduceMax(T v) { return _mm512_reduce_max_ps(v); }
  static __m256 Fold(T v) {
    return _mm256_add_ps(_mm512_castps512_ps256(v),
                         _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  }
  static void Reduce8(const __m256* v, float* out) {
    const __m256 h01 = _mm256_hadd_ps(v[0], v[1]);
    const __m256 h23 = _mm256_hadd_ps(v[2], v[3]);
    const __m256 h45 = _mm256_hadd_ps(v[4], v[5]);
    const __m256 h67 = _mm256_hadd_ps(v[6], v[7]);
    const __m256 a = _mm256_hadd_ps(h01, h23);
    const __m256 b = _mm256_hadd_ps(h45, h67);
    const __m256 lo = _mm256_permute2f128_ps(a, b, 0x20);
    const __m256 hi = _mm256_permute2f128_ps(a, b, 0x31);
    _mm256_storeu_ps(out, _mm256_add_ps(lo, hi));
  }
  // A partial sum of W lanes as DecodeRows keeps it: folded to 8 lanes as soon as it is made.
  using Part = __m256;
  // out[j] = sum of the lanes of v[j], j < 16 (each already folded): two 8-way reductions.
  static void ReduceParts(const Part* v, float* out) {
    Reduce8(v, out);
    Reduce8(v + 8, out + 8);
  }
  // out[j] = sum of the lanes of v[j], j < 16.
  static void ReduceW(const T* v, float* out) {
    Part f[16];
    for (int j = 0; j < 16; ++j) f[j] = Fold(v[j]);
    ReduceParts(f, out);
  }
  // e^x, about 2 ulp on [-87, 88]; 0 below (so e^-inf = 0 for masked slots).
  static T Exp(T x) {
    const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
    const __m512 fx = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    const __m512i n = _mm512_cvtps_epi32(fx);
    const __m512 pow2 =
        _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n, _mm512_set1_epi32(127)), 23));
    return _mm512_maskz_mul_ps(keep, y, pow2);
  }
  static T LoadF16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static T LoadBf16(const uint16_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  // 16 int8 as fp32 (a q8_0 row's values, before their block's scale).
  static T LoadQ8(const int8_t* p) {
    return _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  // p[0], p[1] in every pair of lanes.
  static T Bcast64(const float* p) {
    double d;
    __builtin_memcpy(&d, p, 8);
    return _mm512_castpd_ps(_mm512_set1_pd(d));
  }
  // even = lanes 0, 2, .. of a then of b; odd = lanes 1, 3, ...
  static void Unzip(T a, T b, T* even, T* odd) {
    const __m512i e = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    *even = _mm512_permutex2var_ps(a, e, b);
    *odd = _mm512_permutex2var_ps(a, _mm512_add_epi32(e, _mm512_set1_epi32(1)), b);
  }
  // out[i] = the sum of lanes 2i and 2i + 1 of acc[0] (i < 8), of acc[1] for out[8 + i].
  static void PairSums(const T* acc, float* out) {
    const __m512i even =
        _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    _mm512_storeu_ps(out, _mm512_add_ps(_mm512_permutex2var_ps(acc[0], even, acc[1]),
                                        _mm512_permutex2var_ps(acc[0], odd, acc[1])));
  }
  // bf16 dot products (AVX512_BF16, part of this ISA level): see DecodeRows.
  static constexpr bool kBf16Dot = true;
  static T LoadRaw(const uint8_t* p) { return _mm512_castsi512_ps(_mm512_loadu_si512(p)); }
  // acc + a.lo * b.lo + a.hi * b.hi in each 32-bit lane (a, b: pairs of bf16).
  static T DotBf16(T acc, T a, T b) {
    return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(a), reinterpret_cast<__m512bh>(b));
  }
  // Pairs (a[k], b[k]) of the low (high) four bf16 of each 8-element group: dword 4L + i is
  // element 8L + i (8L + 4 + i) of a's 32.
  static T PairLo(T a, T b) {
    return _mm512_castsi512_ps(
        _mm512_unpacklo_epi16(_mm512_castps_si512(a), _mm512_castps_si512(b)));
  }
  static T PairHi(T a, T b) {
    return _mm512_castsi512_ps(
        _mm512_unpackhi_epi16(_mm512_castps_si512(a), _mm512_castps_si512(b)));
  }
  static T Bcast32(const uint16_t* p) {
    uint32_t u;
    __builtin_memcpy(&u, p, 4);
    return _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(u)));
  }
  // Round to bf16 (nearest even; subnormals flush, harmless for q and P, which only feed dots).
  static void StoreRoundBf16(uint16_t* p, T v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
  }
  // out[0, 32) in order from accumulators lo (PairLo's dims) and hi (PairHi's).
  static void UnpairBf16(T lo, T hi, float* out) {
    const __m512i i0 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i i1 = _mm512_add_epi32(i0, _mm512_set1_epi32(8));
    _mm512_storeu_ps(out, _mm512_permutex2var_ps(lo, i0, hi));
    _mm512_storeu_ps(out + 16, _mm512_permutex2var_ps(lo, i1, hi));
  }
  static void StoreF16(uint16_t* p, T v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  // Round to nearest even, NaN kept quiet, in integer arithmetic: vcvtneps2bf16 flushes
  // subnormal inputs to zero, and KV must be the same bits on every ISA.
  static void StoreBf16(uint16_t* p, T v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    const __m512i qnan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, r, qnan)));
  }
};

}  // namespace
}  // namespace tripod::attn

#include "common/compute/cpu/attention_kernels.h"

namespace tripod::attn::avx512 {

void Block(const AttentionArgs& a, int kvh, int q0, int q1, int64_t k0, int64_t k1, float* scratch,
           float* o, float* m, float* l) {
  BlockImpl<Vec>(a, kvh, q0, q1, k0, k1, scratch, o, m, l);
}

bool Decode(const AttentionArgs& a, int kvh0, int nh, int q0, int q1, int64_t k0, int64_t k1,
            float* scratch, float* o, float* m, float* l) {
  return DecodeImpl<Vec>(a, kvh0, nh, q0, q1, k0, k1, scratch, o, m, l);
}

void ConvertRow(const float* src, int n, KvDtype dtype, uint8_t* dst) {
  ConvertRowImpl<Vec>(src, n, dtype, dst);
}

}  // namespace tripod::attn::avx512
