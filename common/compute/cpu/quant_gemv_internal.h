// Shared between the QuantGemm dispatcher and its per-ISA kernels: the prepared activation
// layouts (int8 blocks, fp32 block sums) and the row-range entry points of each ISA file.
#pragma once

#include <cstdint>

#include "common/compute/cpu/quant_gemv.h"

namespace tripod::qgemv {

// Activations for the kF32 kernels: x itself, plus per 32-element block b of row i the fp32 sum
// bsum[i * nb + b] of the block's x values (the term Q4_1's minimum and Q4_0's offset multiply).
// bsum may be null for weight types without such a term. Kernels read exactly a row's nb sums
// (LoadUpTo8 masks a partial group of 8), so the buffers need no padding.
struct F32Act {
  const float* x = nullptr;
  int64_t ldx = 0;
  const float* bsum = nullptr;
  int m = 0;
  int64_t k = 0;
  int64_t nb = 0;
};

// x quantised for the int8 path: row i has k int8 values at q + i * k; per 32-element block b,
// scale[i * nb + b] = d_x and sum[i * nb + b] = d_x * (sum of the block's int8 values), the term
// that Q4_0's offset and Q4_1's minimum multiply.
// sum16[i * 2 nb + 2 b + h] is the plain sum of the int8 values of half h of block b (Q6_K's
// offset term; only set where a Q6_K matrix takes the int8 path).
struct Int8Act {
  const int8_t* q = nullptr;
  const float* scale = nullptr;
  const float* sum = nullptr;
  int m = 0;
  int64_t k = 0;
  int64_t nb = 0;
  const float* sum16 = nullptr;
};

// x quantised for the int16 path: row i has k int16 values at q + i * k; per 32-element block
// b, scale[i * nb + b] = d_x, and bsum[i * nb + b] the exact fp32 sum of the block's x values (as
// F32Act's).
// The AVX-512 kernels of the K-quants, Q5_0 and Q5_1 read x from qp instead: row i at qp + i * kp,
// kp = k rounded up to 64, each 64 values in their pair order (avx512::PairOrderInt16); and Q6_K's
// from sum16 too (as Int8Act's, of the int16 values). The AVX2 ones read qp with kp = k, each 32
// values in lane order (avx2::LaneOrderInt16).
struct Int16Act {
  const int16_t* q = nullptr;
  const float* scale = nullptr;
  const float* bsum = nullptr;
  int m = 0;
  int64_t k = 0;
  int64_t nb = 0;
  const int16_t* qp = nullptr;
  int64_t kp = 0;
  const float* sum16 = nullptr;
};

// x for the fp32 tile path: its rows in groups of 16 (the last padded with zero rows), each group
// transposed, xt[(g * k + t) * 16 + c] = x[16 g + c][t], so that one column's 16 values are two
// vectors.
struct F32TileAct {
  const float* xt = nullptr;
  int m = 0;
  int64_t k = 0;
  int64_t nb = 0;
};

// x rounded to bf16 for the bf16 path: row i has k values at x + i * k (nb = k / 32 blocks).
struct Bf16Act {
  const uint16_t* x = nullptr;
  int m = 0;
  int64_t k = 0;
  int64_t nb = 0;
};

// Per ISA (scalar is the reference the vector files must match):
//  QuantizeActInt8 / QuantizeActInt16: m rows of k floats (k a multiple of 32) into the buffers
//    of an Int8Act / the q and scale of an Int16Act. The vector versions give bit-identical
//    results to the scalar one.
//  BlockSums: the F32Act block sums of m rows (k a multiple of 32), m * (k / 32) floats.
//  RowsF32 / RowsInt8 / RowsInt16: output rows [j0, j1) of y = x * W^T. F32 kernels take any
//    supported type (scalar: every type DequantizeRow knows); Int8 and Int16 kernels take Q4_0,
//    Q4_1 and Q8_0, and the K-quants, Q5_0 and Q5_1 (int8: the scalar and AVX-512 files only;
//    the dispatcher runs those types in int16 on AVX2). Each returns false if it does not handle
//    w.type. The AVX2 and AVX-512 Int16 kernels give the same bits (exact integer dots, the same
//    fp32 steps).
namespace scalar {
void QuantizeActInt8(const float* x, int m, int64_t ldx, int64_t k, int8_t* q, float* scale,
                     float* sum);
void BlockSums(const float* x, int m, int64_t ldx, int64_t k, float* sums);
bool RowsF32(const QuantMatrix& w, const F32Act& xa, float* y, int64_t ldy, int64_t j0, int64_t j1);
bool RowsInt8(const QuantMatrix& w, const Int8Act& xa, float* y, int64_t ldy, int64_t j0,
              int64_t j1);
void QuantizeActInt16(const float* x, int m, int64_t ldx, int64_t k, int16_t* q, float* scale);
bool RowsInt16(const QuantMatrix& w, const Int16Act& xa, float* y, int64_t ldy, int64_t j0,
               int64_t j1);
}  // namespace scalar
namespace avx2 {
// Row j of w as k fp32 values (the prefill GEMM's weight tiles): K-quants, Q5_0, Q5_1, Q4_0, Q4_1
// and Q8_0 (false for other types); values as DequantizeRow's, up to rounding.
bool DequantRow(const QuantMatrix& w, int64_t j, float* out);
// The fp32 tile path: x transposed into F32TileAct's layout (ceil(m / 16) * 16 * k floats, k a
// multiple of 8), and output rows [j0, j1) for Q4_0, Q4_1 and Q8_0 (false for other types).
void TransposeAct(const float* x, int m, int64_t ldx, int64_t k, float* xt);
bool RowsF32Tile(const QuantMatrix& w, const F32TileAct& xa, float* y, int64_t ldy, int64_t j0,
                 int64_t j1);
void QuantizeActInt8(const float* x, int m, int64_t ldx, int64_t k, int8_t* q, float* scale,
                     float* sum);
void BlockSums(const float* x, int m, int64_t ldx, int64_t k, float* sums);
bool RowsF32(const QuantMatrix& w, const F32Act& xa, float* y, int64_t ldy, int64_t j0, int64_t j1);
bool RowsInt8(const QuantMatrix& w, const Int8Act& xa, float* y, int64_t ldy, int64_t j0,
              int64_t j1);
void QuantizeActInt16(const float* x, int m, int64_t ldx, int64_t k, int16_t* q, float* scale);
bool RowsInt16(const QuantMatrix& w, const Int16Act& xa, float* y, int64_t ldy, int64_t j0,
               int64_t j1);
// Int16Act::qp from q for the K-quant, Q5_0 and Q5_1 kernels: m rows of k values (a multiple of
// 32), each 32 as elements 0-7, 16-23, 8-15, 24-31.
void LaneOrderInt16(const int16_t* q, int m, int64_t k, int16_t* qp);
}  // namespace avx2
namespace avx512 {
// Row j of w as k fp32 values (the prefill GEMM's weight tiles): K-quants, Q5_0, Q5_1, Q4_0, Q4_1
// and Q8_0 (false for other types); values as DequantizeRow's, up to rounding.
bool DequantRow(const QuantMatrix& w, int64_t j, float* out);
// The fp32 tile path: x transposed into F32TileAct's layout (ceil(m / 16) * 16 * k floats, k a
// multiple of 8), and output rows [j0, j1) for Q4_0, Q4_1 and Q8_0 (false for other types).
void TransposeAct(const float* x, int m, int64_t ldx, int64_t k, float* xt);
bool RowsF32Tile(const QuantMatrix& w, const F32TileAct& xa, float* y, int64_t ldy, int64_t j0,
                 int64_t j1);
void QuantizeActInt8(const float* x, int m, int64_t ldx, int64_t k, int8_t* q, float* scale,
                     float* sum);
void BlockSums(const float* x, int m, int64_t ldx, int64_t k, float* sums);
bool RowsF32(const QuantMatrix& w, const F32Act& xa, float* y, int64_t ldy, int64_t j0, int64_t j1);
bool RowsInt8(const QuantMatrix& w, const Int8Act& xa, float* y, int64_t ldy, int64_t j0,
              int64_t j1);
void QuantizeActInt16(const float* x, int m, int64_t ldx, int64_t k, int16_t* q, float* scale);
bool RowsInt16(const QuantMatrix& w, const Int16Act& xa, float* y, int64_t ldy, int64_t j0,
               int64_t j1);
// Int16Act::qp from q: m rows of k values into rows of kp (k rounded up to 64) in pair order.
void PairOrderInt16(const int16_t* q, int m, int64_t k, int16_t* qp, int64_t kp);
// The bf16 path (quant_gemv_bf16_avx512.cc; AVX512_BF16 only): m rows of k floats rounded to
// bf16 (nearest even; subnormals flush to zero), and output rows [j0, j1) for Q4_0, Q4_1 and
// Q8_0 weights (false for other types).
void ConvertActBf16(const float* x, int m, int64_t ldx, int64_t k, uint16_t* out);
bool RowsBf16(const QuantMatrix& w, const Bf16Act& xa, float* y, int64_t ldy, int64_t j0,
              int64_t j1);
// The bf16 path for the K-quants, Q5_0 and Q5_1 (quant_gemv_kquant_avx512.h; AVX512_BF16 only),
// false for other types. The int16 path of this ISA takes them with 512-bit kernels, so its
// results differ from the AVX2 file's in the order of the sums.
bool RowsBf16KQuant(const QuantMatrix& w, const Bf16Act& xa, float* y, int64_t ldy, int64_t j0,
                    int64_t j1);
}  // namespace avx512

// The types whose kernels take x blocks as integers with a scale and a minimum term each: the
// K-quants, Q5_0 and Q5_1 (int16 mode only, GGUF layout).
constexpr bool IsIntBlockType(GgmlType t) {
  return t == GgmlType::kQ4_K || t == GgmlType::kQ5_K || t == GgmlType::kQ6_K ||
         t == GgmlType::kQ5_0 || t == GgmlType::kQ5_1;
}

// Output rows per kernel work unit: ParallelFor chunks are multiples of this so that the
// kernels' row groups are never split between threads.
inline constexpr int64_t kRowQuantum = 8;

// The interleaved layout (QuantMatrix::interleave == kInterleaveRows, G rows a group) of Q4_0,
// Q4_1 and Q8_0 rows. Rows [g, g + G) form one group of G * row_bytes bytes at
// data + g * row_bytes. A group's blocks come in runs of kIlRun (the last run holds what is
// left: cnt = min(kIlRun, nb - kIlRun * c)); run c starts kIlRun * G * block_bytes * c bytes into
// the group and holds, in order:
//   the fp16 scales d, row r's block j at (r * cnt + j) * 2;
//   for Q4_1 the fp16 minima m, likewise;
//   the quants (16 bytes of nibbles, or 32 int8), row r's block j at (j * G + r) * quant bytes.
// A kernel then converts a row's 8 scales with one load, and its quant loads never straddle a
// cache line; the block-by-block interleave it replaced gathered each scale and loaded quants at
// odd offsets (the decode pass's gain: docs/cpu-kernels.md, "Zen 4, 2026-12-02 (night): scales
// ahead of quants in each 8-block run").
inline constexpr int kIlRun = 8;

// Per block: the bytes of its scale d (and Q4_1's minimum m), and of its quants.
constexpr int IlScaleBytes(GgmlType t) { return t == GgmlType::kQ4_1 ? 4 : 2; }
constexpr int IlQuantBytes(GgmlType t) { return t == GgmlType::kQ8_0 ? 32 : 16; }
template <GgmlType T>
constexpr int kIlScaleBytes = IlScaleBytes(T);
template <GgmlType T>
constexpr int kIlQuantBytes = IlQuantBytes(T);

// Run c of a group: its first byte, its block count, where its quants start, and where row r's
// block j (of the run) keeps d, m (Q4_1 only) and its quants.
struct IlRun {
  const uint8_t* base;
  int cnt;
  const uint8_t* quants;
  int quant_bytes;
  const uint8_t* d(int r, int j) const { return base + (r * cnt + j) * 2; }
  const uint8_t* m(int r, int j) const { return base + (kInterleaveRows + r) * cnt * 2 + j * 2; }
  const uint8_t* q(int r, int j) const { return quants + (j * kInterleaveRows + r) * quant_bytes; }
};

inline IlRun IlRunOf(const uint8_t* group, GgmlType t, int64_t nb, int64_t c) {
  constexpr int kG = kInterleaveRows;
  const int sb = IlScaleBytes(t), qb = IlQuantBytes(t);
  const uint8_t* base = group + c * (kIlRun * kG * (sb + qb));
  const int cnt = static_cast<int>(nb - c * kIlRun < kIlRun ? nb - c * kIlRun : kIlRun);
  return {base, cnt, base + kG * cnt * sb, qb};
}

template <GgmlType T>
inline IlRun IlRunAt(const uint8_t* group, int64_t nb, int64_t c) {
  return IlRunOf(group, T, nb, c);
}

}  // namespace tripod::qgemv
