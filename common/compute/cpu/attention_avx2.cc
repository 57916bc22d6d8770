// Attention kernels for AVX2 + FMA + F16C (8-wide fp32). Only called after ActiveIsa() >= kAvx2.
#include <immintrin.h>

#include "common/compute/cpu/attention_internal.h"

namespace tripod::attn {
namespace {

struct Vec {
  using T = __m256;
  static constexpr int W = 8;
  static constexpr int kCV = 2;            // S micro-tile: 4 rows x 16 slots
  static constexpr int kDCV = 2;           // PV micro-tile: 4 rows x 16 dims
  static constexpr bool kBf16Dot = false;  // no bf16 dot products: fp32 throughout
  static T Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, T v) { _mm256_storeu_ps(p, v); }
  static T Set1(float f) { return _mm256_set1_ps(f); }
  static T Zero() { return _mm256_setzero_ps(); }
  static T Fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static T Mul(T a, T b) { return _mm256_mul_ps(a, b); }
  static T Add(T a, T b) { return _mm256_add_ps(a, b); }
  static T Sub(T a, T b) { return _mm256_sub_ps(a, b); }
  static T Max(T a, T b) { return _mm256_max_ps(a, b); }
  static float ReduceAdd(T v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static float ReduceMax(T v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  // out[j] = sum of the lanes of v[j], j < 8.
  static void ReduceW(const T* v, float* out) {
    const __m256 h01 = _mm256_hadd_ps(v[0], v[1]);
    const __m256 h23 = _mm256_hadd_ps(v[2], v[3]);
    const __m256 h45 = _mm256_hadd_ps(v[4], v[5]);
    const __m256 h67 = _mm256_hadd_ps(v[6], v[7]);
    const __m256 a = _mm256_hadd_ps(h01, h23);  // [v0..v3 low halves | v0..v3 high halves]
    const __m256 b = _mm256_hadd_ps(h45, h67);
    const __m256 lo = _mm256_permute2f128_ps(a, b, 0x20);
    const __m256 hi = _mm256_permute2f128_ps(a, b, 0x31);
    _mm256_storeu_ps(out, _mm256_add_ps(lo, hi));
  }
  static T Bcast64(const float* p) {
    double d;
    __builtin_memcpy(&d, p, 8);
    return _mm256_castpd_ps(_mm256_set1_pd(d));
  }
  // even = lanes 0, 2, .. of a then of b; odd = lanes 1, 3, ...
  static void Unzip(T a, T b, T* even, T* odd) {
    const __m256 e = _mm256_shuffle_ps(a, b, 0x88);  // a0 a2 b0 b2 | a4 a6 b4 b6
    const __m256 o = _mm256_shuffle_ps(a, b, 0xdd);
    *even = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), 0xd8));
    *odd = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(o), 0xd8));
  }
  // out[i] = the sum of lanes 2i and 2i + 1 of the 2 accumulators taken as one (8 outputs).
  static void PairSums2(const T* acc, float* out) {
    const __m256 s = _mm256_hadd_ps(acc[0], acc[1]);  // slots 0 1 4 5 2 3 6 7
    _mm256_storeu_ps(out, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(s), 0xd8)));
  }
  // The same over 4 accumulators (16 outputs).
  static void PairSums(const T* acc, float* out) {
    PairSums2(acc, out);
    PairSums2(acc + 2, out + 8);
  }
  // DecodeRows' partial sums: 8 lanes already, nothing to fold.
  using Part = __m256;
  static Part Fold(T v) { return v; }
  static void ReduceParts(const Part* v, float* out) { ReduceW(v, out); }
  // e^x, about 2 ulp on [-87, 88]; 0 below (so e^-inf = 0 for masked slots).
  static T Exp(T x) {
    const __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_GE_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    const __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i n = _mm256_cvtps_epi32(fx);
    const __m256 pow2 =
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23));
    return _mm256_and_ps(_mm256_mul_ps(y, pow2), keep);
  }
  static T LoadF16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static T LoadBf16(const uint16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  // 8 int8 as fp32 (a q8_0 row's values, before their block's scale).
  static T LoadQ8(const int8_t* p) {
    return _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static void StoreF16(uint16_t* p, T v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  // Round to nearest even; NaN stays NaN (quiet bit forced).
  static void StoreBf16(uint16_t* p, T v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    const __m256i qnan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    r = _mm256_blendv_epi8(r, qnan, nan);
    // Pack 8 x u32 (values < 2^16) to 8 x u16.
    const __m128i lo = _mm256_castsi256_si128(r), hi = _mm256_extracti128_si256(r, 1);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm_packus_epi32(lo, hi));
  }
};

}  // namespace
}  // namespace tripod::attn

#include "common/compute/cpu/attention_kernels.h"

namespace tripod::attn::avx2 {

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

}  // namespace tripod::attn::avx2
