// The kQ8_0 row codec, KV element-type names and layout checks; see kv_dtype.h.
#include "common/kv/kv_dtype.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/quant_types.h"

namespace tripod {

void QuantizeKvQ8Row(const float* x, int n, uint8_t* dst) {
  for (int b = 0; b < n / kKvQ8Block; ++b, x += kKvQ8Block, dst += kKvQ8BlockBytes) {
    float amax = 0.0f;  // plain compares (std::fmax is a libm call without -ffast-math)
    for (int i = 0; i < kKvQ8Block; ++i) {
      const float a = std::fabs(x[i]);
      amax = a > amax ? a : amax;
    }
    const float d = amax / 127.0f;
    const float inv = d > 0.0f ? 1.0f / d : 0.0f;
    const uint16_t h = Fp32ToFp16(d);
    std::memcpy(dst, &h, 2);
    int8_t* q = reinterpret_cast<int8_t*>(dst + 2);
    for (int i = 0; i < kKvQ8Block; ++i) {
      // Round half away from zero by truncation (|v| <= 127, so v +- 0.5 is exact); NaN, which
      // the model does not make, maps to 0.
      float v = x[i] * inv;
      v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : (v == v ? v : 0.0f);
      q[i] = static_cast<int8_t>(static_cast<int>(v + (v >= 0.0f ? 0.5f : -0.5f)));
    }
  }
}

void DequantizeKvQ8Row(const uint8_t* src, int n, float* x) {
  for (int b = 0; b < n / kKvQ8Block; ++b, x += kKvQ8Block, src += kKvQ8BlockBytes) {
    uint16_t h;
    std::memcpy(&h, src, 2);
    const float d = Fp16ToFp32(h);
    const int8_t* q = reinterpret_cast<const int8_t*>(src + 2);
    for (int i = 0; i < kKvQ8Block; ++i) x[i] = d * static_cast<float>(q[i]);
  }
}

absl::StatusOr<KvDtype> ParseKvDtype(std::string_view name, KvDtype auto_type) {
  if (name.empty() || name == "auto") return auto_type;
  for (KvDtype t : {KvDtype::kF32, KvDtype::kF16, KvDtype::kBF16, KvDtype::kQ8_0}) {
    if (name == KvDtypeName(t)) return t;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown KV cache type '", std::string(name),
                                                 "' (expected auto, f32, f16, bf16 or q8_0)"));
}

absl::Status ValidateKvLayout(const KvLayout& l) {
  if (l.n_layers <= 0 || l.n_kv_heads <= 0 || l.head_dim <= 0) {
    return absl::InvalidArgumentError("KV layout needs layers, KV heads and a head dimension");
  }
  if (static_cast<int>(l.dtype) > static_cast<int>(KvDtype::kQ8_0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV layout: unknown element type ", static_cast<int>(l.dtype)));
  }
  if (l.dtype == KvDtype::kQ8_0 && l.head_dim % kKvQ8Block != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache type q8_0 needs a head dimension that is a multiple of ", kKvQ8Block,
                     "; this model's is ", l.head_dim));
  }
  return absl::OkStatus();
}

namespace {

// Per-element access for the unblocked types (kQ8_0 rows go through its row codec).
float LoadElement(const uint8_t* p, KvDtype t) {
  switch (t) {
    case KvDtype::kF32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case KvDtype::kF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return Fp16ToFp32(h);
    }
    case KvDtype::kBF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return Bf16ToFp32(h);
    }
    case KvDtype::kQ8_0:
      break;
  }
  return 0;
}

void StoreElement(float f, uint8_t* p, KvDtype t) {
  switch (t) {
    case KvDtype::kF32:
      std::memcpy(p, &f, 4);
      return;
    case KvDtype::kF16: {
      const uint16_t h = Fp32ToFp16(f);
      std::memcpy(p, &h, 2);
      return;
    }
    case KvDtype::kBF16: {
      const uint16_t h = Fp32ToBf16(f);
      std::memcpy(p, &h, 2);
      return;
    }
    case KvDtype::kQ8_0:
      return;
  }
}

}  // namespace

void ConvertKvRow(const uint8_t* src, KvDtype st, uint8_t* dst, KvDtype dt, int head_dim) {
  if (st == dt) {
    std::memcpy(dst, src, KvRowBytes(st, head_dim));
    return;
  }
  if (st == KvDtype::kQ8_0 || dt == KvDtype::kQ8_0) {
    // Through fp32; an import converts every row of every layer, so no allocation per row.
    thread_local std::vector<float> row;
    row.resize(head_dim);
    if (st == KvDtype::kQ8_0) {
      DequantizeKvQ8Row(src, head_dim, row.data());
    } else {
      ConvertKvRow(src, st, reinterpret_cast<uint8_t*>(row.data()), KvDtype::kF32, head_dim);
    }
    if (dt == KvDtype::kQ8_0) {
      QuantizeKvQ8Row(row.data(), head_dim, dst);
    } else {
      ConvertKvRow(reinterpret_cast<const uint8_t*>(row.data()), KvDtype::kF32, dst, dt, head_dim);
    }
    return;
  }
  const size_t sb = KvRowBytes(st, 1), db = KvRowBytes(dt, 1);
  for (int i = 0; i < head_dim; ++i) StoreElement(LoadElement(src + i * sb, st), dst + i * db, dt);
}

}  // namespace tripod
