// The CUDA backend's elementwise kernels: conversion to bf16, seeded random weights, embedding,
// RMSNorm, bias, scaled add, RoPE, SwiGLU, row gather. Each is memory-bound and simple; grids
// cover rows x columns with a grid-stride loop.
#include <cuda_bf16.h>

#include "common/compute/cuda/cuda_kernels.h"

namespace tripod::cuda {
namespace {

constexpr int kThreads = 256;

int Blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65535 * 8 ? (b < 1 ? 1 : b) : 65535 * 8);
}

__device__ inline uint16_t Bf16Bits(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}
__device__ inline float FromBf16Bits(uint16_t b) {
  return __bfloat162float(__ushort_as_bfloat16(b));
}

// Row-wise kernels run rows over grid.y and a row's columns over x: no 64-bit division per
// element (a software routine on the GPU, which made the first version compute-bound).
#define TRIPOD_ROWS_COLS(m, n)                      \
  for (int r = blockIdx.y; r < (m); r += gridDim.y) \
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < (n); c += gridDim.x * blockDim.x)

dim3 RowsCols(int m, int n) {
  const int x = (n + kThreads - 1) / kThreads;
  return dim3(x < 1 ? 1 : x, m < 1 ? 1 : (m < 65535 ? m : 65535));
}

__global__ void ToBf16Kernel(const float* x, int64_t ldx, int m, int k, uint16_t* y) {
  TRIPOD_ROWS_COLS(m, k) y[static_cast<int64_t>(r) * k + c] = Bf16Bits(x[r * ldx + c]);
}

__device__ inline uint64_t SplitMix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__global__ void FillRandomKernel(uint16_t* w, int64_t n, uint64_t seed, float stddev) {
  // Uniform on [-a, a) has standard deviation a / sqrt(3).
  const float a = stddev * 1.7320508f;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint64_t r = SplitMix(seed ^ (static_cast<uint64_t>(i) * 0x2545f4914f6cdd1dull));
    const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    w[i] = Bf16Bits((2.0f * u - 1.0f) * a);
  }
}

__global__ void EmbedKernel(const uint16_t* table, int d, const int32_t* ids, int m, float* out,
                            int64_t ld) {
  TRIPOD_ROWS_COLS(m, d) out[r * ld + c] = FromBf16Bits(table[int64_t{ids[r]} * d + c]);
}

// One block per row: the sum of squares by a block reduction, then the scaled row.
__global__ void RmsNormKernel(const float* x, int64_t ldx, const float* w, int n, float eps,
                              float* y, int64_t ldy) {
  const float* xr = x + blockIdx.x * ldx;
  float* yr = y + blockIdx.x * ldy;
  float ss = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
  __shared__ float partial[32];
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x == 0) partial[0] = v;
  }
  __syncthreads();
  const float inv = rsqrtf(partial[0] / n + eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * inv * w[i];
}

__global__ void AddBiasKernel(float* x, int64_t ldx, const float* b, int m, int n) {
  TRIPOD_ROWS_COLS(m, n) x[r * ldx + c] += b[c];
}

__global__ void AddScaledKernel(const float* x, int64_t ldx, float alpha, int m, int n, float* y,
                                int64_t ldy) {
  TRIPOD_ROWS_COLS(m, n) y[r * ldy + c] += alpha * x[r * ldx + c];
}

// One thread per (row, head, rotated pair).
__global__ void RopeKernel(float* x, int64_t ldx, int m, int n_heads, int head_dim,
                           const float* cos, const float* sin, int rope_dims, bool halves) {
  const int half = rope_dims / 2;
  TRIPOD_ROWS_COLS(m, n_heads * half) {
    const int h = c / half, p = c - h * half;
    float* v = x + r * ldx + h * head_dim;
    const float cs = cos[r * half + p], sn = sin[r * half + p];
    const int i0 = halves ? p : 2 * p;
    const int i1 = halves ? p + half : 2 * p + 1;
    const float a = v[i0], b = v[i1];
    v[i0] = a * cs - b * sn;
    v[i1] = a * sn + b * cs;
  }
}

__global__ void SwiGluKernel(const float* gu, int64_t ldgu, int m, int n, float* out, int64_t ldo) {
  TRIPOD_ROWS_COLS(m, n) {
    const float g = gu[r * ldgu + c], u = gu[r * ldgu + n + c];
    out[r * ldo + c] = g / (1.0f + __expf(-g)) * u;
  }
}

__global__ void GatherRowsKernel(const float* src, int64_t lds, const int32_t* rows, int m, int n,
                                 float* dst, int64_t ldd) {
  TRIPOD_ROWS_COLS(m, n) dst[r * ldd + c] = src[int64_t{rows[r]} * lds + c];
}

}  // namespace

void ToBf16(const float* x, int64_t ldx, int m, int k, uint16_t* y, cudaStream_t s) {
  ToBf16Kernel<<<RowsCols(m, k), kThreads, 0, s>>>(x, ldx, m, k, y);
}
void FillRandomBf16(uint16_t* w, int64_t n, uint64_t seed, float stddev, cudaStream_t s) {
  FillRandomKernel<<<Blocks(n), kThreads, 0, s>>>(w, n, seed, stddev);
}
void Embed(const uint16_t* table, int d, const int32_t* ids, int m, float* out, int64_t ld,
           cudaStream_t s) {
  EmbedKernel<<<RowsCols(m, d), kThreads, 0, s>>>(table, d, ids, m, out, ld);
}
void RmsNorm(const float* x, int64_t ldx, const float* w, int m, int n, float eps, float* y,
             int64_t ldy, cudaStream_t s) {
  if (m <= 0) return;
  const int threads = n >= 1024 ? 1024 : (n >= 256 ? 256 : 64);
  RmsNormKernel<<<m, threads, 0, s>>>(x, ldx, w, n, eps, y, ldy);
}
void AddBias(float* x, int64_t ldx, const float* b, int m, int n, cudaStream_t s) {
  AddBiasKernel<<<RowsCols(m, n), kThreads, 0, s>>>(x, ldx, b, m, n);
}
void AddScaled(const float* x, int64_t ldx, float alpha, int m, int n, float* y, int64_t ldy,
               cudaStream_t s) {
  AddScaledKernel<<<RowsCols(m, n), kThreads, 0, s>>>(x, ldx, alpha, m, n, y, ldy);
}
void Rope(float* x, int64_t ldx, int m, int n_heads, int head_dim, const float* cos,
          const float* sin, int rope_dims, bool halves, cudaStream_t s) {
  const int64_t total = int64_t{m} * n_heads * (rope_dims / 2);
  if (total == 0) return;
  RopeKernel<<<RowsCols(m, n_heads * (rope_dims / 2)), kThreads, 0, s>>>(
      x, ldx, m, n_heads, head_dim, cos, sin, rope_dims, halves);
}
void SwiGlu(const float* gu, int64_t ldgu, int m, int n, float* out, int64_t ldo, cudaStream_t s) {
  SwiGluKernel<<<RowsCols(m, n), kThreads, 0, s>>>(gu, ldgu, m, n, out, ldo);
}
void GatherRows(const float* src, int64_t lds, const int32_t* rows, int m, int n, float* dst,
                int64_t ldd, cudaStream_t s) {
  GatherRowsKernel<<<RowsCols(m, n), kThreads, 0, s>>>(src, lds, rows, m, n, dst, ldd);
}

}  // namespace tripod::cuda
