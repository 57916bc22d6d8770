// The KV-chunk codec: how a prefill worker cuts a sequence's KV into tripod.v1.KvChunk messages
// (EncodeKvChunk) and how a decode worker checks each one against its reservation before it
// writes a byte into its blocks (KvChunkReceiver). Payload layout (kv_chunk.proto):
// [layer][K, V][kv_head][slot] rows of head_dim elements, K rows in row order whatever the
// sender's cache layout; the receiver writes them through KvLayerRef::WriteK / v_at, converting
// the element type where the two sides differ.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "common/kv/kv_layout.h"
#include "common/kv/kv_store.h"
#include "tripod/v1/kv_chunk.pb.h"

namespace tripod {

inline constexpr size_t kMaxKvChunkPayload = size_t{1} << 20;  // 1 MiB

// Wire <-> KvDtype (the wire's values are KvDtype + 1; 0 is unspecified).
v1::KvDtype KvDtypeToWire(KvDtype t);
// False for unspecified or unknown values.
bool KvDtypeFromWire(int wire, KvDtype* out);

// Payload bytes of a data chunk of n_layers x n_slots.
size_t KvChunkPayloadBytes(const KvLayout& layout, int n_layers, int n_slots);

// Slots per chunk so that one layer's chunk stays within max_payload (at least 1).
int KvChunkSlots(const KvLayout& layout, size_t max_payload = kMaxKvChunkPayload);

// Fills `chunk` (every field but transfer_id and seq, which the sender's stream owns) with
// layers [layer_begin, layer_end) x slots [slot_begin, slot_end) of sequence kv_seq of `store`,
// K rows in row order, and the payload's XXH3-64. `kept_positions`, for trimmed KV only, holds
// the source position of each slot as [layer][kv_head][slot] over the same ranges.
void EncodeKvChunk(KvStore& store, int32_t kv_seq, int layer_begin, int layer_end, int slot_begin,
                   int slot_end, v1::KvChunk* chunk, std::span<const int32_t> kept_positions = {});

// An end message for a stream that sent `chunks` data chunks of `bytes` payload bytes in all.
void MakeKvEnd(uint64_t transfer_id, uint32_t seq, uint32_t chunks, uint64_t bytes,
               v1::KvChunk* end);

// The decode side of one transfer. Every data chunk is checked in full before anything is
// written: its number (no gap, no repeat), its ranges (inside the reservation, each layer's slots
// arriving in order with no gap or overlap), its element type (a valid one, the same for the
// whole transfer, and the reservation's when it named one), the payload's size and checksum, and
// for trimmed KV the kept positions (inside the prompt, distinct per layer and head). A refused
// chunk leaves the reservation's memory as it was; its status says which check failed and where.
// Not thread-safe: one PushKv stream feeds it.
class KvChunkReceiver {
 public:
  // layout: the destination store's (its dtype is what rows are converted to). n_slots: the
  // slots the transfer must fill. n_positions: prompt positions a kept slot may name
  // (n_prompt - 1). expected_dtype: the type the sender announced (unspecified: any).
  // layer_first (PyramidKV, [n_layers], validated by the caller): the first slot each layer's
  // chunks fill; below it nothing comes. Empty: 0 for every layer.
  KvChunkReceiver(uint64_t transfer_id, const KvLayout& layout, int n_slots, int n_positions,
                  v1::KvDtype expected_dtype = v1::KV_DTYPE_UNSPECIFIED,
                  std::vector<int32_t> layer_first = {});

  // Checks a data chunk and writes it into slots of kv_seq in `store` (which holds n_slots). A
  // chunk whose payload came on a KV link (link_id set) passes it as device_rows: the payload's
  // rows in the store's memory, already checked against link_hash, of the store's element type
  // (scattered as they are by the memory's scatter_rows).
  absl::Status Accept(const v1::KvChunk& chunk, KvStore& store, int32_t kv_seq,
                      const uint8_t* device_rows = nullptr);
  // Every check Accept makes before it writes, without writing or booking anything: for a link
  // chunk's header before its payload is taken (link_bytes against the ranges).
  absl::Status CheckHeader(const v1::KvChunk& chunk) const;
  // Checks the end message: its number, the totals against what was accepted, and that every
  // layer's slots all arrived.
  absl::Status Finish(const v1::KvChunk& end);

  bool complete() const { return complete_; }
  uint32_t chunks() const { return next_seq_; }
  uint64_t bytes() const { return bytes_; }
  // Slots that every layer has received so far.
  int slots_done() const;
  bool trimmed() const { return trimmed_ == 1; }

 private:
  absl::Status Check(const v1::KvChunk& c, KvDtype* src_type) const;
  // Books an accepted chunk: its ranges, positions, number and bytes.
  void Record(const v1::KvChunk& c, size_t payload_bytes);

  uint64_t transfer_id_;
  KvLayout layout_;
  int n_slots_;
  int n_positions_;
  v1::KvDtype expected_dtype_;
  uint32_t next_seq_ = 0;
  uint64_t bytes_ = 0;
  std::vector<int> next_slot_;  // per layer: slots [first, next_slot_) have arrived
  bool per_layer_ = false;      // some layer starts above slot 0 (trimmed KV only)
  int trimmed_ = -1;            // -1 until the first chunk says
  // Trimmed only: per (layer, head), which positions are taken.
  std::vector<std::vector<bool>> taken_;
  bool complete_ = false;
  bool failed_ = false;
};

}  // namespace tripod
