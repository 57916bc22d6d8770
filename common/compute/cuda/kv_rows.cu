// K/V rows between the cache's layout (blocks, K's 16-slot tiles) and the KV-chunk payload's
// ([K, V][kv_head][slot] rows of head_dim elements, K in row order; kv_chunk.proto), on the
// device: what a transfer packs before its one copy to the host, and unpacks after its one copy
// from it, instead of staging every block of a scattered block table.
#include "common/compute/cuda/cuda_kernels.h"
#include "common/compute/cuda/kv_address.cuh"
#include "common/kv/kv_link_hash.h"

#include <algorithm>

namespace tripod::cuda {
namespace {

// Grid (slot, kv head, K|V), a thread per element. The element's bytes move as they are.
template <bool kPack>
__global__ void KvRowsKernel(KvView kv, int n_kv_heads, int head_dim, int slot0, int n,
                             uint8_t* rows) {
  const int j = blockIdx.x, h = blockIdx.y, is_v = blockIdx.z;
  const int eb = ElemBytes(kv.dtype);
  const int64_t row = (static_cast<int64_t>(is_v) * n_kv_heads + h) * n + j;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    uint8_t* cache = KvElem(kv, is_v == 0, slot0 + j, h, d, head_dim);
    uint8_t* flat = rows + (row * head_dim + d) * eb;
    if (eb == 4) {
      if (kPack) {
        *reinterpret_cast<uint32_t*>(flat) = *reinterpret_cast<const uint32_t*>(cache);
      } else {
        *reinterpret_cast<uint32_t*>(cache) = *reinterpret_cast<const uint32_t*>(flat);
      }
    } else if (kPack) {
      *reinterpret_cast<uint16_t*>(flat) = *reinterpret_cast<const uint16_t*>(cache);
    } else {
      *reinterpret_cast<uint16_t*>(cache) = *reinterpret_cast<const uint16_t*>(flat);
    }
  }
}

// KvLinkHash's sum: each thread sums its words' terms, a block reduces them, one atomic add per
// block (the sum is modulo 2^64, so the order does not matter).
__global__ void LinkHashKernel(const uint8_t* p, uint64_t bytes, unsigned long long* sum) {
  __shared__ unsigned long long part[256];
  const uint64_t words = (bytes + 7) / 8;
  unsigned long long acc = 0;
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < words;
       i += uint64_t{gridDim.x} * blockDim.x) {
    uint64_t w = 0;
    const uint64_t at = i * 8;
    if (at + 8 <= bytes && (reinterpret_cast<uintptr_t>(p) & 7) == 0) {
      w = *reinterpret_cast<const uint64_t*>(p + at);
    } else {
      for (uint64_t b = 0; b < 8 && at + b < bytes; ++b) w |= uint64_t{p[at + b]} << (8 * b);
    }
    acc += KvLinkTerm(w, i);
  }
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(sum, part[0]);
}

}  // namespace

void LinkHashSum(const uint8_t* p, uint64_t bytes, unsigned long long* sum, cudaStream_t s) {
  cudaMemsetAsync(sum, 0, sizeof(*sum), s);
  if (bytes == 0) return;
  const uint64_t words = (bytes + 7) / 8;
  const int blocks = static_cast<int>(std::min<uint64_t>((words + 255) / 256, 1024));
  LinkHashKernel<<<blocks, 256, 0, s>>>(p, bytes, sum);
}

void PackKvRows(const KvView& kv, int n_kv_heads, int head_dim, int slot0, int n, uint8_t* rows,
                cudaStream_t s) {
  if (n <= 0) return;
  KvRowsKernel<true>
      <<<dim3(n, n_kv_heads, 2), 128, 0, s>>>(kv, n_kv_heads, head_dim, slot0, n, rows);
}

void UnpackKvRows(const uint8_t* rows, int n_kv_heads, int head_dim, int slot0, int n,
                  const KvView& kv, cudaStream_t s) {
  if (n <= 0) return;
  KvRowsKernel<false><<<dim3(n, n_kv_heads, 2), 128, 0, s>>>(kv, n_kv_heads, head_dim, slot0, n,
                                                             const_cast<uint8_t*>(rows));
}

}  // namespace tripod::cuda
