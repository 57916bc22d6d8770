// Tests for K's tiled layout (kv_layout.h): which caches tile K, where an element lies in a tile,
// ReadK / WriteK as inverses, and snapshots moving rows between a tiled and a row cache.
#include "common/kv/kv_layout.h"

#include <cstring>
#include <random>
#include <vector>

#include "common/kv/contiguous_kv_cache.h"
#include "common/kv/kv_snapshot.h"
#include "gtest/gtest.h"

namespace tripod {
namespace {

TEST(KvLayoutTest, OnlyTwoByteKInWholeTilesIsTiled) {
  EXPECT_TRUE(KvKTiled(KvDtype::kF16, 16, 64));
  EXPECT_TRUE(KvKTiled(KvDtype::kBF16, 32, 128));
  EXPECT_FALSE(KvKTiled(KvDtype::kF32, 16, 64));
  EXPECT_FALSE(KvKTiled(KvDtype::kQ8_0, 16, 64));
  EXPECT_FALSE(KvKTiled(KvDtype::kF16, 8, 64));     // a block holds half a tile
  EXPECT_FALSE(KvKTiled(KvDtype::kF16, 1000, 64));  // 62.5 tiles
  EXPECT_FALSE(KvKTiled(KvDtype::kF16, 16, 7));     // element pairs need an even head_dim
}

// Element d of slot s (kv head h) at the documented byte of its tile, and ReadK gives the row
// back; V stays rows.
TEST(KvLayoutTest, TiledKElementsLieWhereDocumented) {
  const int kHeads = 2, kD = 6, kBt = 32, kBlocks = 3;
  const size_t row = KvRowBytes(KvDtype::kF16, kD), block = kHeads * kBt * row;
  std::vector<uint8_t> k(block * kBlocks, 0), v(block * kBlocks, 0);
  const std::vector<int32_t> ids = {2, 0, 1};
  const KvLayerRef ref{k.data(), v.data(), ids.data(), kBlocks, kBt, block, KvDtype::kF16};
  ASSERT_TRUE(ref.k_tiled(kD));
  auto tag = [](int64_t s, int h, int d) { return static_cast<uint16_t>(s * 100 + h * 10 + d); };
  for (int64_t s = 0; s < kBt * kBlocks; ++s) {
    for (int h = 0; h < kHeads; ++h) {
      uint16_t r[kD];
      for (int d = 0; d < kD; ++d) r[d] = tag(s, h, d);
      ref.WriteK(s, h, kD, reinterpret_cast<const uint8_t*>(r));
    }
  }
  for (int64_t s = 0; s < kBt * kBlocks; ++s) {
    for (int h = 0; h < kHeads; ++h) {
      const int64_t in_block = s % kBt;
      const uint8_t* tile =
          k.data() + ids[s / kBt] * block + h * kBt * row + (in_block / kKvKTile) * kKvKTile * row;
      const int j = static_cast<int>(in_block % kKvKTile);
      uint16_t back[kD];
      ref.ReadK(s, h, kD, reinterpret_cast<uint8_t*>(back));
      for (int d = 0; d < kD; ++d) {
        uint16_t at;
        std::memcpy(&at, tile + ((d / 2) * kKvKTile + j) * 4 + (d % 2) * 2, 2);
        ASSERT_EQ(at, tag(s, h, d)) << "slot " << s << " head " << h << " dim " << d;
        ASSERT_EQ(back[d], tag(s, h, d));
      }
    }
  }
  EXPECT_EQ(v, std::vector<uint8_t>(v.size(), 0));  // WriteK touched K only
}

// A snapshot of a cache with tiled K holds K in row order (what other caches and workers read),
// and written into another tiled cache gives back the same bytes.
TEST(KvLayoutTest, SnapshotsMoveRowsBetweenTiledAndRowCaches) {
  const KvLayout layout{2, 3, 8, KvDtype::kF16};
  auto tiled = ContiguousKvCache::Create(layout, 1, 40);
  ASSERT_TRUE(tiled.ok()) << tiled.status();
  std::mt19937 rng(3);
  const int kSlots = 37;
  for (int l = 0; l < layout.n_layers; ++l) {
    const KvLayerRef r = (*tiled)->Layer(0, l);
    ASSERT_TRUE(r.k_tiled(layout.head_dim));
    for (int s = 0; s < kSlots; ++s) {
      for (int h = 0; h < layout.n_kv_heads; ++h) {
        uint16_t row[8];
        for (uint16_t& x : row) x = static_cast<uint16_t>(rng() & 0x3bff);  // finite halves
        r.WriteK(s, h, layout.head_dim, reinterpret_cast<const uint8_t*>(row));
        std::memcpy(r.v_at(s, h, layout.head_dim), row, sizeof(row));
      }
    }
  }
  auto snap = ExportSnapshot(**tiled, 0, kSlots);
  ASSERT_TRUE(snap.ok()) << snap.status();
  // Rows in the snapshot: K as written, in row order.
  for (int l = 0; l < layout.n_layers; ++l) {
    const KvLayerRef r = (*tiled)->Layer(0, l);
    for (int s = 0; s < kSlots; ++s) {
      for (int h = 0; h < layout.n_kv_heads; ++h) {
        uint8_t row[16];
        r.ReadK(s, h, layout.head_dim, row);
        ASSERT_EQ(0, std::memcmp(snap->k.data() + snap->offset(l, h, s), row, sizeof(row)));
        ASSERT_EQ(0, std::memcmp(snap->v.data() + snap->offset(l, h, s), row, sizeof(row)));
      }
    }
  }
  // Back into a second tiled cache: the same K bytes, tiles and all.
  auto again = ContiguousKvCache::Create(layout, 1, 40);
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(WriteSnapshot(*snap, **again, 0).ok());
  for (int l = 0; l < layout.n_layers; ++l) {
    const KvLayerRef a = (*tiled)->Layer(0, l), b = (*again)->Layer(0, l);
    const size_t used = (kSlots + 15) / 16 * a.block_bytes;
    // Slots past kSlots in the last tile are zero in both (fresh caches).
    EXPECT_EQ(0, std::memcmp(a.k_base, b.k_base, used)) << "layer " << l;
  }
}

}  // namespace
}  // namespace tripod
