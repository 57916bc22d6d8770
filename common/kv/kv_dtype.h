// KV element types beyond the layout: the kQ8_0 row codec, the types' names (flags), and the
// layout check every KV store applies. One quantiser for every ISA: the bits stored for a row do
// not depend on the machine, so KV moves between workers and caches (snapshots, prefix blocks)
// unchanged.
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/kv/kv_layout.h"

namespace tripod {

// n (a multiple of kKvQ8Block) floats into n / 32 blocks of [fp16 d][32 x int8]:
// d = max |x| / 127 of the block, q = x / d rounded to nearest (ties away from zero).
void QuantizeKvQ8Row(const float* x, int n, uint8_t* dst);

// The inverse: x = d * q.
void DequantizeKvQ8Row(const uint8_t* src, int n, float* x);

// Converts one row of n elements between element types (a plain copy when they agree; kQ8_0
// through fp32, so n must then be a multiple of kKvQ8Block).
void ConvertKvRow(const uint8_t* src, KvDtype src_type, uint8_t* dst, KvDtype dst_type, int n);

// "f32", "f16", "bf16" or "q8_0"; "auto" (or empty) is `auto_type`, the precision's default.
absl::StatusOr<KvDtype> ParseKvDtype(std::string_view name, KvDtype auto_type);

// A layout a KV store can hold: positive shape, and head_dim a multiple of 32 for kQ8_0.
absl::Status ValidateKvLayout(const KvLayout& layout);

}  // namespace tripod
