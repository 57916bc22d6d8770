// GGUF/GGML tensor element types: block layouts, row sizes and dequantisation to fp32.
// Dot-product kernels over these blocks live in common/compute/cpu/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace tripod {

// Values are GGML's type ids as stored in GGUF tensor infos.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kBF16 = 30,
};

struct GgmlTypeInfo {
  GgmlType type;
  std::string_view name;  // "Q4_1"
  int block_elems;        // elements per block (1 for F32/F16/BF16)
  int block_bytes;        // bytes per block
};

// The info for a type id read from a file, or InvalidArgument for an id we do not support.
absl::StatusOr<GgmlTypeInfo> LookupGgmlType(uint32_t id);
const GgmlTypeInfo& TypeInfo(GgmlType type);

// Bytes of a row of n elements; InvalidArgument if n is not a multiple of the block size.
absl::StatusOr<size_t> RowBytes(GgmlType type, int64_t n);

// dst[0..n) = the n elements starting at src (n a multiple of the block size; src holds
// RowBytes(type, n) bytes). Scalar reference code, used for loading and in tests.
void DequantizeRow(GgmlType type, const void* src, float* dst, int64_t n);

// fp16 / bf16 <-> fp32 conversions (round to nearest even).
float Fp16ToFp32(uint16_t h);
uint16_t Fp32ToFp16(float f);
float Bf16ToFp32(uint16_t h);
uint16_t Fp32ToBf16(float f);

// Block structs, laid out exactly as in GGUF files.
struct BlockQ4_0 {
  uint16_t d;      // fp16 scale
  uint8_t qs[16];  // 32 nibbles: element j in low nibble of qs[j], element j+16 in high nibble
};
struct BlockQ4_1 {
  uint16_t d;      // fp16 scale
  uint16_t m;      // fp16 minimum
  uint8_t qs[16];  // as Q4_0; value = d * q + m
};
struct BlockQ5_0 {
  uint16_t d;      // fp16 scale
  uint8_t qh[4];   // bit j: the fifth bit of element j (little-endian 32-bit mask)
  uint8_t qs[16];  // low nibbles as Q4_0; value = d * (q - 16)
};
struct BlockQ5_1 {
  uint16_t d, m;   // fp16 scale and minimum
  uint8_t qh[4];   // as Q5_0
  uint8_t qs[16];  // value = d * q + m
};
struct BlockQ8_0 {
  uint16_t d;     // fp16 scale
  int8_t qs[32];  // value = d * q
};
constexpr int kQkK = 256;  // super-block size of the K-quants
struct BlockQ4_K {
  uint16_t d, dmin;    // fp16 super-block scales
  uint8_t scales[12];  // 8 sub-block scales and mins, 6 bits each, packed
  uint8_t qs[128];
};
struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ5_0) == 22 && sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ4_K) == 144 && sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210);

}  // namespace tripod
