// The decode steps' matrix products: y[m, n] (+)= x[m, k] W[n, k]^T for a few rows (m <= 8),
// where every weight is read once and the product is bound by memory bandwidth. One warp per
// output feature streams its bf16 row in 16-byte pieces (four in flight per lane), the fp32
// activations come through the read-only cache (every warp of the grid reads the same x), and a
// warp reduction ends each dot product. cuBLAS's GEMM reached a small fraction of the copy
// bandwidth on the 8B shape's decode step, where bandwidth is the whole point (docs/cuda.md,
// "Figures behind the kernels' choices").
#include "common/compute/cuda/cuda_kernels.h"

namespace tripod::cuda {
namespace {

constexpr int kWarps = 8;  // rows per block

template <int M>
__device__ inline void Dot8(const uint4& p, const float* __restrict__ x, int64_t ldx, int col,
                            float* acc) {
  float w[8];
  w[0] = __uint_as_float(p.x << 16);
  w[1] = __uint_as_float(p.x & 0xffff0000u);
  w[2] = __uint_as_float(p.y << 16);
  w[3] = __uint_as_float(p.y & 0xffff0000u);
  w[4] = __uint_as_float(p.z << 16);
  w[5] = __uint_as_float(p.z & 0xffff0000u);
  w[6] = __uint_as_float(p.w << 16);
  w[7] = __uint_as_float(p.w & 0xffff0000u);
#pragma unroll
  for (int r = 0; r < M; ++r) {
    const float4* xr = reinterpret_cast<const float4*>(x + r * ldx + col);
    const float4 a = __ldg(xr), b = __ldg(xr + 1);
    acc[r] += w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y +
              w[6] * b.z + w[7] * b.w;
  }
}

template <int M>
__global__ void __launch_bounds__(kWarps * 32)
    GemvKernel(const uint16_t* __restrict__ w, int n, int k, const float* __restrict__ x,
               int64_t ldx, float* __restrict__ y, int64_t ldy, int accumulate) {
  const int row = blockIdx.x * kWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= n) return;
  const uint4* wr = reinterpret_cast<const uint4*>(w + static_cast<int64_t>(row) * k);
  const int nv = k >> 3;
  float acc[M];
#pragma unroll
  for (int r = 0; r < M; ++r) acc[r] = 0;
  int i = lane;
  for (; i + 96 < nv; i += 128) {
    uint4 p[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) p[u] = __ldcs(wr + i + 32 * u);  // streamed: read once
#pragma unroll
    for (int u = 0; u < 4; ++u) Dot8<M>(p[u], x, ldx, (i + 32 * u) * 8, acc);
  }
  for (; i < nv; i += 32) Dot8<M>(__ldcs(wr + i), x, ldx, i * 8, acc);
#pragma unroll
  for (int r = 0; r < M; ++r) {
    for (int off = 16; off > 0; off >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], off);
  }
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < M; ++r) {
      float* out = y + r * ldy + row;
      *out = accumulate ? *out + acc[r] : acc[r];
    }
  }
}

template <int M>
void Launch(const uint16_t* w, int n, int k, const float* x, int64_t ldx, float* y, int64_t ldy,
            bool accumulate, cudaStream_t s) {
  GemvKernel<M><<<(n + kWarps - 1) / kWarps, kWarps * 32, 0, s>>>(w, n, k, x, ldx, y, ldy,
                                                                  accumulate ? 1 : 0);
}

}  // namespace

bool Gemv(const uint16_t* w, int n, int k, const float* x, int64_t ldx, int m, float* y,
          int64_t ldy, bool accumulate, cudaStream_t s) {
  if (m < 1 || m > kGemvMaxRows || k % 8 != 0 || ldx % 4 != 0 ||
      reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(w) % 16 != 0) {
    return false;
  }
  using LaunchFn = void (*)(const uint16_t*, int, int, const float*, int64_t, float*, int64_t, bool,
                            cudaStream_t);
  static constexpr LaunchFn kByRows[kGemvMaxRows] = {Launch<1>, Launch<2>, Launch<3>, Launch<4>,
                                                     Launch<5>, Launch<6>, Launch<7>, Launch<8>};
  kByRows[m - 1](w, n, k, x, ldx, y, ldy, accumulate, s);
  return true;
}

}  // namespace tripod::cuda
