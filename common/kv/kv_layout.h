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

// K of the 2-byte types is kept in tiles of kKvKTile slots, transposed, wherever a block holds a
// whole number of them (KvKTiled): within a head's run of rows in a block, tile t holds slots
// [16t, 16t + 16) as [head_dim / 2][16 slots][2 elements], i.e. element d of the tile's slot j at
// byte ((d / 2) * 16 + j) * 4 + (d % 2) * 2. A tile takes as many bytes as its 16 rows would.
// The decode kernel then computes 16 slots' scores with the slots across the lanes (no
// horizontal sums), and bf16 dot products take the element pairs as they lie. V, and K of other
// types or other block sizes, stay rows. The same layout on every path, so that caches and
// snapshots move between them as bytes.
constexpr int kKvKTile = 16;

constexpr bool KvKTiled(KvDtype t, int block_tokens, int head_dim) {
  return (t == KvDtype::kF16 || t == KvDtype::kBF16) && block_tokens % kKvKTile == 0 &&
         head_dim % 2 == 0;
}

// One sequence's K/V in one layer. Slots (cache rows, in order of insertion) are grouped in
// blocks of block_tokens; slot s lives in block block_ids[s / block_tokens], row s % block_tokens.
// A block of K is [n_kv_heads][block_tokens][head_dim] elements, contiguous (with K's 16-slot
// tiles transposed where KvKTiled, see above); V likewise, so one head's rows are contiguous
// within a block. A cache may also be one block of its capacity. RoPE is already applied to
// stored K; slots need not be positions (trimmed KV).
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

  bool k_tiled(int head_dim) const { return KvKTiled(dtype, block_tokens, head_dim); }
  // Where slot s's K row (kv head h) would start if rows: for a tiled K, the start of the row's
  // 16-slot tile plus (s % 16) * row bytes, which only ReadK / WriteK and the kernels interpret.
  uint8_t* k_at(int64_t s, int h, int head_dim) const { return at(k_base, s, h, head_dim); }
  // Address of V for slot s, kv head h (head_dim elements follow).
  uint8_t* v_at(int64_t s, int h, int head_dim) const { return at(v_base, s, h, head_dim); }
  // Slot s's K row for kv head h, in row order (KvRowBytes(dtype, head_dim) bytes), out of or
  // into the cache whatever its layout.
  void ReadK(int64_t s, int h, int head_dim, uint8_t* row) const {
    const uint8_t* src = k_at(s, h, head_dim);
    if (!k_tiled(head_dim)) return Copy(src, row, KvRowBytes(dtype, head_dim));
    const uint8_t* tile = src - (s % kKvKTile) * KvRowBytes(dtype, head_dim);
    const int j = static_cast<int>(s % kKvKTile);
    for (int p = 0; p < head_dim / 2; ++p) Copy(tile + (p * kKvKTile + j) * 4, row + p * 4, 4);
  }
  void WriteK(int64_t s, int h, int head_dim, const uint8_t* row) const {
    uint8_t* dst = k_at(s, h, head_dim);
    if (!k_tiled(head_dim)) return Copy(row, dst, KvRowBytes(dtype, head_dim));
    uint8_t* tile = dst - (s % kKvKTile) * KvRowBytes(dtype, head_dim);
    const int j = static_cast<int>(s % kKvKTile);
    for (int p = 0; p < head_dim / 2; ++p) Copy(row + p * 4, tile + (p * kKvKTile + j) * 4, 4);
  }

 private:
  uint8_t* at(uint8_t* base, int64_t s, int h, int head_dim) const {
    const int64_t b = block_ids[s / block_tokens];
    const int64_t r = s % block_tokens;
    return base + b * block_bytes +
           (static_cast<int64_t>(h) * block_tokens + r) * KvRowBytes(dtype, head_dim);
  }
  static void Copy(const uint8_t* from, uint8_t* to, size_t n) { __builtin_memcpy(to, from, n); }
};

}  // namespace tripod
