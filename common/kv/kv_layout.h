// Where K/V live: the element type, the per-token size, and KvLayerRef, the view of one
// sequence's K/V in one layer that the forward pass writes and the attention kernels read.
// Owners of KV memory (a contiguous cache, the paged block pool) hand these views out.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tripod {

enum class KvDtype : uint8_t { kF32, kF16, kBF16 };

inline size_t KvDtypeBytes(KvDtype t) { return t == KvDtype::kF32 ? 4 : 2; }

struct KvLayout {
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  KvDtype dtype = KvDtype::kF32;
  // 2 (K and V) * layers * kv_heads * head_dim * element size.
  size_t bytes_per_token() const {
    return 2ull * n_layers * n_kv_heads * head_dim * KvDtypeBytes(dtype);
  }
};

// One sequence's K/V in one layer. Slots (cache rows, in order of insertion) are grouped in
// blocks of block_tokens; slot s lives in block block_ids[s / block_tokens], row s % block_tokens.
// A block of K is [n_kv_heads][block_tokens][head_dim] elements, contiguous; V likewise, so one
// head's rows are contiguous within a block. A contiguous cache is one block of its capacity.
// RoPE is already applied to stored K; slots need not be positions (trimmed KV).
struct KvLayerRef {
  uint8_t* k_base = nullptr;  // block b of K starts at k_base + b * block_bytes
  uint8_t* v_base = nullptr;
  const int32_t* block_ids = nullptr;
  int n_blocks = 0;
  int block_tokens = 0;
  size_t block_bytes = 0;  // n_kv_heads * block_tokens * head_dim * element size
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
           ((static_cast<int64_t>(h) * block_tokens + r) * head_dim) * KvDtypeBytes(dtype);
  }
};

}  // namespace tripod
