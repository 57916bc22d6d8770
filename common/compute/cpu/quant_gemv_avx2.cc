// QuantGemm kernels for AVX2 + FMA + F16C: int8 dots with maddubs (u8 x s8 -> s16 pairs) and
// madd against ones (-> s32). Only called after ActiveIsa() >= kAvx2.
#include <immintrin.h>

#include "common/compute/cpu/quant_gemv_internal.h"

namespace tripod::qgemv {
namespace {
struct Isa {
  // maddubs saturates pair sums at 2^15; ours stay below: weights are nibbles (<= 15) or
  // |int8| (<= 128) against x in [-127, 127], so a pair is at most 2 * 128 * 127 = 32512.
  static inline __m256i DotU8S8(__m256i u8, __m256i s8) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u8, s8), _mm256_set1_epi16(1));
  }
  static inline __m256i DotS16x2(__m256i a0, __m256i b0, __m256i a1, __m256i b1) {
    return _mm256_add_epi32(_mm256_madd_epi16(a0, b0), _mm256_madd_epi16(a1, b1));
  }
  // 16 ymm registers: 4 weight rows per group, 8 accumulators at most (more spill).
  static constexpr int kRowsOuter = 4;
  static constexpr int kAccumulators = 8;
  static constexpr int kAccumulatorsF32 = 8;
};
}  // namespace
}  // namespace tripod::qgemv

#include "common/compute/cpu/quant_gemv_kernels.h"
#include "common/compute/cpu/quant_gemv_kquant_kernels.h"

namespace tripod::qgemv::avx2 {

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
  return RowsIntImpl<Isa, Dot::kInt8>(w, xa, y, ldy, j0, j1);
}

void QuantizeActInt16(const float* x, int m, int64_t ldx, int64_t k, int16_t* q, float* scale) {
  QuantizeActInt16Impl(x, m, ldx, k, q, scale);
}

bool RowsInt16(const QuantMatrix& w, const Int16Act& xa, float* y, int64_t ldy, int64_t j0,
               int64_t j1) {
  return RowsInt16KImpl<Isa>(w, xa, y, ldy, j0, j1) ||
         RowsIntImpl<Isa, Dot::kInt16>(w, xa, y, ldy, j0, j1);
}

void LaneOrderInt16(const int16_t* q, int m, int64_t k, int16_t* qp) {
  LaneOrderInt16Impl(q, m, k, qp);
}

bool DequantRow(const QuantMatrix& w, int64_t j, float* out) { return DequantRowImpl(w, j, out); }

}  // namespace tripod::qgemv::avx2
