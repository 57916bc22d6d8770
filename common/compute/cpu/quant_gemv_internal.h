// Shared between the QuantGemm dispatcher and its per-ISA kernels: the int8 activation layout
// and the row-range entry points of each instruction-set file.
#pragma once

#include <cstdint>

#include "common/compute/cpu/quant_gemv.h"

namespace tripod::qgemv {

// x quantised for the int8 path: row i has k int8 values at q + i * k; per 32-element block b,
// scale[i * nb + b] = d_x and sum[i * nb + b] = d_x * (sum of the block's int8 values), the term
// that Q4_0's offset and Q4_1's minimum multiply.
struct Int8Act {
  const int8_t* q = nullptr;
  const float* scale = nullptr;
  const float* sum = nullptr;
  int m = 0;
  int64_t k = 0;
  int64_t nb = 0;
};

// Quantises m rows of k floats (k a multiple of 32) into the buffers of an Int8Act.
void QuantizeActInt8(const float* x, int m, int64_t ldx, int64_t k, int8_t* q, float* scale,
                     float* sum);

// Output rows [j0, j1) of y = x * W^T. F32 kernels take any supported type; Int8 kernels take
// Q4_0, Q4_1 and Q8_0 only. Each returns false if it does not handle w.type.
namespace scalar {
bool RowsF32(const QuantMatrix& w, const float* x, int m, int64_t ldx, float* y, int64_t ldy,
             int64_t j0, int64_t j1);
bool RowsInt8(const QuantMatrix& w, const Int8Act& xa, float* y, int64_t ldy, int64_t j0,
              int64_t j1);
}  // namespace scalar
namespace avx2 {
bool RowsF32(const QuantMatrix& w, const float* x, int m, int64_t ldx, float* y, int64_t ldy,
             int64_t j0, int64_t j1);
bool RowsInt8(const QuantMatrix& w, const Int8Act& xa, float* y, int64_t ldy, int64_t j0,
              int64_t j1);
}  // namespace avx2
namespace avx512 {
bool RowsF32(const QuantMatrix& w, const float* x, int m, int64_t ldx, float* y, int64_t ldy,
             int64_t j0, int64_t j1);
bool RowsInt8(const QuantMatrix& w, const Int8Act& xa, float* y, int64_t ldy, int64_t j0,
              int64_t j1);
}  // namespace avx512

}  // namespace tripod::qgemv
