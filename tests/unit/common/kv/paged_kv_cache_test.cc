// PagedKvCache: sizing, block tables, prefix-cache hits and misses, LRU eviction, watermark
// admission, imports (untrimmed, trimmed, dtype conversion) and rejection of bad input.
#include "common/kv/paged_kv_cache.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <set>
#include <vector>

#include "common/model/quant_types.h"

namespace tripod {
namespace {

const KvLayout kLayout{2, 2, 4, KvDtype::kF32};  // 2 layers, 2 KV heads, head_dim 4
constexpr int kBt = 4;

std::unique_ptr<PagedKvCache> NewCache(int blocks, double watermark = 0,
                                       KvLayout layout = kLayout) {
  PagedKvOptions o;
  o.layout = layout;
  o.block_tokens = kBt;
  o.budget_bytes = size_t{1} * blocks * kBt * layout.bytes_per_token();
  o.watermark = watermark;
  auto c = PagedKvCache::Create(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

std::vector<int32_t> Ids(int n, int first) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

// A value for (sequence tag, slot, layer, head, K or V, element), exact in fp32.
float Tag(int tag, int slot, int layer, int head, int kv, int e) {
  return static_cast<float>(((tag * 1000 + slot) * 8 + layer * 4 + head * 2 + kv) * 4 + e);
}

void WriteSlots(PagedKvCache& c, int32_t seq, int from, int to, int tag) {
  for (int l = 0; l < kLayout.n_layers; ++l) {
    const KvLayerRef r = c.Layer(seq, l);
    for (int s = from; s < to; ++s) {
      for (int h = 0; h < kLayout.n_kv_heads; ++h) {
        float* k = reinterpret_cast<float*>(r.k_at(s, h, kLayout.head_dim));
        float* v = reinterpret_cast<float*>(r.v_at(s, h, kLayout.head_dim));
        for (int e = 0; e < kLayout.head_dim; ++e) {
          k[e] = Tag(tag, s, l, h, 0, e);
          v[e] = Tag(tag, s, l, h, 1, e);
        }
      }
    }
  }
}

// Slots [from, to) of seq hold tag's values.
bool SlotsHold(PagedKvCache& c, int32_t seq, int from, int to, int tag) {
  for (int l = 0; l < kLayout.n_layers; ++l) {
    const KvLayerRef r = c.Layer(seq, l);
    for (int s = from; s < to; ++s) {
      for (int h = 0; h < kLayout.n_kv_heads; ++h) {
        const float* k = reinterpret_cast<const float*>(r.k_at(s, h, kLayout.head_dim));
        const float* v = reinterpret_cast<const float*>(r.v_at(s, h, kLayout.head_dim));
        for (int e = 0; e < kLayout.head_dim; ++e) {
          if (k[e] != Tag(tag, s, l, h, 0, e) || v[e] != Tag(tag, s, l, h, 1, e)) return false;
        }
      }
    }
  }
  return true;
}

// Runs `ids` into seq as a forward would: room, K/V writes, Append.
void Fill(PagedKvCache& c, int32_t seq, const std::vector<int32_t>& ids, int tag) {
  const int n0 = c.length(seq);
  ASSERT_TRUE(c.EnsureCapacity(seq, n0 + static_cast<int>(ids.size())));
  WriteSlots(c, seq, n0, n0 + static_cast<int>(ids.size()), tag);
  ASSERT_TRUE(c.Append(seq, ids));
  ASSERT_TRUE(c.CheckConsistency().ok()) << c.CheckConsistency();
}

TEST(PagedKvCacheTest, CreateRejectsBadOptions) {
  PagedKvOptions o;
  o.layout = kLayout;
  o.budget_bytes = 1 << 20;
  EXPECT_TRUE(PagedKvCache::Create(o).ok());
  PagedKvOptions bad = o;
  bad.budget_bytes = 16 * kLayout.bytes_per_token() - 1;  // less than one 16-token block
  EXPECT_EQ(PagedKvCache::Create(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = o;
  bad.block_tokens = 0;
  EXPECT_FALSE(PagedKvCache::Create(bad).ok());
  bad = o;
  bad.watermark = 1.5;
  EXPECT_FALSE(PagedKvCache::Create(bad).ok());
  bad = o;
  bad.layout.n_layers = 0;
  EXPECT_FALSE(PagedKvCache::Create(bad).ok());
}

TEST(PagedKvCacheTest, BytesPerTokenHasNoPaddingWaste) {
  // The bundled model's shape in fp16: 2 * 30 * 3 * 64 * 2 bytes per token.
  const KvLayout smol{30, 3, 64, KvDtype::kF16};
  PagedKvOptions o;
  o.layout = smol;
  o.block_tokens = 16;
  o.budget_bytes = (size_t{64} << 20) + 12345;  // not a multiple of a block
  auto c = PagedKvCache::Create(o);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->num_blocks(), static_cast<int>(o.budget_bytes / (16 * 23040)));
  EXPECT_EQ((*c)->kv_bytes_per_token(), 23040u);
  EXPECT_EQ((*c)->bytes(), size_t{1} * (*c)->num_blocks() * 16 * 23040);
  EXPECT_LE((*c)->bytes(), o.budget_bytes);
}

TEST(PagedKvCacheTest, SequencesGetDisjointBlocksAndKeepTheirData) {
  auto c = NewCache(16);
  const int32_t a = c->NewSequence(1), b = c->NewSequence(1);
  EXPECT_NE(a, b);
  Fill(*c, a, Ids(10, 100), 1);
  Fill(*c, b, Ids(7, 500), 2);
  Fill(*c, a, Ids(9, 110), 1);  // grows a after b took blocks
  EXPECT_EQ(c->length(a), 19);
  EXPECT_EQ(c->capacity(a), 20);
  std::set<int32_t> blocks;
  for (int32_t s : {a, b}) {
    const KvLayerRef r0 = c->Layer(s, 0), r1 = c->Layer(s, 1);
    EXPECT_EQ(r0.block_ids, r1.block_ids);  // one table for every layer
    EXPECT_NE(r0.k_base, r1.k_base);        // each layer its own arrays
    EXPECT_NE(r0.k_base, r0.v_base);
    EXPECT_EQ(r0.block_bytes, size_t{2} * kBt * 4 * 4);
    for (int i = 0; i < r0.n_blocks; ++i) blocks.insert(r0.block_ids[i]);
  }
  EXPECT_EQ(blocks.size(), 5u + 2u);
  EXPECT_TRUE(SlotsHold(*c, a, 0, 19, 1));
  EXPECT_TRUE(SlotsHold(*c, b, 0, 7, 2));
  EXPECT_EQ(c->num_free_blocks(), 16 - 7);
  c->FreeSequence(a);
  c->FreeSequence(b);
  EXPECT_TRUE(c->CheckConsistency().ok());
  EXPECT_EQ(c->num_free_blocks(), 16);
}

TEST(PagedKvCacheTest, PrefixHitSharesFullBlocksAndReadsTheSameBytes) {
  auto c = NewCache(16);
  const std::vector<int32_t> prompt = Ids(10, 100);
  const int32_t a = c->NewSequence(7);
  EXPECT_EQ(c->AttachCachedPrefix(a, prompt), 0);  // empty cache
  Fill(*c, a, prompt, 1);
  EXPECT_EQ(c->num_cached_blocks(), 2);  // the two full blocks; the partial one is private

  // Same tokens + plan: both full blocks hit, the same physical blocks, the same bytes.
  std::vector<int32_t> longer = prompt;
  longer.push_back(3);
  const int32_t b = c->NewSequence(7);
  EXPECT_EQ(c->AttachCachedPrefix(b, longer), 8);
  EXPECT_EQ(c->length(b), 8);
  EXPECT_EQ(c->Layer(b, 0).block_ids[0], c->Layer(a, 0).block_ids[0]);
  EXPECT_EQ(c->Layer(b, 1).block_ids[1], c->Layer(a, 1).block_ids[1]);
  EXPECT_TRUE(SlotsHold(*c, b, 0, 8, 1));
  EXPECT_TRUE(c->CheckConsistency().ok());
  // b continues on its own block; a's data is untouched.
  Fill(*c, b, {longer.begin() + 8, longer.end()}, 2);
  EXPECT_NE(c->Layer(b, 0).block_ids[2], c->Layer(a, 0).block_ids[2]);
  EXPECT_TRUE(SlotsHold(*c, a, 0, 10, 1));

  // Never all of the tokens: exactly two blocks' worth reuses 7 slots; the last block is a
  // private copy (its last slot will be written again), holding the cached bytes.
  const int32_t d = c->NewSequence(7);
  EXPECT_EQ(c->AttachCachedPrefix(d, std::vector<int32_t>(prompt.begin(), prompt.begin() + 8)), 7);
  EXPECT_EQ(c->Layer(d, 0).block_ids[0], c->Layer(a, 0).block_ids[0]);
  EXPECT_NE(c->Layer(d, 0).block_ids[1], c->Layer(a, 0).block_ids[1]);
  EXPECT_TRUE(SlotsHold(*c, d, 0, 7, 1));
  EXPECT_TRUE(c->CheckConsistency().ok());
  // Another plan: a miss.
  const int32_t e = c->NewSequence(8);
  EXPECT_EQ(c->AttachCachedPrefix(e, longer), 0);
  // Divergence in block 1: only block 0 hits.
  std::vector<int32_t> diverged = prompt;
  diverged[5] = 9999;
  const int32_t f = c->NewSequence(7);
  EXPECT_EQ(c->AttachCachedPrefix(f, diverged), 4);
  // Divergence in block 0: nothing hits, even though block 1's tokens match.
  diverged = prompt;
  diverged[0] = 9999;
  const int32_t g = c->NewSequence(7);
  EXPECT_EQ(c->AttachCachedPrefix(g, diverged), 0);
  // A non-empty sequence attaches nothing.
  EXPECT_EQ(c->AttachCachedPrefix(a, longer), 0);
  EXPECT_TRUE(c->CheckConsistency().ok());
  for (int32_t s : {a, b, d, e, f, g}) c->FreeSequence(s);
  EXPECT_TRUE(c->CheckConsistency().ok());
  EXPECT_EQ(c->num_free_blocks(), 16);
  EXPECT_EQ(c->num_cached_blocks(), 2);  // still cached after every user left ...
  const int32_t h = c->NewSequence(7);
  EXPECT_EQ(c->AttachCachedPrefix(h, longer), 8);  // ... and reused by a later request
  EXPECT_TRUE(SlotsHold(*c, h, 0, 8, 1));
}

TEST(PagedKvCacheTest, EvictsLeastRecentlyUsedTailFirst) {
  auto c = NewCache(6);
  const std::vector<int32_t> pa = Ids(9, 100), pb = Ids(9, 200);
  const int32_t a = c->NewSequence(1);
  Fill(*c, a, Ids(8, 100), 1);
  const std::vector<int32_t> a_blocks(c->Layer(a, 0).block_ids, c->Layer(a, 0).block_ids + 2);
  c->FreeSequence(a);
  const int32_t b = c->NewSequence(1);
  Fill(*c, b, Ids(8, 200), 2);
  c->FreeSequence(b);
  EXPECT_EQ(c->num_cached_blocks(), 4);
  EXPECT_EQ(c->num_free_blocks(), 6);
  // Three blocks: the two never-used ones, then one eviction: a's tail (the oldest).
  const int32_t x = c->NewSequence(2);
  ASSERT_TRUE(c->EnsureCapacity(x, 12));
  EXPECT_EQ(c->Layer(x, 0).block_ids[2], a_blocks[1]);
  EXPECT_EQ(c->num_cached_blocks(), 3);
  EXPECT_TRUE(c->CheckConsistency().ok());
  const int32_t a2 = c->NewSequence(1);
  EXPECT_EQ(c->AttachCachedPrefix(a2, pa), 4);  // a's head survived
  EXPECT_TRUE(SlotsHold(*c, a2, 0, 4, 1));
  const int32_t b2 = c->NewSequence(1);
  EXPECT_EQ(c->AttachCachedPrefix(b2, pb), 8);
  EXPECT_TRUE(SlotsHold(*c, b2, 0, 8, 2));
  // Everything is referenced now: nothing more to evict.
  EXPECT_EQ(c->num_free_blocks(), 0);
  const int32_t y = c->NewSequence(2);
  EXPECT_FALSE(c->EnsureCapacity(y, 1));
  EXPECT_EQ(c->capacity(y), 0);
  EXPECT_TRUE(c->CheckConsistency().ok());
}

TEST(PagedKvCacheTest, AdmissionKeepsTheWatermarkFree) {
  auto c = NewCache(100, 0.1);
  EXPECT_EQ(c->watermark_blocks(), 10);
  EXPECT_TRUE(c->CanAdmit(90 * kBt));
  EXPECT_FALSE(c->CanAdmit(90 * kBt + 1));
  const int32_t a = c->NewSequence(1);
  ASSERT_TRUE(c->EnsureCapacity(a, 85 * kBt));
  EXPECT_TRUE(c->CanAdmit(5 * kBt));
  EXPECT_FALSE(c->CanAdmit(5 * kBt + 1));
  // A running sequence may grow into the watermark; admission may not.
  EXPECT_TRUE(c->EnsureCapacity(a, 95 * kBt));
  EXPECT_FALSE(c->CanAdmit(1));
  EXPECT_FALSE(c->CanAdmit(0));                   // below the watermark nothing new is admitted
  EXPECT_FALSE(c->EnsureCapacity(a, 101 * kBt));  // beyond the pool: nothing changes
  EXPECT_EQ(c->capacity(a), 95 * kBt);
  EXPECT_EQ(c->num_free_blocks(), 5);
  EXPECT_TRUE(c->CheckConsistency().ok());
}

TEST(PagedKvCacheTest, BadHandlesAndOverflowsChangeNothing) {
  auto c = NewCache(4);
  const int32_t a = c->NewSequence(1);
  ASSERT_TRUE(c->EnsureCapacity(a, 5));
  EXPECT_FALSE(c->Append(a, Ids(9, 0)));  // beyond capacity 8
  EXPECT_EQ(c->length(a), 0);
  EXPECT_TRUE(c->Append(a, Ids(8, 0)));
  EXPECT_FALSE(c->Append(a, Ids(1, 0)));
  EXPECT_FALSE(c->EnsureCapacity(a, -1));
  const int32_t unknown = 12345;
  EXPECT_FALSE(c->HasSequence(unknown));
  EXPECT_EQ(c->Layer(unknown, 0).n_blocks, 0);
  EXPECT_EQ(c->Layer(a, 2).n_blocks, 0);  // no such layer
  EXPECT_EQ(c->length(unknown), 0);
  EXPECT_FALSE(c->EnsureCapacity(unknown, 4));
  EXPECT_FALSE(c->Append(unknown, Ids(1, 0)));
  EXPECT_EQ(c->AttachCachedPrefix(unknown, Ids(9, 0)), 0);
  c->FreeSequence(unknown);
  c->FreeSequence(a);
  c->FreeSequence(a);  // a stale handle: ignored
  EXPECT_EQ(c->Import(a, KvSnapshot{}).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(c->CheckConsistency().ok());
  EXPECT_EQ(c->num_free_blocks(), 4);
}

// A snapshot of n slots with integer values (tag 0 keeps them exact in fp16): slot j of (layer,
// head) holds Tag(tag, pos, ...) where pos is its source position.
KvSnapshot MakeSnapshot(int n, int tag, const std::vector<int32_t>& positions = {}) {
  KvSnapshot s;
  s.layout = kLayout;
  s.n_slots = n;
  s.positions = positions;
  const size_t elems = size_t{1} * kLayout.n_layers * kLayout.n_kv_heads * n * kLayout.head_dim;
  s.k.resize(elems * 4);
  s.v.resize(elems * 4);
  for (int l = 0; l < kLayout.n_layers; ++l) {
    for (int h = 0; h < kLayout.n_kv_heads; ++h) {
      for (int j = 0; j < n; ++j) {
        const int pos =
            positions.empty() ? j : positions[(size_t{1} * l * kLayout.n_kv_heads + h) * n + j];
        float* k = reinterpret_cast<float*>(s.k.data() + s.offset(l, h, j));
        float* v = reinterpret_cast<float*>(s.v.data() + s.offset(l, h, j));
        for (int e = 0; e < kLayout.head_dim; ++e) {
          k[e] = Tag(tag, pos, l, h, 0, e);
          v[e] = Tag(tag, pos, l, h, 1, e);
        }
      }
    }
  }
  return s;
}

TEST(PagedKvCacheTest, ImportUntrimmedPublishesAndConvertsToF16) {
  KvLayout f16 = kLayout;
  f16.dtype = KvDtype::kF16;
  auto c = NewCache(8, 0, f16);
  KvSnapshot s = MakeSnapshot(9, 0);  // tag 0: values below 2048, exact in fp16
  s.token_ids = Ids(9, 100);
  s.plan_key = 5;
  const int32_t a = c->NewSequence(5);
  ASSERT_TRUE(c->Import(a, s).ok());
  EXPECT_EQ(c->length(a), 9);
  EXPECT_EQ(c->capacity(a), 12);
  for (int l = 0; l < 2; ++l) {
    const KvLayerRef r = c->Layer(a, l);
    for (int h = 0; h < 2; ++h) {
      for (int j = 0; j < 9; ++j) {
        uint8_t krow[8];
        r.ReadK(j, h, 4, krow);  // K rows or tiles alike (kv_layout.h)
        for (int e = 0; e < 4; ++e) {
          uint16_t k, v;
          std::memcpy(&k, krow + 2 * e, 2);
          std::memcpy(&v, r.v_at(j, h, 4) + 2 * e, 2);
          ASSERT_EQ(Fp16ToFp32(k), Tag(0, j, l, h, 0, e));
          ASSERT_EQ(Fp16ToFp32(v), Tag(0, j, l, h, 1, e));
        }
      }
    }
  }
  EXPECT_EQ(c->num_cached_blocks(), 2);
  const int32_t b = c->NewSequence(5);
  EXPECT_EQ(c->AttachCachedPrefix(b, Ids(10, 100)), 8);
  const int32_t d = c->NewSequence(6);  // another plan
  EXPECT_EQ(c->AttachCachedPrefix(d, Ids(10, 100)), 0);
  // A snapshot made under another plan than the sequence's is kept but never shared.
  const int32_t e = c->NewSequence(6);
  KvSnapshot other = MakeSnapshot(4, 2);
  other.token_ids = Ids(4, 300);
  other.plan_key = 5;
  ASSERT_TRUE(c->Import(e, other).ok());
  EXPECT_EQ(c->num_cached_blocks(), 2);
  EXPECT_TRUE(c->CheckConsistency().ok());
}

TEST(PagedKvCacheTest, ImportTrimmedSetsLengthToKeptCountAndNeverPublishes) {
  auto c = NewCache(8);
  // 6 kept entries per (layer, head) out of 20 prompt positions, a different subset each.
  const int kept = 6;
  std::vector<int32_t> positions;
  for (int lh = 0; lh < 4; ++lh) {
    for (int j = 0; j < kept; ++j) positions.push_back((lh * 3 + j * 3) % 20);
  }
  KvSnapshot s = MakeSnapshot(kept, 3, positions);
  s.token_ids = {};
  s.plan_key = 1;
  const int32_t a = c->NewSequence(1);
  ASSERT_TRUE(c->Import(a, s).ok());
  EXPECT_EQ(c->length(a), kept);
  for (int l = 0; l < 2; ++l) {
    const KvLayerRef r = c->Layer(a, l);
    for (int h = 0; h < 2; ++h) {
      for (int j = 0; j < kept; ++j) {
        const int pos = positions[(l * 2 + h) * kept + j];
        EXPECT_EQ(reinterpret_cast<const float*>(r.k_at(j, h, 4))[3], Tag(3, pos, l, h, 0, 3));
        EXPECT_EQ(reinterpret_cast<const float*>(r.v_at(j, h, 4))[0], Tag(3, pos, l, h, 1, 0));
      }
    }
  }
  // Decoding continues after the kept entries; nothing is ever published for it.
  Fill(*c, a, Ids(10, 50), 4);
  EXPECT_EQ(c->length(a), kept + 10);
  EXPECT_EQ(c->num_cached_blocks(), 0);
  c->FreeSequence(a);
  EXPECT_EQ(c->num_free_blocks(), 8);
  EXPECT_TRUE(c->CheckConsistency().ok());
}

TEST(PagedKvCacheTest, PerLayerBudgetsSetEachLayersFirstVisibleSlot) {
  // PyramidKV: layer 0 keeps 6 entries, layer 1 keeps 2, at the top of 6 slots (first slot 4).
  auto c = NewCache(8);
  const int slots = 6;
  std::vector<int32_t> positions;
  for (int h = 0; h < 2; ++h) {
    for (int j = 0; j < slots; ++j) positions.push_back(j * 2 + h);
  }
  for (int h = 0; h < 2; ++h) {
    for (int j = 0; j < slots; ++j) positions.push_back(j < 4 ? -1 : 10 + j + h);
  }
  KvSnapshot s = MakeSnapshot(slots, 5, positions);
  s.layer_first = {0, 4};
  s.plan_key = 1;
  EXPECT_EQ(s.kept_bytes(), size_t{2} * (6 + 2) * 2 * 4 * 4);
  const int32_t a = c->NewSequence(1);
  ASSERT_TRUE(c->Import(a, s).ok());
  EXPECT_EQ(c->length(a), slots);
  EXPECT_EQ(c->Layer(a, 0).first_visible_slot, 0);
  EXPECT_EQ(c->Layer(a, 1).first_visible_slot, 4);
  const KvLayerRef r = c->Layer(a, 1);
  for (int h = 0; h < 2; ++h) {
    for (int j = 4; j < slots; ++j) {
      EXPECT_EQ(reinterpret_cast<const float*>(r.k_at(j, h, 4))[1], Tag(5, 10 + j + h, 1, h, 0, 1));
    }
  }
  // Decoding appends at slot 6 in every layer.
  Fill(*c, a, Ids(3, 70), 6);
  EXPECT_EQ(c->length(a), slots + 3);
  EXPECT_EQ(c->Layer(a, 1).first_visible_slot, 4);

  // A padding slot that names a position, or a first slot past the end, is refused.
  KvSnapshot bad = s;
  bad.positions[2 * slots] = 3;
  const int32_t b = c->NewSequence(1);
  EXPECT_EQ(c->Import(b, bad).code(), absl::StatusCode::kInvalidArgument);
  bad = s;
  bad.layer_first = {0, 7};
  EXPECT_EQ(c->Import(b, bad).code(), absl::StatusCode::kInvalidArgument);
  bad = s;
  bad.layer_first = {0};
  EXPECT_EQ(c->Import(b, bad).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c->capacity(b), 0);

  // The same through a transfer's fill.
  const int32_t d = c->NewSequence(1);
  ASSERT_TRUE(c->EnsureCapacity(d, slots + 1));
  const std::vector<int32_t> first = {0, 4};
  EXPECT_FALSE(c->FinishExternalFill(d, slots, {}, 1, std::vector<int32_t>{0}).ok());
  EXPECT_FALSE(c->FinishExternalFill(d, slots, {}, 1, std::vector<int32_t>{0, 9}).ok());
  EXPECT_FALSE(c->FinishExternalFill(d, slots, Ids(slots, 0), 1, first).ok());
  EXPECT_EQ(c->length(d), 0);
  ASSERT_TRUE(c->FinishExternalFill(d, slots, {}, 1, first).ok());
  EXPECT_EQ(c->Layer(d, 1).first_visible_slot, 4);
  EXPECT_EQ(c->num_cached_blocks(), 0);
  c->FreeSequence(a);
  c->FreeSequence(b);
  c->FreeSequence(d);
  EXPECT_EQ(c->num_free_blocks(), 8);
  EXPECT_TRUE(c->CheckConsistency().ok());
}

TEST(PagedKvCacheTest, ImportRejectsBadSnapshotsWithoutAllocating) {
  auto c = NewCache(4);
  const int32_t a = c->NewSequence(1);
  KvSnapshot wrong_shape = MakeSnapshot(4, 1);
  wrong_shape.layout.n_layers = 3;
  EXPECT_EQ(c->Import(a, wrong_shape).code(), absl::StatusCode::kInvalidArgument);
  KvSnapshot short_data = MakeSnapshot(4, 1);
  short_data.k.pop_back();
  EXPECT_EQ(c->Import(a, short_data).code(), absl::StatusCode::kInvalidArgument);
  std::vector<int32_t> dup(4 * 2, 0);  // position 0 twice per (layer, head)
  EXPECT_EQ(c->Import(a, MakeSnapshot(2, 1, dup)).code(), absl::StatusCode::kInvalidArgument);
  std::vector<int32_t> negative = {0, -1, 0, 1, 0, 1, 0, 1};
  EXPECT_EQ(c->Import(a, MakeSnapshot(2, 1, negative)).code(), absl::StatusCode::kInvalidArgument);
  KvSnapshot bad_ids = MakeSnapshot(4, 1);
  bad_ids.token_ids = Ids(3, 0);
  EXPECT_EQ(c->Import(a, bad_ids).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c->Import(a, MakeSnapshot(17, 1)).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(c->capacity(a), 0);
  EXPECT_EQ(c->num_free_blocks(), 4);
  ASSERT_TRUE(c->Import(a, MakeSnapshot(5, 1)).ok());
  EXPECT_EQ(c->Import(a, MakeSnapshot(5, 1)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(c->CheckConsistency().ok());
}

// Reads every slot's K and V rows of seq (row order, whatever the cache's K layout).
std::vector<uint8_t> SlotBytes(KvStore& store, int32_t seq, int n) {
  const KvLayout l = store.layout();
  const size_t row = KvRowBytes(l.dtype, l.head_dim);
  std::vector<uint8_t> out;
  std::vector<uint8_t> k(row);
  for (int layer = 0; layer < l.n_layers; ++layer) {
    const KvLayerRef r = store.Layer(seq, layer);
    for (int h = 0; h < l.n_kv_heads; ++h) {
      for (int j = 0; j < n; ++j) {
        r.ReadK(j, h, l.head_dim, k.data());
        out.insert(out.end(), k.begin(), k.end());
        const uint8_t* v = r.v_at(j, h, l.head_dim);
        out.insert(out.end(), v, v + row);
      }
    }
  }
  return out;
}

// KV written by another party through a view (a transfer), then finished: the same bytes as an
// Import of the same snapshot (f32 -> f16, K in 16-slot tiles), published the same way.
TEST(PagedKvCacheTest, WriteViewAndFinishExternalFillMatchImport) {
  KvLayout f16 = kLayout;
  f16.dtype = KvDtype::kF16;
  PagedKvOptions o;
  o.layout = f16;
  o.block_tokens = 16;  // K tiled (kv_layout.h)
  o.budget_bytes = size_t{1} * 12 * 16 * f16.bytes_per_token();
  auto made = PagedKvCache::Create(o);
  ASSERT_TRUE(made.ok()) << made.status();
  PagedKvCache& c = **made;
  KvSnapshot s = MakeSnapshot(37, 0);  // tag 0: exact in fp16
  s.token_ids = Ids(37, 100);
  s.plan_key = 5;

  const int32_t imported = c.NewSequence(5);
  ASSERT_TRUE(c.Import(imported, s).ok());
  ASSERT_EQ(c.num_cached_blocks(), 2);
  c.FreeSequence(imported);  // its two full blocks stay cached

  const int32_t a = c.NewSequence(5);
  ASSERT_TRUE(c.EnsureCapacity(a, 38));
  std::unique_ptr<KvStore> view = c.WriteView(a);
  ASSERT_NE(view, nullptr);
  EXPECT_EQ(c.WriteView(12345), nullptr);
  EXPECT_NE(view->Layer(a, 0).block_ids, c.Layer(a, 0).block_ids);  // a copy
  EXPECT_EQ(view->Layer(a, 0).n_blocks, 3);
  EXPECT_EQ(view->Layer(a + 1, 0).n_blocks, 0);  // another sequence: nothing
  EXPECT_EQ(view->Layer(a, 2).n_blocks, 0);      // no such layer
  // The cache's maps change meanwhile (a writer never reads them).
  const int32_t other = c.NewSequence(5);
  ASSERT_TRUE(c.EnsureCapacity(other, 16));
  ASSERT_TRUE(WriteSnapshot(s, *view, a).ok());
  EXPECT_EQ(c.length(a), 0);
  EXPECT_EQ(c.num_free_blocks(), 12 - 3 - 1);

  ASSERT_TRUE(c.FinishExternalFill(a, 37, s.token_ids, 5).ok());
  EXPECT_EQ(c.length(a), 37);
  const int32_t ref = c.NewSequence(5);
  ASSERT_TRUE(c.Import(ref, s).ok());
  EXPECT_EQ(SlotBytes(c, a, 37), SlotBytes(c, ref, 37));
  // a republished the same two blocks' content: a prompt sharing them attaches 32 slots.
  const int32_t b = c.NewSequence(5);
  EXPECT_EQ(c.AttachCachedPrefix(b, Ids(40, 100)), 32);
  EXPECT_TRUE(c.CheckConsistency().ok()) << c.CheckConsistency();

  // Refusals change nothing.
  EXPECT_EQ(c.FinishExternalFill(999, 1, {}, 5).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c.FinishExternalFill(a, 3, {}, 5).code(), absl::StatusCode::kFailedPrecondition);
  const int32_t d = c.NewSequence(5);
  ASSERT_TRUE(c.EnsureCapacity(d, 4));
  EXPECT_EQ(c.FinishExternalFill(d, 17, {}, 5).code(), absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> three = Ids(3, 7);
  EXPECT_EQ(c.FinishExternalFill(d, 4, three, 5).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.length(d), 0);
  EXPECT_TRUE(c.CheckConsistency().ok()) << c.CheckConsistency();
  for (int32_t seq : {a, other, ref, b, d}) c.FreeSequence(seq);
  EXPECT_EQ(c.num_free_blocks(), 12);
}

// Another plan's KV, or KV without its tokens (trimmed), fills the sequence but is never shared,
// nor is what decoding appends after it.
TEST(PagedKvCacheTest, FinishExternalFillOfAnotherPlanOrTrimmedNeverPublishes) {
  auto c = NewCache(8);
  const int32_t a = c->NewSequence(5);
  ASSERT_TRUE(c->EnsureCapacity(a, 9));
  std::unique_ptr<KvStore> view = c->WriteView(a);
  ASSERT_TRUE(WriteSnapshot(MakeSnapshot(8, 1), *view, a).ok());
  ASSERT_TRUE(c->FinishExternalFill(a, 8, Ids(8, 100), /*filled_by_plan_key=*/6).ok());
  EXPECT_TRUE(SlotsHold(*c, a, 0, 8, 1));
  Fill(*c, a, Ids(4, 108), 2);
  EXPECT_EQ(c->num_cached_blocks(), 0);
  const int32_t t = c->NewSequence(5);
  ASSERT_TRUE(c->EnsureCapacity(t, 8));
  ASSERT_TRUE(c->FinishExternalFill(t, 8, {}, 5).ok());
  Fill(*c, t, Ids(4, 108), 3);
  EXPECT_EQ(c->num_cached_blocks(), 0);
  EXPECT_TRUE(c->CheckConsistency().ok()) << c->CheckConsistency();
  c->FreeSequence(a);
  c->FreeSequence(t);
  EXPECT_EQ(c->num_free_blocks(), 8);
}

// The choices of one prompt (n > 1): a fork shares the full blocks by reference and copies only
// the last partly filled one; each side then writes its own; the blocks go back once both end.
TEST(PagedKvCacheTest, ForkSharesFullBlocksAndCopiesTheLastPartlyFilledOne) {
  auto c = NewCache(16);
  const int32_t a = c->NewSequence(1);
  Fill(*c, a, Ids(10, 100), 1);  // blocks 0-1 full, block 2 holds 2 of 4 slots
  ASSERT_EQ(c->num_free_blocks(), 16 - 3);
  const int32_t b = c->Fork(a);
  ASSERT_GE(b, 0);
  EXPECT_NE(b, a);
  EXPECT_TRUE(c->CheckConsistency().ok()) << c->CheckConsistency();
  EXPECT_EQ(c->num_free_blocks(), 16 - 4);  // one block copied, not three
  EXPECT_EQ(c->length(b), 10);
  EXPECT_EQ(c->capacity(b), 12);
  const KvLayerRef ra = c->Layer(a, 0), rb = c->Layer(b, 0);
  ASSERT_EQ(rb.n_blocks, 3);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(ra.block_ids[i], rb.block_ids[i]);
    EXPECT_EQ(c->refcount(ra.block_ids[i]), 2);
  }
  EXPECT_NE(ra.block_ids[2], rb.block_ids[2]);
  EXPECT_EQ(c->refcount(ra.block_ids[2]), 1);
  EXPECT_EQ(c->refcount(rb.block_ids[2]), 1);
  EXPECT_TRUE(SlotsHold(*c, b, 0, 10, 1));

  // Each writes its own next slots: neither sees the other's.
  Fill(*c, a, Ids(4, 200), 2);  // a: slots 10-13, a new block past the copy
  Fill(*c, b, Ids(1, 300), 3);  // b: slot 10 in its copy
  EXPECT_TRUE(SlotsHold(*c, a, 0, 10, 1));
  EXPECT_TRUE(SlotsHold(*c, a, 10, 14, 2));
  EXPECT_TRUE(SlotsHold(*c, b, 0, 10, 1));
  EXPECT_TRUE(SlotsHold(*c, b, 10, 11, 3));

  const int32_t shared = ra.block_ids[0];
  c->FreeSequence(a);
  EXPECT_EQ(c->refcount(shared), 1);  // b still holds the prompt's blocks
  EXPECT_TRUE(SlotsHold(*c, b, 0, 10, 1));
  EXPECT_TRUE(c->CheckConsistency().ok()) << c->CheckConsistency();
  c->FreeSequence(b);
  EXPECT_EQ(c->refcount(shared), 0);
  EXPECT_TRUE(c->CheckConsistency().ok()) << c->CheckConsistency();
  EXPECT_EQ(c->num_free_blocks(), 16);
}

TEST(PagedKvCacheTest, ForkOfWholeBlocksCopiesNothingAndFailsCleanly) {
  auto c = NewCache(3);
  const int32_t a = c->NewSequence(1);
  Fill(*c, a, Ids(8, 100), 1);            // two full blocks
  ASSERT_TRUE(c->EnsureCapacity(a, 12));  // a third, empty: not the fork's
  const int32_t b = c->Fork(a);
  ASSERT_GE(b, 0);
  EXPECT_EQ(c->capacity(b), 8);
  EXPECT_EQ(c->num_free_blocks(), 0);
  EXPECT_TRUE(SlotsHold(*c, b, 0, 8, 1));
  EXPECT_TRUE(c->CheckConsistency().ok()) << c->CheckConsistency();

  // A partly filled last block with no free block for its copy: -1, nothing changes.
  const int32_t d = c->NewSequence(1);
  c->FreeSequence(b);
  c->FreeSequence(a);
  Fill(*c, d, Ids(9, 500), 2);  // three blocks, the last with 1 slot
  EXPECT_EQ(c->num_free_blocks(), 0);
  EXPECT_EQ(c->Fork(d), -1);
  EXPECT_EQ(c->num_sequences(), 1);
  EXPECT_EQ(c->Fork(12345), -1);
  EXPECT_TRUE(c->CheckConsistency().ok()) << c->CheckConsistency();
}

}  // namespace
}  // namespace tripod
