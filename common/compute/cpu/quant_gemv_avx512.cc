// QuantGemm kernels for AVX-512 (VL + VNNI): the same 256-bit loops as the AVX2 file, with the
// int8 block dot done by one vpdpbusd and, with 32 vector registers, twice the rows per group.
// Only called after ActiveIsa() >= kAvx512.
// GCC 12 flags _mm512_undefined_* inside its own intrinsics (GCC PR 105593), which the 512-bit
// K-quant kernels use.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include "common/compute/cpu/quant_gemv_internal.h"

namespace tripod::qgemv {
namespace {
struct Isa {
  static inline __m256i DotU8S8(__m256i u8, __m256i s8) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u8, s8);
  }
  static inline __m256i DotS16x2(__m256i a0, __m256i b0, __m256i a1, __m256i b1) {
    return _mm256_dpwssd_epi32(_mm256_dpwssd_epi32(_mm256_setzero_si256(), a0, b0), a1, b1);
  }
  // The AVX2 groups: twice as many (32 registers) measured slower at m = 1 (docs/cpu-kernels.md,
  // "Figures behind the code's constants").
  static constexpr int kRowsOuter = 4;
  static constexpr int kAccumulators = 8;
  static constexpr int kAccumulatorsF32 = 8;
};
}  // namespace
}  // namespace tripod::qgemv

#include "common/compute/cpu/quant_gemv_kernels.h"
#include "common/compute/cpu/quant_gemv_kquant_avx512.h"
#include "common/compute/cpu/quant_gemv_kquant_kernels.h"
#include "common/compute/cpu/quant_gemv_kquant_vnni_avx512.h"

namespace tripod::qgemv::avx512 {

void TransposeAct(const float* x, int m, int64_t ldx, int64_t k, float* xt) {
  TransposeActImpl(x, m, ldx, k, xt);
}

bool RowsF32Tile(const QuantMatrix& w, const F32TileAct& xa, float* y, int64_t ldy, int64_t j0,
                 int64_t j1) {
  return RowsF32TileImpl<Isa>(w, xa, y, ldy, j0, j1) || RowsF32TileKImpl(w, xa, y, ldy, j0, j1);
}

void QuantizeActInt8(const float* x, int m, int64_t ldx, int64_t k, int8_t* q, float* scale,
                     float* sum) {
  QuantizeActInt8Impl(x, m, ldx, k, q, scale, sum);
}

void BlockSums(const float* x, int m, int64_t ldx, int64_t k, float* sums) {
  BlockSumsImpl(x, m, ldx, k, sums);
}

bool RowsF32(const QuantMatrix& w, const F32Act& xa, float* y, int64_t ldy, int64_t j0,
             int64_t j1) {
  return RowsF32Impl<Isa>(w, xa, y, ldy, j0, j1) || RowsF32KImpl(w, xa, y, ldy, j0, j1);
}

bool RowsInt8(const QuantMatrix& w, const Int8Act& xa, float* y, int64_t ldy, int64_t j0,
              int64_t j1) {
  return RowsKV512<Int8Side>(w, xa, y, ldy, j0, j1) ||
         RowsIntImpl<Isa, Dot::kInt8>(w, xa, y, ldy, j0, j1);
}

void QuantizeActInt16(const float* x, int m, int64_t ldx, int64_t k, int16_t* q, float* scale) {
  QuantizeActInt16Impl(x, m, ldx, k, q, scale);
}

bool RowsInt16(const QuantMatrix& w, const Int16Act& xa, float* y, int64_t ldy, int64_t j0,
               int64_t j1) {
  if (IsIntBlockType(w.type))
    return xa.qp != nullptr && RowsKV512<Int16Side>(w, xa, y, ldy, j0, j1);
  return RowsIntImpl<Isa, Dot::kInt16>(w, xa, y, ldy, j0, j1);
}

void PairOrderInt16(const int16_t* q, int m, int64_t k, int16_t* qp, int64_t kp) {
  qgemv::PairOrderInt16(q, m, k, qp, kp);
}

bool DequantRow(const QuantMatrix& w, int64_t j, float* out) { return DequantRowImpl(w, j, out); }

bool RowsBf16KQuant(const QuantMatrix& w, const Bf16Act& xa, float* y, int64_t ldy, int64_t j0,
                    int64_t j1) {
  return RowsBf16K(w, xa, y, ldy, j0, j1);
}

}  // namespace tripod::qgemv::avx512
