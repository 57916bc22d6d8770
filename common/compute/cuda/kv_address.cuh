// Where an element of the KV cache lies, in the cache's own layout (common/kv/kv_layout.h:
// blocks, K's 16-slot transposed tiles for the 2-byte types): the one address function of the
// CUDA kernels that read or write K/V (attention.cu, attention_mma.cu).
#pragma once

#include <cstdint>

#include "common/compute/cuda/cuda_kernels.h"

namespace tripod::cuda {

inline constexpr int kKvTileSlots = 16;  // kKvKTile

__device__ inline int ElemBytes(int dtype) { return dtype == 0 ? 4 : 2; }

// Byte address of element d of slot s, KV head h: K (tiled or rows) or V (rows). 32-bit index
// arithmetic, and a shift for power-of-two blocks: 64-bit division is a long software routine on
// the GPU, and with it here the first version of these kernels spent most of their time on
// addresses (docs/cuda.md, "Figures behind the kernels' choices").
__device__ inline uint8_t* KvElem(const KvView& kv, bool is_k, int s, int h, int d, int hd) {
  const int eb = ElemBytes(kv.dtype);
  const int row_bytes = eb * hd;
  const int bi = kv.bt_shift >= 0 ? s >> kv.bt_shift : s / kv.block_tokens;
  const int r = s - bi * kv.block_tokens;
  const int64_t b = kv.block_ids != nullptr ? kv.block_ids[bi] : bi;
  uint8_t* base = (is_k ? kv.k_base : kv.v_base) + b * kv.block_bytes +
                  static_cast<int64_t>(h * kv.block_tokens) * row_bytes;
  if (is_k && kv.k_tiled) {
    const int j = r & (kKvTileSlots - 1);
    return base + static_cast<int64_t>(r - j) * row_bytes + ((d >> 1) * kKvTileSlots + j) * 4 +
           (d & 1) * 2;
  }
  return base + static_cast<int64_t>(r) * row_bytes + d * eb;
}

}  // namespace tripod::cuda
