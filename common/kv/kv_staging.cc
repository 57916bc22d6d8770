// StagedKvLayer; see kv_staging.h.
#include "common/kv/kv_staging.h"

#include <cstring>

namespace tripod {

StagedKvLayer::StagedKvLayer(const KvLayerRef& ref, const KvMemory* memory, int64_t slot_begin,
                             int64_t slot_end, Use use)
    : device_(ref), memory_(memory), host_(ref) {
  if (memory_ == nullptr || slot_end <= slot_begin) return;
  const int64_t bt = ref.block_tokens;
  first_block_ = slot_begin / bt;
  const int64_t last = (slot_end - 1) / bt;
  n_staged_ = last - first_block_ + 1;
  // Entries below first_block_ are never read: the range starts at or after that block.
  host_ids_.assign(static_cast<size_t>(last + 1), -1);
  for (int64_t i = 0; i < n_staged_; ++i) host_ids_[first_block_ + i] = static_cast<int32_t>(i);
  k_.resize(n_staged_ * ref.block_bytes);
  v_.resize(n_staged_ * ref.block_bytes);
  host_.k_base = k_.data();
  host_.v_base = v_.data();
  host_.block_ids = host_ids_.data();
  host_.n_blocks = static_cast<int>(host_ids_.size());
  if (use == Use::kRead) {
    Load(0, n_staged_);
    return;
  }
  // Only the edge blocks may hold rows outside the range.
  if (slot_begin % bt != 0) Load(0, 1);
  if (slot_end % bt != 0 && (n_staged_ > 1 || slot_begin % bt == 0)) {
    Load(n_staged_ - 1, n_staged_);
  }
}

template <typename Fn>
void StagedKvLayer::ForRuns(int64_t b0, int64_t b1, Fn fn) const {
  int64_t i = b0;
  while (i < b1) {
    const int32_t id = device_.block_ids[first_block_ + i];
    int64_t n = 1;
    while (i + n < b1 && device_.block_ids[first_block_ + i + n] == id + n) ++n;
    fn(i, id, n);
    i += n;
  }
}

void StagedKvLayer::Load(int64_t b0, int64_t b1) {
  const size_t bb = device_.block_bytes;
  ForRuns(b0, b1, [&](int64_t i, int32_t id, int64_t n) {
    memory_->to_host(k_.data() + i * bb, device_.k_base + size_t{1} * id * bb, n * bb);
    memory_->to_host(v_.data() + i * bb, device_.v_base + size_t{1} * id * bb, n * bb);
  });
}

void StagedKvLayer::Commit() {
  if (memory_ == nullptr) return;
  const size_t bb = device_.block_bytes;
  ForRuns(0, n_staged_, [&](int64_t i, int32_t id, int64_t n) {
    memory_->from_host(device_.k_base + size_t{1} * id * bb, k_.data() + i * bb, n * bb);
    memory_->from_host(device_.v_base + size_t{1} * id * bb, v_.data() + i * bb, n * bb);
  });
}

void ReadKvRows(const KvLayerRef& ref, int n_kv_heads, int head_dim, int slot_begin, int slot_end,
                uint8_t* rows) {
  const size_t row = KvRowBytes(ref.dtype, head_dim);
  for (int h = 0; h < n_kv_heads; ++h) {
    for (int s = slot_begin; s < slot_end; ++s, rows += row) ref.ReadK(s, h, head_dim, rows);
  }
  for (int h = 0; h < n_kv_heads; ++h) {
    for (int s = slot_begin; s < slot_end; ++s, rows += row) {
      std::memcpy(rows, ref.v_at(s, h, head_dim), row);
    }
  }
}

void WriteKvRows(const uint8_t* rows, int n_kv_heads, int head_dim, int slot_begin, int slot_end,
                 const KvLayerRef& ref) {
  const size_t row = KvRowBytes(ref.dtype, head_dim);
  for (int h = 0; h < n_kv_heads; ++h) {
    for (int s = slot_begin; s < slot_end; ++s, rows += row) ref.WriteK(s, h, head_dim, rows);
  }
  for (int h = 0; h < n_kv_heads; ++h) {
    for (int s = slot_begin; s < slot_end; ++s, rows += row) {
      std::memcpy(ref.v_at(s, h, head_dim), rows, row);
    }
  }
}

void ReadLayerRows(KvStore& store, int32_t seq, int layer, int slot_begin, int slot_end,
                   uint8_t* rows) {
  const KvLayout l = store.layout();
  const KvLayerRef ref = store.Layer(seq, layer);
  const KvMemory* mem = store.memory();
  if (mem != nullptr && mem->read_rows) {
    return mem->read_rows(ref, l.n_kv_heads, l.head_dim, slot_begin, slot_end, rows);
  }
  const StagedKvLayer staged(ref, mem, slot_begin, slot_end, StagedKvLayer::Use::kRead);
  ReadKvRows(staged.ref(), l.n_kv_heads, l.head_dim, slot_begin, slot_end, rows);
}

void WriteLayerRows(const uint8_t* rows, KvStore& store, int32_t seq, int layer, int slot_begin,
                    int slot_end) {
  const KvLayout l = store.layout();
  const KvLayerRef ref = store.Layer(seq, layer);
  const KvMemory* mem = store.memory();
  if (mem != nullptr && mem->write_rows) {
    return mem->write_rows(rows, l.n_kv_heads, l.head_dim, slot_begin, slot_end, ref);
  }
  StagedKvLayer staged(ref, mem, slot_begin, slot_end, StagedKvLayer::Use::kWrite);
  WriteKvRows(rows, l.n_kv_heads, l.head_dim, slot_begin, slot_end, staged.ref());
  staged.Commit();
}

}  // namespace tripod
