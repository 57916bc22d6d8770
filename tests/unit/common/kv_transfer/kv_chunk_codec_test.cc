// The KV-chunk codec: round trips between caches of different element types and layouts, and
// every check of the receiver, each of which must leave the destination untouched.
#include "common/kv_transfer/kv_chunk_codec.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "common/kv/contiguous_kv_cache.h"
#include "common/kv/kv_dtype.h"
#include "xxhash.h"

namespace tripod {
namespace {

constexpr int kLayers = 3, kHeads = 2, kHeadDim = 64, kSlots = 40;

KvLayout Layout(KvDtype t) { return KvLayout{kLayers, kHeads, kHeadDim, t}; }

std::unique_ptr<ContiguousKvCache> Cache(KvDtype t) {
  auto c = ContiguousKvCache::Create(Layout(t), 1, kSlots);
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(*c);
}

// Fills every row of sequence 0 with random values.
void Fill(ContiguousKvCache& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2, 2);
  const KvLayout l = c.layout();
  std::vector<float> x(kHeadDim);
  std::vector<uint8_t> row(KvRowBytes(l.dtype, kHeadDim));
  for (int layer = 0; layer < kLayers; ++layer) {
    const KvLayerRef ref = c.Layer(0, layer);
    for (int h = 0; h < kHeads; ++h) {
      for (int s = 0; s < kSlots; ++s) {
        for (float& v : x) v = u(rng);
        ConvertKvRow(reinterpret_cast<uint8_t*>(x.data()), KvDtype::kF32, row.data(), l.dtype,
                     kHeadDim);
        ref.WriteK(s, h, kHeadDim, row.data());
        for (float& v : x) v = u(rng);
        ConvertKvRow(reinterpret_cast<uint8_t*>(x.data()), KvDtype::kF32, ref.v_at(s, h, kHeadDim),
                     l.dtype, kHeadDim);
      }
    }
  }
}

// Rows of K and V of every layer, head and slot, in fp32.
std::vector<float> Rows(ContiguousKvCache& c) {
  const KvLayout l = c.layout();
  std::vector<float> out;
  std::vector<uint8_t> row(KvRowBytes(l.dtype, kHeadDim));
  std::vector<float> f(kHeadDim);
  for (int layer = 0; layer < kLayers; ++layer) {
    const KvLayerRef ref = c.Layer(0, layer);
    for (int h = 0; h < kHeads; ++h) {
      for (int s = 0; s < kSlots; ++s) {
        ref.ReadK(s, h, kHeadDim, row.data());
        ConvertKvRow(row.data(), l.dtype, reinterpret_cast<uint8_t*>(f.data()), KvDtype::kF32,
                     kHeadDim);
        out.insert(out.end(), f.begin(), f.end());
        ConvertKvRow(ref.v_at(s, h, kHeadDim), l.dtype, reinterpret_cast<uint8_t*>(f.data()),
                     KvDtype::kF32, kHeadDim);
        out.insert(out.end(), f.begin(), f.end());
      }
    }
  }
  return out;
}

// The chunks a sender makes: per layer, slots in runs of `per`.
std::vector<v1::KvChunk> Encode(ContiguousKvCache& src, int per, uint64_t id = 7) {
  std::vector<v1::KvChunk> chunks;
  for (int b = 0; b < kSlots; b += per) {
    for (int layer = 0; layer < kLayers; ++layer) {
      v1::KvChunk c;
      EncodeKvChunk(src, 0, layer, layer + 1, b, std::min(kSlots, b + per), &c);
      c.set_transfer_id(id);
      c.set_seq(static_cast<uint32_t>(chunks.size()));
      chunks.push_back(std::move(c));
    }
  }
  return chunks;
}

v1::KvChunk End(const std::vector<v1::KvChunk>& chunks, uint64_t id = 7) {
  uint64_t bytes = 0;
  for (const auto& c : chunks) bytes += c.payload().size();
  v1::KvChunk end;
  MakeKvEnd(id, static_cast<uint32_t>(chunks.size()), static_cast<uint32_t>(chunks.size()), bytes,
            &end);
  return end;
}

void Rehash(v1::KvChunk& c) { c.set_xxh3(XXH3_64bits(c.payload().data(), c.payload().size())); }

TEST(KvChunkCodec, RoundTripsBetweenTypesAndLayouts) {
  for (KvDtype src_t : {KvDtype::kF16, KvDtype::kF32, KvDtype::kBF16, KvDtype::kQ8_0}) {
    for (KvDtype dst_t : {KvDtype::kF16, KvDtype::kF32}) {
      auto src = Cache(src_t);
      auto dst = Cache(dst_t);
      Fill(*src, 1);
      const std::vector<v1::KvChunk> chunks = Encode(*src, 17);
      KvChunkReceiver rx(7, dst->layout(), kSlots, kSlots);
      for (const auto& c : chunks) ASSERT_TRUE(rx.Accept(c, *dst, 0).ok());
      EXPECT_EQ(rx.slots_done(), kSlots);
      ASSERT_TRUE(rx.Finish(End(chunks)).ok());
      EXPECT_TRUE(rx.complete());
      // The same values through the destination's type: converting the source's rows there
      // directly must give exactly what the transfer gave.
      auto ref = Cache(dst_t);
      std::vector<float> want = Rows(*src);
      std::vector<uint8_t> row(KvRowBytes(dst_t, kHeadDim));
      size_t i = 0;
      for (int layer = 0; layer < kLayers; ++layer) {
        const KvLayerRef r = ref->Layer(0, layer);
        for (int h = 0; h < kHeads; ++h) {
          for (int s = 0; s < kSlots; ++s) {
            ConvertKvRow(reinterpret_cast<uint8_t*>(&want[i]), KvDtype::kF32, row.data(), dst_t,
                         kHeadDim);
            r.WriteK(s, h, kHeadDim, row.data());
            i += kHeadDim;
            ConvertKvRow(reinterpret_cast<uint8_t*>(&want[i]), KvDtype::kF32,
                         r.v_at(s, h, kHeadDim), dst_t, kHeadDim);
            i += kHeadDim;
          }
        }
      }
      EXPECT_EQ(Rows(*dst), Rows(*ref)) << KvDtypeName(src_t) << " -> " << KvDtypeName(dst_t);
      if (src_t == dst_t) {
        EXPECT_EQ(Rows(*dst), Rows(*src)) << KvDtypeName(src_t);
      }
    }
  }
}

TEST(KvChunkCodec, ChunksStayWithinOneMiB) {
  for (KvDtype t : {KvDtype::kF32, KvDtype::kF16, KvDtype::kQ8_0}) {
    KvLayout big{32, 8, 128, t};
    const int n = KvChunkSlots(big);
    EXPECT_LE(KvChunkPayloadBytes(big, 1, n), kMaxKvChunkPayload);
    EXPECT_GT(KvChunkPayloadBytes(big, 1, n + 1), kMaxKvChunkPayload);
  }
  KvLayout huge{1, 64, 8192, KvDtype::kF32};  // one slot alone exceeds 1 MiB: still 1
  EXPECT_EQ(KvChunkSlots(huge), 1);
}

// A fault must be refused with `code`, leave the destination as it was, and fail the transfer.
void ExpectRefused(v1::KvChunk bad, absl::StatusCode code, const char* what, int accept_first = 0) {
  auto src = Cache(KvDtype::kF16);
  auto dst = Cache(KvDtype::kF16);
  Fill(*src, 2);
  Fill(*dst, 3);
  std::vector<v1::KvChunk> chunks = Encode(*src, 16);
  KvChunkReceiver rx(7, dst->layout(), kSlots, kSlots, v1::KV_DTYPE_F16);
  for (int i = 0; i < accept_first; ++i) ASSERT_TRUE(rx.Accept(chunks[i], *dst, 0).ok());
  const std::vector<float> before = Rows(*dst);
  absl::Status st = rx.Accept(bad, *dst, 0);
  EXPECT_EQ(st.code(), code) << what << ": " << st;
  EXPECT_EQ(Rows(*dst), before) << what << ": the refused chunk wrote into the reservation";
  // The transfer is dead: even the right next chunk is refused.
  EXPECT_FALSE(rx.Accept(chunks[accept_first], *dst, 0).ok()) << what;
  EXPECT_FALSE(rx.complete());
}

TEST(KvChunkCodec, RefusesBadChunksBeforeWritingAnything) {
  auto src = Cache(KvDtype::kF16);
  Fill(*src, 2);
  const std::vector<v1::KvChunk> chunks = Encode(*src, 16);

  v1::KvChunk c = chunks[0];
  c.mutable_payload()->at(100) ^= 1;
  ExpectRefused(c, absl::StatusCode::kDataLoss, "corrupted payload");

  ExpectRefused(chunks[2], absl::StatusCode::kInvalidArgument, "gap (chunk 1 missing)", 1);
  c = chunks[0];
  ExpectRefused(c, absl::StatusCode::kInvalidArgument, "repeat of chunk 0", 1);

  c = chunks[0];
  c.set_slot_end(kSlots + 8);
  ExpectRefused(c, absl::StatusCode::kOutOfRange, "past the reservation");

  c = chunks[0];
  c.set_layer_end(kLayers + 1);
  ExpectRefused(c, absl::StatusCode::kOutOfRange, "layer out of range");

  c = chunks[0];
  c.set_dtype(v1::KV_DTYPE_F32);
  ExpectRefused(c, absl::StatusCode::kInvalidArgument, "type not the reservation's");

  c = chunks[0];
  c.set_dtype(static_cast<v1::KvDtype>(9));
  ExpectRefused(c, absl::StatusCode::kInvalidArgument, "unknown type");

  c = chunks[0];
  c.mutable_payload()->resize(c.payload().size() - 2);
  Rehash(c);
  ExpectRefused(c, absl::StatusCode::kInvalidArgument, "short payload");

  c = chunks[0];
  c.set_transfer_id(8);
  ExpectRefused(c, absl::StatusCode::kInvalidArgument, "another transfer");

  c = chunks[3];  // layer 0, slots [16, 32): layer 0's slots [0, 16) never came
  c.set_seq(0);
  ExpectRefused(c, absl::StatusCode::kInvalidArgument, "slot gap within a layer");

  c = chunks[0];
  c.set_end(true);
  ExpectRefused(c, absl::StatusCode::kInvalidArgument, "end message as data");
}

TEST(KvChunkCodec, EndMessageChecksTotalsAndCoverage) {
  auto src = Cache(KvDtype::kF16);
  Fill(*src, 4);
  const std::vector<v1::KvChunk> chunks = Encode(*src, 40);
  {
    auto dst = Cache(KvDtype::kF16);
    KvChunkReceiver rx(7, dst->layout(), kSlots, kSlots);
    for (size_t i = 0; i + 1 < chunks.size(); ++i) ASSERT_TRUE(rx.Accept(chunks[i], *dst, 0).ok());
    std::vector<v1::KvChunk> sent(chunks.begin(), chunks.end() - 1);
    absl::Status st = rx.Finish(End(sent));
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("layer 2 has 0 of its 40 slots"), std::string::npos) << st;
    EXPECT_FALSE(rx.complete());
  }
  {
    auto dst = Cache(KvDtype::kF16);
    KvChunkReceiver rx(7, dst->layout(), kSlots, kSlots);
    for (const auto& c : chunks) ASSERT_TRUE(rx.Accept(c, *dst, 0).ok());
    v1::KvChunk end = End(chunks);
    end.set_total_bytes(end.total_bytes() + 1);
    EXPECT_FALSE(rx.Finish(end).ok());
  }
  {
    // A one-token prompt: no slots, no data chunks, only the end message.
    auto dst = Cache(KvDtype::kF16);
    KvChunkReceiver rx(7, dst->layout(), 0, 0);
    EXPECT_TRUE(rx.Finish(End({})).ok());
    EXPECT_TRUE(rx.complete());
  }
}

// One layer's slots [b, e) of transfer 7, numbered seq, with kept positions p (empty: untrimmed).
v1::KvChunk LayerChunk(ContiguousKvCache& src, int layer, int b, int e,
                       const std::vector<int32_t>& p, uint32_t seq) {
  v1::KvChunk c;
  EncodeKvChunk(src, 0, layer, layer + 1, b, e, &c, p);
  c.set_transfer_id(7);
  c.set_seq(seq);
  return c;
}

TEST(KvChunkCodec, TrimmedPositionsAreChecked) {
  auto src = Cache(KvDtype::kF16);
  Fill(*src, 5);
  // Slot s keeps position 2s (of a 100-position prompt), per layer and head.
  auto positions = [](int layer_begin, int layer_end, int b, int e, int offset) {
    std::vector<int32_t> p;
    for (int l = layer_begin; l < layer_end; ++l) {
      for (int h = 0; h < kHeads; ++h) {
        for (int s = b; s < e; ++s) p.push_back(2 * s + offset);
      }
    }
    return p;
  };
  auto chunk = [&](int layer, int b, int e, std::vector<int32_t> p, uint32_t seq) {
    return LayerChunk(*src, layer, b, e, p, seq);
  };
  {
    auto dst = Cache(KvDtype::kF16);
    KvChunkReceiver rx(7, dst->layout(), kSlots, 100);
    uint32_t seq = 0;
    for (int l = 0; l < kLayers; ++l) {
      ASSERT_TRUE(
          rx.Accept(chunk(l, 0, kSlots, positions(l, l + 1, 0, kSlots, 0), seq++), *dst, 0).ok());
    }
    EXPECT_TRUE(rx.trimmed());
  }
  {
    auto dst = Cache(KvDtype::kF16);
    KvChunkReceiver rx(7, dst->layout(), kSlots, 100);
    ASSERT_TRUE(rx.Accept(chunk(0, 0, 20, positions(0, 1, 0, 20, 0), 0), *dst, 0).ok());
    // Slots [20, 40) of layer 0 name positions 38.. again: 38 was slot 19's.
    absl::Status st = rx.Accept(chunk(0, 20, 40, positions(0, 1, 19, 39, 0), 1), *dst, 0);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("twice"), std::string::npos) << st;
  }
  {
    auto dst = Cache(KvDtype::kF16);
    KvChunkReceiver rx(7, dst->layout(), kSlots, 50);  // positions 2s reach 78 >= 50
    absl::Status st = rx.Accept(chunk(0, 0, kSlots, positions(0, 1, 0, kSlots, 0), 0), *dst, 0);
    EXPECT_EQ(st.code(), absl::StatusCode::kOutOfRange) << st;
  }
  {
    auto dst = Cache(KvDtype::kF16);
    KvChunkReceiver rx(7, dst->layout(), kSlots, 100);
    std::vector<int32_t> p = positions(0, 1, 0, kSlots, 0);
    p.pop_back();
    EXPECT_FALSE(rx.Accept(chunk(0, 0, kSlots, p, 0), *dst, 0).ok());
  }
}

TEST(KvChunkCodec, PerLayerFirstSlotsTakeOnlyEachLayersKeptEntries) {
  // PyramidKV: layer l's entries fill slots [first[l], kSlots); nothing comes below.
  auto src = Cache(KvDtype::kF16);
  Fill(*src, 9);
  const std::vector<int32_t> first = {0, 10, 30};
  auto chunk = [&](int layer, int b, int e, bool trimmed, uint32_t seq) {
    std::vector<int32_t> p;
    for (int h = 0; trimmed && h < kHeads; ++h) {
      for (int s = b; s < e; ++s) p.push_back(s);
    }
    return LayerChunk(*src, layer, b, e, p, seq);
  };
  {
    auto dst = Cache(KvDtype::kF16);
    KvChunkReceiver rx(7, dst->layout(), kSlots, 100, v1::KV_DTYPE_UNSPECIFIED, first);
    std::vector<v1::KvChunk> sent;
    for (int l = 0; l < kLayers; ++l) sent.push_back(chunk(l, first[l], kSlots, true, l));
    for (const v1::KvChunk& c : sent) ASSERT_TRUE(rx.Accept(c, *dst, 0).ok());
    ASSERT_TRUE(rx.Finish(End(sent)).ok());
    EXPECT_TRUE(rx.complete());
    uint64_t bytes = 0;
    for (const v1::KvChunk& c : sent) bytes += c.payload().size();
    EXPECT_EQ(rx.bytes(), bytes);
    EXPECT_EQ(bytes, (40u + 30u + 10u) * kHeads * 2 * KvRowBytes(KvDtype::kF16, kHeadDim));
  }
  {
    // A chunk below a layer's first slot is refused.
    auto dst = Cache(KvDtype::kF16);
    KvChunkReceiver rx(7, dst->layout(), kSlots, 100, v1::KV_DTYPE_UNSPECIFIED, first);
    ASSERT_TRUE(rx.Accept(chunk(0, 0, kSlots, true, 0), *dst, 0).ok());
    absl::Status st = rx.Accept(chunk(1, 0, kSlots, true, 1), *dst, 0);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("expects slot 10"), std::string::npos) << st;
  }
  {
    // Per-layer first slots are for trimmed KV: an untrimmed chunk is refused.
    auto dst = Cache(KvDtype::kF16);
    KvChunkReceiver rx(7, dst->layout(), kSlots, 100, v1::KV_DTYPE_UNSPECIFIED, first);
    absl::Status st = rx.Accept(chunk(0, 0, kSlots, false, 0), *dst, 0);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("not trimmed"), std::string::npos) << st;
  }
  {
    // Without them, the sender's per-layer chunks leave a gap: refused.
    auto dst = Cache(KvDtype::kF16);
    KvChunkReceiver rx(7, dst->layout(), kSlots, 100);
    ASSERT_TRUE(rx.Accept(chunk(0, 0, kSlots, true, 0), *dst, 0).ok());
    absl::Status st = rx.Accept(chunk(1, 10, kSlots, true, 1), *dst, 0);
    EXPECT_NE(st.message().find("a gap"), std::string::npos) << st;
  }
  {
    // A layer that never gets its kept slots fails the end check.
    auto dst = Cache(KvDtype::kF16);
    KvChunkReceiver rx(7, dst->layout(), kSlots, 100, v1::KV_DTYPE_UNSPECIFIED, first);
    std::vector<v1::KvChunk> sent;
    for (int l = 0; l < 2; ++l) sent.push_back(chunk(l, first[l], kSlots, true, l));
    for (const v1::KvChunk& c : sent) ASSERT_TRUE(rx.Accept(c, *dst, 0).ok());
    EXPECT_FALSE(rx.Finish(End(sent)).ok());
  }
}

}  // namespace
}  // namespace tripod
