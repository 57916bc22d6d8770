// Where K/V live: the element type, the per-token size, and KvLayerRef, the view of one
// sequence's K/V in one layer that the forward pass writes and the attention kernels read.
// Owners of KV memory (a contiguous cache, the paged block pool) hand these views out.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tripod {

// kQ8_0: each run of 32 elements of a row is an fp16 scale d then 32 int8 q, x = d * q (the
// layout of GGML's Q8_0 blocks, 34 bytes per 32 elements); head_dim must be a multiple of 32.
enum class KvDtype : uint8_t { kF32, kF16, kBF16, kQ8_0 };

constexpr int kKvQ8Block = 32;       // elements per scale
constexpr int kKvQ8BlockBytes = 34;  // fp16 scale + 32 int8

// Bytes of one head_dim row of K (or V) for one slot and head.
constexpr size_t KvRowBytes(KvDtype t, int head_dim) {
  switch (t) {
    case KvDtype::kF32:
      return size_t{4} * head_dim;
    case KvDtype::kQ8_0:
      return size_t{kKvQ8BlockBytes} * (head_dim / kKvQ8Block);
    default:
      return size_t{2} * head_dim;
  }
}

inline const char* KvDtypeName(KvDtype t) {
  switch (t) {
    case KvDtype::kF32:
      return "f32";
    case KvDtype::kF16:
      return "f16";
    case KvDtype::kBF16:
      return "bf16";
    case KvDtype::kQ8_0:
      return "q8_0";
  }
  return "?";
}

struct KvLayout {
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  KvDtype dtype = KvDtype::kF32;
  // 2 (K and V) * layers * kv_heads * head_dim * element size (34/32 bytes for kQ8_0).
  size_t bytes_per_token() const {
    return 2ull * n_layers * n_kv_heads * KvRowBytes(dtype, head_dim);
  }
};

// One sequence's K/V in one layer. Slots (cache rows, in order of insertion) are grouped in
// blocks of block_tokens; slot s lives in block block_ids[s / block_tokens], row s % block_tokens.
// A block of K is [n_kv_heads][block_tokens][head_dim] elements, contiguous; V likewise, so one
// head's rows are contiguous within a block. A cache may also be one block of its capacity.
// RoPE is already applied to stored K; slots need not be positions (trimmed KV).
struct KvLayerRef {
  uint8_t* k_base = nullptr;  // block b of K starts at k_base + b * block_bytes
  uint8_t* v_base = nullptr;
  const int32_t* block_ids = nullptr;
  int n_blocks = 0;
  int block_tokens = 0;
  size_t block_bytes = 0;  // n_kv_heads * block_tokens * KvRowBytes(dtype, head_dim)
  KvDtype dtype = KvDtype::kF32;
  // Attention ignores slots below this one (query i sees [first_visible_slot, n_past + i]): a
  // layer that wrote no K/V for the prompt (POP's "no K/V" control) sees nothing of it.
  int32_t first_visible_slot = 0;

  // Address of K (or V) for slot s, kv head h (head_dim elements follow).
  uint8_t* k_at(int64_t s, int h, int head_dim) const { return at(k_base, s, h, head_dim); }
  uint8_t* v_at(int64_t s, int h, int head_dim) const { return at(v_base, s, h, head_dim); }

 private:
  uint8_t* at(uint8_t* base, int64_t s, int h, int head_dim) const {
    const int64_t b = block_ids[s / block_tokens];
    const int64_t r = s % block_tokens;
    return base + b * block_bytes +
           (static_cast<int64_t>(h) * block_tokens + r) * KvRowBytes(dtype, head_dim);
  }
};

}  // namespace tripod
