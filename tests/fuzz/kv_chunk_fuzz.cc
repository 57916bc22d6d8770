// libFuzzer target for the decode side's KV-chunk decoder: a stream of chunks built from
// arbitrary bytes (fields picked by the fuzzer; the checksum and payload size made right on
// request, so that the write path runs too) and, now and then, raw protobuf bytes, fed to one
// KvChunkReceiver over a two-sequence cache. The promise checked: a chunk never writes outside
// its reservation (sequence 1 is a canary that must stay as filled), an accepted chunk's ranges
// lie inside the reservation (and above each layer's first slot, when the reservation has them),
// and nothing is accepted after a refusal.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/kv/contiguous_kv_cache.h"
#include "common/kv_transfer/kv_chunk_codec.h"
#include "xxhash.h"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

constexpr int kLayers = 3, kHeads = 2, kHeadDim = 32, kCapacity = 48;

// All bytes of one sequence's K and V, in row order.
std::string Bytes(tripod::ContiguousKvCache& c, int seq) {
  const tripod::KvLayout l = c.layout();
  const size_t row = tripod::KvRowBytes(l.dtype, kHeadDim);
  std::string out;
  std::vector<uint8_t> r(row);
  for (int layer = 0; layer < kLayers; ++layer) {
    const tripod::KvLayerRef ref = c.Layer(seq, layer);
    for (int h = 0; h < kHeads; ++h) {
      for (int s = 0; s < kCapacity; ++s) {
        ref.ReadK(s, h, kHeadDim, r.data());
        out.append(reinterpret_cast<const char*>(r.data()), row);
        out.append(reinterpret_cast<const char*>(ref.v_at(s, h, kHeadDim)), row);
      }
    }
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tripod;
  FuzzedDataProvider in(data, size);
  const KvDtype dst_type = static_cast<KvDtype>(in.ConsumeIntegralInRange<int>(0, 3));
  const int n_slots = in.ConsumeIntegralInRange<int>(0, kCapacity);
  const int n_positions = in.ConsumeIntegralInRange<int>(0, 2 * kCapacity);
  const auto expected = static_cast<v1::KvDtype>(in.ConsumeIntegralInRange<int>(0, 5));
  auto cache =
      ContiguousKvCache::Create(KvLayout{kLayers, kHeads, kHeadDim, dst_type}, 2, kCapacity);
  Check(cache.ok());
  ContiguousKvCache& kv = **cache;
  // Canary: sequence 1 filled with a pattern.
  for (int layer = 0; layer < kLayers; ++layer) {
    const KvLayerRef ref = kv.Layer(1, layer);
    const size_t row = KvRowBytes(dst_type, kHeadDim);
    std::vector<uint8_t> pattern(row, static_cast<uint8_t>(0x5a + layer));
    for (int h = 0; h < kHeads; ++h) {
      for (int s = 0; s < kCapacity; ++s) {
        ref.WriteK(s, h, kHeadDim, pattern.data());
        std::memcpy(ref.v_at(s, h, kHeadDim), pattern.data(), row);
      }
    }
  }
  const std::string canary = Bytes(kv, 1);

  // Now and then per-layer first slots (PyramidKV's reservations): nothing lands below them.
  std::vector<int32_t> layer_first;
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0) {
    for (int l = 0; l < kLayers; ++l) {
      layer_first.push_back(in.ConsumeIntegralInRange<int>(0, n_slots));
    }
  }
  KvChunkReceiver rx(42, kv.layout(), n_slots, n_positions, expected, layer_first);
  bool refused = false;
  uint32_t seq = 0;
  while (in.remaining_bytes() > 0) {
    v1::KvChunk c;
    if (in.ConsumeIntegralInRange<int>(0, 15) == 0) {
      const std::string raw = in.ConsumeRandomLengthString(4096);
      if (!c.ParseFromString(raw)) continue;
    } else {
      c.set_transfer_id(in.ConsumeIntegralInRange<int>(0, 7) == 0 ? 41 : 42);
      c.set_seq(in.ConsumeBool() ? seq : in.ConsumeIntegral<uint32_t>() % 8);
      c.set_end(in.ConsumeIntegralInRange<int>(0, 7) == 0);
      c.set_total_chunks(in.ConsumeIntegralInRange<uint32_t>(0, 16));
      c.set_total_bytes(in.ConsumeIntegralInRange<uint64_t>(0, 1 << 16));
      c.set_layer_begin(in.ConsumeIntegralInRange<int>(-1, kLayers));
      c.set_layer_end(in.ConsumeIntegralInRange<int>(-1, kLayers + 1));
      c.set_slot_begin(in.ConsumeIntegralInRange<int>(-2, kCapacity + 2));
      c.set_slot_end(in.ConsumeIntegralInRange<int>(-2, kCapacity + 2));
      c.set_dtype(static_cast<v1::KvDtype>(in.ConsumeIntegralInRange<int>(0, 5)));
      const int n_pos = in.ConsumeIntegralInRange<int>(0, 3) == 0
                            ? in.ConsumeIntegralInRange<int>(0, kLayers * kHeads * kCapacity)
                            : 0;
      for (int i = 0; i < n_pos; ++i) {
        c.add_kept_positions(in.ConsumeIntegralInRange<int>(-1, 2 * kCapacity));
      }
      // Payload of the size its ranges need, or of any size.
      KvDtype t;
      size_t bytes = in.ConsumeIntegralInRange<size_t>(0, 1 << 14);
      if (in.ConsumeBool() && KvDtypeFromWire(c.dtype(), &t) && c.layer_end() > c.layer_begin() &&
          c.slot_end() > c.slot_begin()) {
        bytes = KvChunkPayloadBytes(KvLayout{kLayers, kHeads, kHeadDim, t},
                                    c.layer_end() - c.layer_begin(), c.slot_end() - c.slot_begin());
      }
      std::string payload = in.ConsumeBytesAsString(bytes);
      payload.resize(bytes, '\x3c');
      c.set_payload(payload);
      c.set_xxh3(in.ConsumeIntegralInRange<int>(0, 7) == 0
                     ? in.ConsumeIntegral<uint64_t>()
                     : XXH3_64bits(c.payload().data(), c.payload().size()));
    }
    absl::Status st = c.end() ? rx.Finish(c) : rx.Accept(c, kv, 0);
    if (st.ok()) {
      Check(!refused);
      if (!c.end()) {
        Check(c.layer_begin() >= 0 && c.layer_end() <= kLayers && c.slot_begin() >= 0 &&
              c.slot_end() <= n_slots);
        for (int l = c.layer_begin(); !layer_first.empty() && l < c.layer_end(); ++l) {
          Check(c.slot_begin() >= layer_first[l]);
        }
        ++seq;
      } else {
        Check(rx.complete() && rx.slots_done() == n_slots);
      }
    } else {
      refused = true;
      Check(!st.message().empty());
    }
    Check(Bytes(kv, 1) == canary);
  }
  return 0;
}
