// The KV-chunk codec; see kv_chunk_codec.h.
#include "common/kv_transfer/kv_chunk_codec.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/kv/kv_dtype.h"
#include "common/kv/kv_staging.h"
#include "xxhash.h"

namespace tripod {
namespace {

// Where a chunk is, for error messages.
std::string Where(const v1::KvChunk& c) {
  return absl::StrCat("transfer ", c.transfer_id(), " chunk ", c.seq(), " (layers [",
                      c.layer_begin(), ", ", c.layer_end(), ") slots [", c.slot_begin(), ", ",
                      c.slot_end(), "))");
}

}  // namespace

v1::KvDtype KvDtypeToWire(KvDtype t) { return static_cast<v1::KvDtype>(static_cast<int>(t) + 1); }

bool KvDtypeFromWire(int wire, KvDtype* out) {
  switch (wire) {
    case v1::KV_DTYPE_F32:
      *out = KvDtype::kF32;
      return true;
    case v1::KV_DTYPE_F16:
      *out = KvDtype::kF16;
      return true;
    case v1::KV_DTYPE_BF16:
      *out = KvDtype::kBF16;
      return true;
    case v1::KV_DTYPE_Q8_0:
      *out = KvDtype::kQ8_0;
      return true;
    default:
      return false;
  }
}

size_t KvChunkPayloadBytes(const KvLayout& l, int n_layers, int n_slots) {
  return size_t{2} * n_layers * l.n_kv_heads * n_slots * KvRowBytes(l.dtype, l.head_dim);
}

int KvChunkSlots(const KvLayout& l, size_t max_payload) {
  const size_t per_slot = KvChunkPayloadBytes(l, 1, 1);
  return static_cast<int>(std::max<size_t>(1, max_payload / std::max<size_t>(per_slot, 1)));
}

void EncodeKvChunk(KvStore& store, int32_t kv_seq, int layer_begin, int layer_end, int slot_begin,
                   int slot_end, v1::KvChunk* chunk, std::span<const int32_t> kept_positions) {
  const KvLayout l = store.layout();
  const int n_slots = slot_end - slot_begin;
  chunk->set_layer_begin(layer_begin);
  chunk->set_layer_end(layer_end);
  chunk->set_slot_begin(slot_begin);
  chunk->set_slot_end(slot_end);
  chunk->set_dtype(KvDtypeToWire(l.dtype));
  chunk->clear_kept_positions();
  for (int32_t p : kept_positions) chunk->add_kept_positions(p);
  std::string* payload = chunk->mutable_payload();
  payload->resize(KvChunkPayloadBytes(l, layer_end - layer_begin, n_slots));
  uint8_t* out = reinterpret_cast<uint8_t*>(payload->data());
  const size_t layer_bytes = KvChunkPayloadBytes(l, 1, n_slots);
  for (int layer = layer_begin; layer < layer_end; ++layer, out += layer_bytes) {
    ReadLayerRows(store, kv_seq, layer, slot_begin, slot_end, out);
  }
  chunk->set_xxh3(XXH3_64bits(payload->data(), payload->size()));
  chunk->set_end(false);
}

void MakeKvEnd(uint64_t transfer_id, uint32_t seq, uint32_t chunks, uint64_t bytes,
               v1::KvChunk* end) {
  end->Clear();
  end->set_transfer_id(transfer_id);
  end->set_seq(seq);
  end->set_end(true);
  end->set_total_chunks(chunks);
  end->set_total_bytes(bytes);
}

KvChunkReceiver::KvChunkReceiver(uint64_t transfer_id, const KvLayout& layout, int n_slots,
                                 int n_positions, v1::KvDtype expected_dtype,
                                 std::vector<int32_t> layer_first)
    : transfer_id_(transfer_id),
      layout_(layout),
      n_slots_(n_slots),
      n_positions_(n_positions),
      expected_dtype_(expected_dtype),
      next_slot_(layout.n_layers, 0) {
  if (layer_first.size() == next_slot_.size()) {
    for (size_t l = 0; l < layer_first.size(); ++l) {
      next_slot_[l] = std::clamp(layer_first[l], 0, n_slots);
      per_layer_ = per_layer_ || next_slot_[l] > 0;
    }
  }
}

int KvChunkReceiver::slots_done() const {
  return next_slot_.empty() ? 0 : *std::min_element(next_slot_.begin(), next_slot_.end());
}

absl::Status KvChunkReceiver::Check(const v1::KvChunk& c, KvDtype* src_type) const {
  const std::string where = Where(c);
  if (failed_) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, ": the transfer already failed; nothing more is accepted"));
  }
  if (complete_) {
    return absl::FailedPreconditionError(absl::StrCat(where, ": the transfer is complete"));
  }
  if (c.transfer_id() != transfer_id_) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": belongs to another transfer than ", transfer_id_));
  }
  if (c.seq() != next_seq_) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": out of order: expected chunk ", next_seq_,
                     c.seq() < next_seq_ ? " (a repeat)" : " (a gap: chunks are missing)"));
  }
  if (c.layer_begin() < 0 || c.layer_end() > layout_.n_layers || c.layer_begin() >= c.layer_end()) {
    return absl::OutOfRangeError(
        absl::StrCat(where, ": the layer range is empty or outside [0, ", layout_.n_layers, ")"));
  }
  if (c.slot_begin() < 0 || c.slot_end() > n_slots_ || c.slot_begin() >= c.slot_end()) {
    return absl::OutOfRangeError(absl::StrCat(
        where, ": the slot range is empty or overflows the reservation of ", n_slots_, " slots"));
  }
  for (int l = c.layer_begin(); l < c.layer_end(); ++l) {
    if (c.slot_begin() != next_slot_[l]) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": layer ", l, " expects slot ", next_slot_[l], " next",
                       c.slot_begin() < next_slot_[l] ? " (overlaps what arrived)" : " (a gap)"));
    }
  }
  if (!KvDtypeFromWire(c.dtype(), src_type)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": unknown KV element type ", static_cast<int>(c.dtype())));
  }
  if (expected_dtype_ != v1::KV_DTYPE_UNSPECIFIED && c.dtype() != expected_dtype_) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": element type ", KvDtypeName(*src_type),
                                                   " does not match the reservation's ",
                                                   v1::KvDtype_Name(expected_dtype_)));
  }
  KvLayout src = layout_;
  src.dtype = *src_type;
  if (absl::Status st = ValidateKvLayout(src); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", st.message()));
  }
  const int n_layers = c.layer_end() - c.layer_begin();
  const int n_slots = c.slot_end() - c.slot_begin();
  const size_t want = KvChunkPayloadBytes(src, n_layers, n_slots);
  const bool on_link = c.link_id() != 0;
  const size_t holds = on_link ? c.link_bytes() : c.payload().size();
  if (holds != want) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, on_link ? ": the link payload holds " : ": the payload holds ", holds,
                     " bytes, its ranges need ", want, " of ", KvDtypeName(*src_type)));
  }
  if (on_link && !c.payload().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": a payload both in the message and on a link"));
  }
  // A link payload's checksum (KvLinkHash) was checked by whoever received it.
  if (!on_link && XXH3_64bits(c.payload().data(), c.payload().size()) != c.xxh3()) {
    return absl::DataLossError(absl::StrCat(where, ": checksum mismatch (XXH3-64)"));
  }
  const bool trimmed = c.kept_positions_size() > 0;
  if (trimmed_ >= 0 && trimmed != (trimmed_ == 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": trimmed and untrimmed chunks mixed in one transfer"));
  }
  if (per_layer_ && !trimmed) {
    return absl::InvalidArgumentError(absl::StrCat(
        where,
        ": the reservation has per-layer first slots (trimmed KV) and the chunk is not "
        "trimmed"));
  }
  if (trimmed) {
    const size_t n_pos = size_t{1} * n_layers * layout_.n_kv_heads * n_slots;
    if (static_cast<size_t>(c.kept_positions_size()) != n_pos) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", c.kept_positions_size(),
                                                     " kept positions, the ranges need ", n_pos));
    }
    // Positions in range and distinct per (layer, head), against what arrived before too.
    int i = 0;
    for (int l = c.layer_begin(); l < c.layer_end(); ++l) {
      for (int h = 0; h < layout_.n_kv_heads; ++h) {
        const std::vector<bool>* taken =
            taken_.empty() ? nullptr : &taken_[size_t{1} * l * layout_.n_kv_heads + h];
        std::vector<int32_t> mine(c.kept_positions().begin() + i,
                                  c.kept_positions().begin() + i + n_slots);
        i += n_slots;
        for (int32_t p : mine) {
          if (p < 0 || p >= n_positions_) {
            return absl::OutOfRangeError(absl::StrCat(where, ": layer ", l, " head ", h,
                                                      " keeps position ", p, ", outside [0, ",
                                                      n_positions_, ")"));
          }
          if (taken != nullptr && (*taken)[p]) {
            return absl::InvalidArgumentError(
                absl::StrCat(where, ": layer ", l, " head ", h, " keeps position ", p, " twice"));
          }
        }
        std::sort(mine.begin(), mine.end());
        if (std::adjacent_find(mine.begin(), mine.end()) != mine.end()) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": layer ", l, " head ", h, " keeps a position twice"));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status KvChunkReceiver::CheckHeader(const v1::KvChunk& c) const {
  if (c.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(c), ": an end message where a data chunk was expected"));
  }
  KvDtype src_type;
  return Check(c, &src_type);
}

absl::Status KvChunkReceiver::Accept(const v1::KvChunk& c, KvStore& store, int32_t kv_seq,
                                     const uint8_t* device_rows) {
  if (c.end()) {
    failed_ = true;
    return absl::InvalidArgumentError(
        absl::StrCat(Where(c), ": an end message where a data chunk was expected"));
  }
  if ((c.link_id() != 0) != (device_rows != nullptr)) {
    failed_ = true;
    return absl::InvalidArgumentError(absl::StrCat(
        Where(c), c.link_id() != 0 ? ": a link payload that was not received"
                                   : ": device rows for a chunk that carries its payload"));
  }
  KvDtype src_type;
  if (absl::Status st = Check(c, &src_type); !st.ok()) {
    failed_ = true;
    return st;
  }
  const KvLayout dst = store.layout();
  if (device_rows != nullptr) {
    const KvMemory* mem = store.memory();
    if (src_type != dst.dtype || mem == nullptr || !mem->scatter_rows) {
      failed_ = true;
      return absl::InvalidArgumentError(absl::StrCat(
          Where(c), ": a link payload of ", KvDtypeName(src_type),
          " rows for a store that cannot take them as they are (", KvDtypeName(dst.dtype), ")"));
    }
    const size_t layer_bytes = KvChunkPayloadBytes(dst, 1, c.slot_end() - c.slot_begin());
    for (int l = c.layer_begin(); l < c.layer_end(); ++l, device_rows += layer_bytes) {
      mem->scatter_rows(device_rows, dst.n_kv_heads, dst.head_dim, c.slot_begin(), c.slot_end(),
                        store.Layer(kv_seq, l));
    }
    Record(c, c.link_bytes());
    return absl::OkStatus();
  }
  const size_t src_row = KvRowBytes(src_type, layout_.head_dim);
  const uint8_t* in = reinterpret_cast<const uint8_t*>(c.payload().data());
  const int n = c.slot_end() - c.slot_begin();
  const size_t src_layer = 2 * size_t{1} * layout_.n_kv_heads * n * src_row;
  // Rows in the cache's type: the payload itself, or converted into scratch.
  thread_local std::vector<uint8_t> converted;
  for (int l = c.layer_begin(); l < c.layer_end(); ++l, in += src_layer) {
    const uint8_t* rows = in;
    if (src_type != dst.dtype) {
      const size_t dst_row = KvRowBytes(dst.dtype, dst.head_dim);
      converted.resize(2 * size_t{1} * layout_.n_kv_heads * n * dst_row);
      for (size_t r = 0; r < 2 * size_t{1} * layout_.n_kv_heads * n; ++r) {
        ConvertKvRow(in + r * src_row, src_type, converted.data() + r * dst_row, dst.dtype,
                     dst.head_dim);
      }
      rows = converted.data();
    }
    WriteLayerRows(rows, store, kv_seq, l, c.slot_begin(), c.slot_end());
  }
  Record(c, c.payload().size());
  return absl::OkStatus();
}

// Recorded only once the whole chunk is in.
void KvChunkReceiver::Record(const v1::KvChunk& c, size_t payload_bytes) {
  const bool trimmed = c.kept_positions_size() > 0;
  if (trimmed_ < 0) trimmed_ = trimmed ? 1 : 0;
  if (expected_dtype_ == v1::KV_DTYPE_UNSPECIFIED) expected_dtype_ = c.dtype();
  if (trimmed) {
    if (taken_.empty()) {
      taken_.assign(size_t{1} * layout_.n_layers * layout_.n_kv_heads,
                    std::vector<bool>(static_cast<size_t>(n_positions_), false));
    }
    const int n_slots = c.slot_end() - c.slot_begin();
    int i = 0;
    for (int l = c.layer_begin(); l < c.layer_end(); ++l) {
      for (int h = 0; h < layout_.n_kv_heads; ++h) {
        std::vector<bool>& taken = taken_[size_t{1} * l * layout_.n_kv_heads + h];
        for (int j = 0; j < n_slots; ++j) taken[c.kept_positions(i++)] = true;
      }
    }
  }
  for (int l = c.layer_begin(); l < c.layer_end(); ++l) next_slot_[l] = c.slot_end();
  ++next_seq_;
  bytes_ += payload_bytes;
}

absl::Status KvChunkReceiver::Finish(const v1::KvChunk& end) {
  const std::string where =
      absl::StrCat("transfer ", end.transfer_id(), " end message ", end.seq());
  auto fail = [&](std::string msg) {
    failed_ = true;
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", msg));
  };
  if (failed_) return absl::FailedPreconditionError(absl::StrCat(where, ": the transfer failed"));
  if (!end.end()) return fail("a data chunk where the end message was expected");
  if (end.transfer_id() != transfer_id_) return fail("belongs to another transfer");
  if (end.seq() != next_seq_) {
    return fail(absl::StrCat("numbered ", end.seq(), ", expected ", next_seq_));
  }
  if (end.total_chunks() != next_seq_ || end.total_bytes() != bytes_) {
    return fail(absl::StrCat("the sender counts ", end.total_chunks(), " chunks of ",
                             end.total_bytes(), " bytes, ", next_seq_, " chunks of ", bytes_,
                             " bytes arrived"));
  }
  for (int l = 0; l < layout_.n_layers; ++l) {
    if (next_slot_[l] != n_slots_) {
      return fail(absl::StrCat("layer ", l, " has ", next_slot_[l], " of its ", n_slots_,
                               " slots: chunks are missing"));
    }
  }
  complete_ = true;
  return absl::OkStatus();
}

}  // namespace tripod
