// Fused dequantise-and-multiply kernels for small batches (decode): each weight byte is read
// once for all m rows of x. Weights stay in their GGUF block format.
#pragma once

#include <cstdint>
#include <span>

#include "common/model/quant_types.h"

namespace tripod {

// How activations meet quantised weights.
//  kF32:  weights dequantised to fp32 in registers, fp32 FMA with x (the exact fp32 path).
//  kInt8: x quantised per 32-element block to int8 (Q8-style, one fp32 scale per block), integer
//         dot products with the weight blocks (VNNI where present) (the fast reduced path).
//  kInt16: x quantised per 32-element block to int16 (one fp32 scale per block, |q| <= 32767),
//         exact integer dot products with the weights' integer values (vpdpwssd / vpmaddwd),
//         the block scales and Q4_1's minimum applied in fp32 (the minimum against x's exact
//         fp32 block sums). x's rounding error is 2^-16 of its block's largest value, some 100
//         times below bf16's, at about half the instructions of kF32 per weight block, which is
//         what lets one core keep up with DRAM at batch 1 (docs/cpu-kernels.md, "Figures behind
//         the code's constants").
//  kBf16: x rounded to bf16, each block dequantised to bf16 in registers (the bf16 GEMM's weights),
//         bf16 dot products with fp32 accumulation (AVX512_BF16 only; elsewhere, and for
//         other weight types, kF32). Below kBf16MinRows rows it is kF32, which reads the
//         weights as fast there (the same section of docs/cpu-kernels.md).
//  kF32Tile: for many rows of x (8 and more): kTileRows weight rows at a time dequantised to fp32
//         once into L1 and multiplied against all rows of x (transposed) by a register tile,
//         fp32 throughout (weights exact, products and sums in fp32, as kF32). Each weight
//         element costs one broadcast and one FMA per 8 x rows; kInt16 pays per weight block
//         and group of 4 x rows an unpack, and per block and x row a conversion and a scale FMA,
//         so from about 8 rows it is the faster (ibid.). A row's result depends on whether it
//         shares its group of 16 with 8 or fewer rows (the tile's width), so it is not batch
//         invariant, and it is slower than kInt16 below about 8 rows. Q4_0, Q4_1 and Q8_0 with
//         AVX2; kF32 otherwise.
enum class GemvMode { kF32, kInt8, kInt16, kBf16, kF32Tile };
inline constexpr int kBf16MinRows = 4;

// "fp32", "int8", "int16", "bf16" or "fp32-tile".
const char* GemvModeName(GemvMode mode);

struct QuantMatrix {
  GgmlType type;
  const void* data;  // n rows of k elements, each row RowBytes(type, k) bytes
  int64_t n = 0;     // output features (rows)
  int64_t k = 0;     // input features (row length)
  int64_t row_bytes = 0;
  // 1: GGUF layout, row j at data + j * row_bytes. kInterleaveRows (Q4_0, Q4_1, Q8_0 only):
  // rows [g, g + kInterleaveRows) for g < InterleavedRows() share the bytes of their group,
  // data + g * row_bytes onwards, in runs of 8 blocks: a run holds the rows' scales, then their
  // quants block by block (qgemv::IlRunAt has the offsets); the rows after those keep the GGUF
  // layout. A decode kernel then reads its row group as one stream, not one per row, converts a
  // row's 8 scales with one load, and its quant loads never straddle cache lines (see
  // InterleaveRows).
  int interleave = 1;
};

// Rows per interleaved group: the vector kernels' row group (every ISA's kRowsOuter).
inline constexpr int kInterleaveRows = 4;

// The rows that lie in interleaved groups (0 for the GGUF layout).
inline int64_t InterleavedRows(const QuantMatrix& w) {
  return w.interleave == 1 ? 0 : w.n / w.interleave * w.interleave;
}

// Whether InterleaveRows takes w (a block type the vector kernels read, GGUF layout).
bool CanInterleave(const QuantMatrix& w);

// Writes w's n * row_bytes bytes to dst in the kInterleaveRows layout: one stream per thread
// reads faster from DRAM than 4 row streams, and each run's scales ahead of its quants speed the
// int16 decode pass further (see qgemv::IlRunAt; docs/cpu-kernels.md, "Figures behind the code's
// constants"). dst must not overlap w.data.
void InterleaveRows(const QuantMatrix& w, void* dst);

// Row j of w in GGUF layout (row_bytes bytes) into out, whatever w's layout.
void CopyRowOut(const QuantMatrix& w, int64_t j, uint8_t* out);

// Row j of w in GGUF layout: in place for the GGUF layout, else copied into buf (row_bytes).
const uint8_t* GgufRow(const QuantMatrix& w, int64_t j, uint8_t* buf);

// Row j of w as k fp32 values (a prefill GEMM's weight tile), with the vector code where the CPU
// and the type have it, else the reference dequantiser; equal to DequantizeRow's up to rounding.
void DequantizeMatrixRow(const QuantMatrix& w, int64_t j, float* out);

// y[i, j] = sum_t x[i, t] * W[j, t] for i < m, j < n. x rows are ldx floats apart, y rows ldy.
// Threads over n with ParallelFor. m is small (1..16); for larger m use the GEMM path.
void QuantGemm(const QuantMatrix& w, const float* x, int m, int64_t ldx, float* y, int64_t ldy,
               GemvMode mode);

// A matrix stacked with others along the output: its rows are y's columns [col, col + q.n).
struct QuantPart {
  QuantMatrix q;
  int64_t col = 0;
};

// The same over parts that share x (all of the same k), in one parallel region with x prepared
// once (Q|K|V, gate|up): decode runs hundreds of these a token, and each fork/join and each
// pass over x costs about as much as streaming a few KB of weights. With accumulate, y += the
// product (each thread adds the columns it computed, in the same region).
void QuantGemm(std::span<const QuantPart> parts, const float* x, int m, int64_t ldx, float* y,
               int64_t ldy, GemvMode mode, bool accumulate);

}  // namespace tripod
