// StagedKvLayer: host code reads and writes K/V rows through a KvLayerRef (snapshots, the KV-chunk
// codec). When a store keeps its bytes in a device's memory it cannot; this copies the blocks that
// hold a range of slots to the host and hands out a host KvLayerRef with the same slot numbering,
// then copies written blocks back. For a host store it is the store's own ref, with no copy.
#pragma once

#include <cstdint>
#include <vector>

#include "common/kv/kv_layout.h"
#include "common/kv/kv_memory.h"
#include "common/kv/kv_store.h"

namespace tripod {

class StagedKvLayer {
 public:
  enum class Use {
    kRead,   // the blocks come to the host; nothing goes back
    kWrite,  // the caller writes every row of the range; Commit sends the blocks back. Blocks the
             // range covers only in part come to the host first, so their other rows survive.
  };

  // Slots [slot_begin, slot_end) of `ref`, whose bytes live in `memory` (null: host memory).
  StagedKvLayer(const KvLayerRef& ref, const KvMemory* memory, int64_t slot_begin, int64_t slot_end,
                Use use);

  // The view to read or write the range through.
  const KvLayerRef& ref() const { return host_; }
  // kWrite: copies the staged blocks back into the store. Nothing for a host store.
  void Commit();

 private:
  // Calls fn(first staged block, device block id, blocks) for each run of consecutive device ids
  // among staged blocks [b0, b1).
  template <typename Fn>
  void ForRuns(int64_t b0, int64_t b1, Fn fn) const;
  void Load(int64_t b0, int64_t b1);  // staged blocks [b0, b1) from the device

  KvLayerRef device_;
  const KvMemory* memory_ = nullptr;
  KvLayerRef host_;
  int64_t first_block_ = 0;  // the range's first block index in the sequence
  int64_t n_staged_ = 0;
  std::vector<int32_t> host_ids_;  // index first_block_ + i -> host block i
  std::vector<uint8_t> k_, v_;     // n_staged_ blocks each
};

// One layer's slots [slot_begin, slot_end) of `ref` as the KV-chunk payload's rows ([K, V]
// [kv_head][slot], head_dim elements of ref's type, K in row order), read from or written into host
// memory that `ref` addresses directly.
void ReadKvRows(const KvLayerRef& ref, int n_kv_heads, int head_dim, int slot_begin, int slot_end,
                uint8_t* rows);
void WriteKvRows(const uint8_t* rows, int n_kv_heads, int head_dim, int slot_begin, int slot_end,
                 const KvLayerRef& ref);

// The same for a layer of a store wherever its bytes live: host memory directly, a device's
// through its read_rows / write_rows (one gather and one copy), or staged blocks where the memory
// has only plain copies. `rows` is host memory of store.layout().dtype.
void ReadLayerRows(KvStore& store, int32_t seq, int layer, int slot_begin, int slot_end,
                   uint8_t* rows);
void WriteLayerRows(const uint8_t* rows, KvStore& store, int32_t seq, int layer, int slot_begin,
                    int slot_end);

}  // namespace tripod
