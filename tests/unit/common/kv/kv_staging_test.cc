// KV in memory the host cannot touch (a GPU's, stood in for by the guarded CPU backend): the
// guard itself, and every host path that moves K/V rows (snapshots, the chunk codec, the paged
// cache's block copy) giving the same bytes through StagedKvLayer as on host memory.
#include "common/kv/kv_staging.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "common/compute/cpu/cpu_backend.h"
#include "common/compute/guarded_kv_backend.h"
#include "common/compute/session.h"
#include "common/kv/contiguous_kv_cache.h"
#include "common/kv/kv_dtype.h"
#include "common/kv/kv_snapshot.h"
#include "common/kv/paged_kv_cache.h"
#include "common/kv_transfer/kv_chunk_codec.h"

namespace tripod {
namespace {

constexpr int kLayers = 3, kHeads = 2, kHeadDim = 64, kSlots = 45;

KvLayout Layout(KvDtype t) { return KvLayout{kLayers, kHeads, kHeadDim, t}; }

class KvStagingTest : public ::testing::TestWithParam<KvDtype> {
 protected:
  void SetUp() override {
    backend_ = MakeGuardedKvBackend(MakeCpuBackend(CpuBackendOptions{}));
    memory_ = backend_->DeviceKvMemory();
    ASSERT_TRUE(memory_.has_value());
  }

  std::unique_ptr<ContiguousKvCache> Contiguous(bool guarded) {
    auto c =
        ContiguousKvCache::Create(Layout(GetParam()), 1, kSlots, guarded ? memory_ : std::nullopt);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  // A paged cache whose blocks for the next sequence are not in order: sequences taken and freed
  // around it leave the free list scrambled.
  std::unique_ptr<PagedKvCache> Paged(bool guarded, int32_t* seq) {
    PagedKvOptions o;
    o.layout = Layout(GetParam());
    o.block_tokens = 16;
    o.budget_bytes = 12 * o.layout.bytes_per_token() * o.block_tokens;
    o.watermark = 0;
    if (guarded) o.device = memory_;
    auto made = PagedKvCache::Create(o);
    EXPECT_TRUE(made.ok()) << made.status();
    std::unique_ptr<PagedKvCache> c = std::move(*made);
    std::vector<int32_t> others;
    for (int i = 0; i < 5; ++i) {
      others.push_back(c->NewSequence(1));
      EXPECT_TRUE(c->EnsureCapacity(others.back(), 16));
    }
    c->FreeSequence(others[1]);
    c->FreeSequence(others[3]);
    c->FreeSequence(others[0]);
    *seq = c->NewSequence(1);
    EXPECT_TRUE(c->EnsureCapacity(*seq, kSlots));
    return c;
  }

  std::unique_ptr<Backend> backend_;
  std::optional<KvMemory> memory_;
};

// A snapshot of random rows (through a host cache, so that the element type's rounding and K's
// tiles are the cache's own).
KvSnapshot RandomSnapshot(KvDtype t, uint32_t seed) {
  auto host = ContiguousKvCache::Create(Layout(t), 1, kSlots);
  EXPECT_TRUE(host.ok());
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2, 2);
  std::vector<float> x(kHeadDim);
  std::vector<uint8_t> row(KvRowBytes(t, kHeadDim));
  for (int layer = 0; layer < kLayers; ++layer) {
    const KvLayerRef ref = (*host)->Layer(0, layer);
    for (int h = 0; h < kHeads; ++h) {
      for (int s = 0; s < kSlots; ++s) {
        for (float& v : x) v = u(rng);
        ConvertKvRow(reinterpret_cast<uint8_t*>(x.data()), KvDtype::kF32, row.data(), t, kHeadDim);
        ref.WriteK(s, h, kHeadDim, row.data());
        for (float& v : x) v = u(rng);
        ConvertKvRow(reinterpret_cast<uint8_t*>(x.data()), KvDtype::kF32, ref.v_at(s, h, kHeadDim),
                     t, kHeadDim);
      }
    }
  }
  auto s = ExportSnapshot(**host, 0, kSlots);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

TEST_P(KvStagingTest, HostCodeThatTouchesGuardedBytesFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::unique_ptr<ContiguousKvCache> c = Contiguous(true);
  ASSERT_NE(c->memory(), nullptr);
  const KvLayerRef ref = c->Layer(0, 1);
  EXPECT_DEATH(
      {
        volatile uint8_t b = *ref.v_at(3, 1, kHeadDim);
        (void)b;
      },
      "");
  std::vector<uint8_t> row(KvRowBytes(GetParam(), kHeadDim), 1);
  EXPECT_DEATH(ref.WriteK(3, 1, kHeadDim, row.data()), "");
  // Through the stage, the same slot is readable.
  const StagedKvLayer staged(ref, c->memory(), 3, 4, StagedKvLayer::Use::kRead);
  staged.ref().ReadK(3, 1, kHeadDim, row.data());
  EXPECT_TRUE(std::all_of(row.begin(), row.end(), [](uint8_t b) { return b == 0; }));
}

TEST_P(KvStagingTest, SnapshotsRoundTripThroughGuardedMemory) {
  const KvSnapshot s = RandomSnapshot(GetParam(), 11);
  std::unique_ptr<ContiguousKvCache> c = Contiguous(true);
  ASSERT_TRUE(WriteSnapshot(s, *c, 0).ok());
  auto back = ExportSnapshot(*c, 0, kSlots);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->k, s.k);
  EXPECT_EQ(back->v, s.v);
  // A shorter export reads blocks only in part.
  auto part = ExportSnapshot(*c, 0, 21);
  ASSERT_TRUE(part.ok());
  for (int layer = 0; layer < kLayers; ++layer) {
    for (int h = 0; h < kHeads; ++h) {
      EXPECT_TRUE(std::equal(s.k.begin() + s.offset(layer, h, 0),
                             s.k.begin() + s.offset(layer, h, 21),
                             part->k.begin() + part->offset(layer, h, 0)));
    }
  }
}

TEST_P(KvStagingTest, APartialWriteKeepsTheBlocksOtherRows) {
  const KvSnapshot a = RandomSnapshot(GetParam(), 1), b = RandomSnapshot(GetParam(), 2);
  std::unique_ptr<ContiguousKvCache> c = Contiguous(true);
  ASSERT_TRUE(WriteSnapshot(a, *c, 0).ok());
  // Slots [5, 37) of b over a: two edge blocks in part, one whole.
  for (int layer = 0; layer < kLayers; ++layer) {
    StagedKvLayer st(c->Layer(0, layer), c->memory(), 5, 37, StagedKvLayer::Use::kWrite);
    for (int h = 0; h < kHeads; ++h) {
      for (int j = 5; j < 37; ++j) {
        st.ref().WriteK(j, h, kHeadDim, b.k.data() + b.offset(layer, h, j));
        std::copy_n(b.v.data() + b.offset(layer, h, j), b.row_bytes(),
                    st.ref().v_at(j, h, kHeadDim));
      }
    }
    st.Commit();
  }
  auto got = ExportSnapshot(*c, 0, kSlots);
  ASSERT_TRUE(got.ok());
  for (int layer = 0; layer < kLayers; ++layer) {
    for (int h = 0; h < kHeads; ++h) {
      for (int j = 0; j < kSlots; ++j) {
        const KvSnapshot& want = (j >= 5 && j < 37) ? b : a;
        const size_t o = a.offset(layer, h, j);
        ASSERT_TRUE(
            std::equal(want.k.begin() + o, want.k.begin() + o + a.row_bytes(), got->k.begin() + o))
            << "K layer " << layer << " head " << h << " slot " << j;
        ASSERT_TRUE(
            std::equal(want.v.begin() + o, want.v.begin() + o + a.row_bytes(), got->v.begin() + o))
            << "V layer " << layer << " head " << h << " slot " << j;
      }
    }
  }
}

// Both ways a device's memory may offer: rows gathered in one piece (read_rows / write_rows, as
// the CUDA backend's), or plain copies only, through staged blocks.
TEST_P(KvStagingTest, ChunksLeaveAndLandInGuardedMemoryAsOnTheHost) {
  const KvSnapshot s = RandomSnapshot(GetParam(), 5);
  for (const bool rows : {true, false}) {
    SCOPED_TRACE(rows ? "read_rows / write_rows" : "staged blocks");
    const std::optional<KvMemory> full = memory_;
    if (!rows) {
      memory_->read_rows = nullptr;
      memory_->write_rows = nullptr;
    }
    std::unique_ptr<ContiguousKvCache> host = Contiguous(false), dev = Contiguous(true);
    ASSERT_TRUE(WriteSnapshot(s, *host, 0).ok());
    ASSERT_TRUE(WriteSnapshot(s, *dev, 0).ok());
    int32_t seq = -1;
    std::unique_ptr<PagedKvCache> dst = Paged(true, &seq);
    memory_ = full;
    ASSERT_EQ(static_cast<bool>(dst->memory()->read_rows), rows);
    const KvLayerRef table = dst->Layer(seq, 0);
    ASSERT_GE(table.n_blocks, 3);
    EXPECT_NE(table.block_ids[1], table.block_ids[0] + 1);  // not one run: copies per block
    std::unique_ptr<KvStore> view = dst->WriteView(seq);
    ASSERT_NE(view->memory(), nullptr);
    KvChunkReceiver rx(9, dst->layout(), kSlots, kSlots);
    uint32_t n = 0;
    uint64_t bytes = 0;
    for (int b = 0; b < kSlots; b += 7) {  // 7 slots a chunk: blocks written in part, in order
      for (int layer = 0; layer < kLayers; layer += 2) {  // one layer, then two
        const int end = std::min(layer + 2, kLayers);
        v1::KvChunk from_host, from_dev;
        EncodeKvChunk(*host, 0, layer, end, b, std::min(b + 7, kSlots), &from_host);
        EncodeKvChunk(*dev, 0, layer, end, b, std::min(b + 7, kSlots), &from_dev);
        ASSERT_EQ(from_dev.payload(), from_host.payload()) << "layer " << layer << " slot " << b;
        from_dev.set_transfer_id(9);
        from_dev.set_seq(n++);
        bytes += from_dev.payload().size();
        ASSERT_TRUE(rx.Accept(from_dev, *view, seq).ok());
      }
    }
    v1::KvChunk end;
    MakeKvEnd(9, n, n, bytes, &end);
    ASSERT_TRUE(rx.Finish(end).ok());
    ASSERT_TRUE(dst->FinishExternalFill(seq, kSlots, {}, 1).ok());
    auto got = ExportSnapshot(*dst, seq, kSlots);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->k, s.k);
    EXPECT_EQ(got->v, s.v);
  }
}

// A chunk of another element type lands converted, as on the host (f32 on the wire, f16 into an
// f32 cache).
TEST_P(KvStagingTest, ChunksOfAnotherTypeLandConverted) {
  const KvDtype wire = GetParam() == KvDtype::kF32 ? KvDtype::kF16 : KvDtype::kF32;
  const KvSnapshot wide = RandomSnapshot(wire, 6);
  auto src = ContiguousKvCache::Create(Layout(wire), 1, kSlots);
  ASSERT_TRUE(src.ok());
  ASSERT_TRUE(WriteSnapshot(wide, **src, 0).ok());
  std::unique_ptr<ContiguousKvCache> host = Contiguous(false), dev = Contiguous(true);
  KvChunkReceiver rx_host(1, host->layout(), kSlots, kSlots),
      rx_dev(1, dev->layout(), kSlots, kSlots);
  v1::KvChunk c;
  EncodeKvChunk(**src, 0, 0, kLayers, 0, kSlots, &c);
  c.set_transfer_id(1);
  ASSERT_TRUE(rx_host.Accept(c, *host, 0).ok());
  ASSERT_TRUE(rx_dev.Accept(c, *dev, 0).ok());
  auto a = ExportSnapshot(*host, 0, kSlots), b = ExportSnapshot(*dev, 0, kSlots);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->k, b->k);
  EXPECT_EQ(a->v, b->v);
}

TEST_P(KvStagingTest, ACachedPromptOfWholeBlocksIsCopiedOnTheDevice) {
  PagedKvOptions o;
  o.layout = Layout(GetParam());
  o.block_tokens = 16;
  o.budget_bytes = 8 * o.layout.bytes_per_token() * o.block_tokens;
  o.watermark = 0;
  o.device = memory_;
  auto c = PagedKvCache::Create(o);
  ASSERT_TRUE(c.ok()) << c.status();
  KvSnapshot s = RandomSnapshot(GetParam(), 8);
  // 32 tokens: two whole blocks, published.
  const int n = 32;
  KvSnapshot first = s;
  first.n_slots = n;
  first.k.clear();
  first.v.clear();
  for (int layer = 0; layer < kLayers; ++layer) {
    for (int h = 0; h < kHeads; ++h) {
      first.k.insert(first.k.end(), s.k.begin() + s.offset(layer, h, 0),
                     s.k.begin() + s.offset(layer, h, n));
      first.v.insert(first.v.end(), s.v.begin() + s.offset(layer, h, 0),
                     s.v.begin() + s.offset(layer, h, n));
    }
  }
  first.token_ids.resize(n);
  std::iota(first.token_ids.begin(), first.token_ids.end(), 100);
  first.plan_key = 3;
  const int32_t a = (*c)->NewSequence(3);
  ASSERT_TRUE((*c)->Import(a, first).ok());
  ASSERT_EQ((*c)->num_cached_blocks(), 2);
  // The same 32 tokens again: 31 slots reused, the last block a private copy of the cached one.
  const int32_t b = (*c)->NewSequence(3);
  ASSERT_EQ((*c)->AttachCachedPrefix(b, first.token_ids), n - 1);
  EXPECT_NE((*c)->Layer(b, 0).block_ids[1], (*c)->Layer(a, 0).block_ids[1]);
  auto got = ExportSnapshot(**c, b, n - 1);
  auto want = ExportSnapshot(**c, a, n - 1);
  ASSERT_TRUE(got.ok() && want.ok());
  EXPECT_EQ(got->k, want->k);
  EXPECT_EQ(got->v, want->v);
  EXPECT_TRUE((*c)->CheckConsistency().ok());
}

INSTANTIATE_TEST_SUITE_P(Dtypes, KvStagingTest,
                         ::testing::Values(KvDtype::kF32, KvDtype::kF16, KvDtype::kBF16,
                                           KvDtype::kQ8_0),
                         [](const auto& info) { return std::string(KvDtypeName(info.param)); });

// The forward pass on the guarded backend: the kernels reach the KV, and the logits are the
// CPU's, bit for bit (the same kernels on the same bytes).
TEST(GuardedKvBackendTest, ASessionGivesTheCpusLogits) {
  std::vector<std::vector<float>> logits[2];
  const char* names[2] = {"cpu", "cpu-guarded-kv"};
  for (int i = 0; i < 2; ++i) {
    SessionOptions o;
    o.backend = names[i];
    o.precision = "fp32";
    o.kv_cache_dtype = "f16";
    o.context_tokens = 64;
    auto s = Session::Open(o);
    ASSERT_TRUE(s.ok()) << s.status();
    auto l = (*s)->Append(
        {1, 504, 3874, 314, 1167, 282, 4649, 30, 22, 17, 18, 19, 20, 21, 22, 23, 24, 25});
    ASSERT_TRUE(l.ok()) << l.status();
    logits[i].push_back(*l);
    for (int step = 0; step < 3; ++step) {
      const int32_t next =
          static_cast<int32_t>(std::max_element(l->begin(), l->end()) - l->begin());
      l = (*s)->Append({next});
      ASSERT_TRUE(l.ok()) << l.status();
      logits[i].push_back(*l);
    }
  }
  ASSERT_EQ(logits[0].size(), logits[1].size());
  for (size_t i = 0; i < logits[0].size(); ++i) EXPECT_EQ(logits[0][i], logits[1][i]) << i;
}

}  // namespace
}  // namespace tripod
