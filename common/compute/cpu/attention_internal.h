// Shared between the attention dispatcher (attention.cc) and its per-ISA kernels: the block
// entry point each instruction-set file implements, and its scratch size.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/compute/cpu/attention.h"

namespace tripod::attn {

constexpr int kKeyTile = 64;  // keys per inner tile

// Floats of scratch a Block call needs for `rows` rows of head_dim.
inline size_t BlockScratchFloats(int rows, int head_dim) {
  // Q, O: rows x head_dim; S: rows x kKeyTile; K and V tiles: kKeyTile x head_dim each; slack
  // for rounding rows up to the micro-kernel height.
  return static_cast<size_t>(rows + 4) * (2 * head_dim + kKeyTile) + 2ull * kKeyTile * head_dim +
         64;
}

// Attention of queries [q0, q1) of `a` for the n_heads / n_kv_heads query heads of kv head kvh
// over cache slots [k0, k1), each query further limited to slots <= n_past + its index. Row r is
// query q0 + r / g, head kvh * g + r % g (g = n_heads / n_kv_heads). Writes the unnormalised
// output o[r * head_dim + d], the running max m[r] (-inf if the row saw no slot) and the sum of
// exponentials l[r]. scratch holds BlockScratchFloats(rows, head_dim) floats.
namespace scalar {
void Block(const AttentionArgs& a, int kvh, int q0, int q1, int64_t k0, int64_t k1, float* scratch,
           float* o, float* m, float* l);
void ConvertRow(const float* src, int n, KvDtype dtype, uint8_t* dst);
}  // namespace scalar
// The decode kernel: few rows of KV heads [kvh0, kvh0 + nh) (nh <= kDecodeMaxHeads) over any
// slot range, as Block for each head with head hh's rows at row offset hh * (q1 - q0) * g of o, m
// and l; scratch: nh * rows * head_dim floats. False where it does not handle this head_dim (the
// caller then runs Block per head).
constexpr int kDecodeMaxHeads = 8;
// A head's run of rows in a block at least this long is a stream the hardware prefetcher
// follows on its own (a contiguous cache): decode tasks there take one head and prefetch nothing;
// shorter runs (paged blocks) get whole-block tasks and software prefetch.
constexpr size_t kDecodeLongRun = 16 << 10;
namespace avx2 {
void Block(const AttentionArgs& a, int kvh, int q0, int q1, int64_t k0, int64_t k1, float* scratch,
           float* o, float* m, float* l);
bool Decode(const AttentionArgs& a, int kvh0, int nh, int q0, int q1, int64_t k0, int64_t k1,
            float* scratch, float* o, float* m, float* l);
void ConvertRow(const float* src, int n, KvDtype dtype, uint8_t* dst);
}  // namespace avx2
namespace avx512 {
void Block(const AttentionArgs& a, int kvh, int q0, int q1, int64_t k0, int64_t k1, float* scratch,
           float* o, float* m, float* l);
bool Decode(const AttentionArgs& a, int kvh0, int nh, int q0, int q1, int64_t k0, int64_t k1,
            float* scratch, float* o, float* m, float* l);
void ConvertRow(const float* src, int n, KvDtype dtype, uint8_t* dst);
}  // namespace avx512

}  // namespace tripod::attn
