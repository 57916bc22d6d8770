// StepTape and StepGraphCache: the bookkeeping that lets the CUDA backend replay a decode step's
// graph with new bytes. What a replay relies on is checked here, on any machine: the ops of two
// steps that differ only in data (slots, block tables of another length) are equal word for word,
// the upload image resolves every staged pointer into the right region, and the cache captures a
// step the second time it is seen, replays it after, and releases every graph it drops.
#include "common/compute/step_tape.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

namespace tripod {
namespace {

// A descriptor shaped like the backend's (a pointer field inside staged bytes).
struct Desc {
  int32_t n = 0;
  int32_t slot = 0;
  const int32_t* table = nullptr;
  float* scratch = nullptr;
};

// Records one step as the backend does: ids, a descriptor with a block table of `blocks` ids and
// scratch, and the ops that use them.
void RecordStep(StepTape& t, int slot, int blocks) {
  t.Begin();
  const int32_t ids[3] = {7, 8, slot};
  StepOp embed;
  embed.kind = 1;
  embed.a[0] = t.Stage(ids, sizeof(ids));
  embed.a[1] = 3;
  embed.arena_args = 1;
  t.Push(embed);

  std::vector<int32_t> table(blocks);
  std::iota(table.begin(), table.end(), 100);
  Desc d{1, slot, nullptr, nullptr};
  const uint64_t at = t.Stage(&d, sizeof(d));
  t.PointAt(at + offsetof(Desc, table), StepRegion::kTables, t.StageTable(table));
  t.PointAt(at + offsetof(Desc, scratch), StepRegion::kScratch, t.Scratch(4096));
  StepOp attn;
  attn.kind = 2;
  attn.a[0] = at;
  attn.arena_args = 1;
  t.Push(attn);
}

TEST(StepTapeTest, RegionsAreLaidOutAlignedAndApart) {
  StepTape t;
  t.Begin();
  EXPECT_TRUE(t.recording());
  const char a[5] = "abcd";
  EXPECT_EQ(t.Stage(a, 5), 0u);
  EXPECT_EQ(t.Stage(a, 3), 16u);  // 16-byte aligned
  const int32_t tab[3] = {1, 2, 3};
  EXPECT_EQ(t.StageTable(tab), 0u);
  EXPECT_EQ(t.StageTable(tab), 16u);
  EXPECT_EQ(t.Scratch(10), 0u);
  EXPECT_EQ(t.Scratch(10), 256u);
  const StepTape::Layout l = t.End();
  EXPECT_FALSE(t.recording());
  EXPECT_EQ(l.tables_at, 256u);
  EXPECT_EQ(l.upload_bytes, 256u + 28);
  EXPECT_EQ(l.scratch_at, 512u);
  EXPECT_EQ(l.total_bytes, 512u + 266);
}

TEST(StepTapeTest, TheImageResolvesPointersIntoTheirRegions) {
  StepTape t;
  RecordStep(t, /*slot=*/41, /*blocks=*/5);
  const StepTape::Layout l = t.End();
  const uint64_t base = 0x7f0000000000;
  std::vector<uint8_t> img(l.upload_bytes, 0xee);
  t.WriteImage(base, img.data());

  int32_t ids[3];
  std::memcpy(ids, img.data(), sizeof(ids));
  EXPECT_EQ(ids[2], 41);
  const uint64_t at = t.ops()[1].a[0];
  Desc d;
  std::memcpy(&d, img.data() + at, sizeof(d));
  EXPECT_EQ(d.slot, 41);
  EXPECT_EQ(reinterpret_cast<uint64_t>(d.table), base + l.tables_at);
  EXPECT_EQ(reinterpret_cast<uint64_t>(d.scratch), base + l.scratch_at);
  for (int i = 0; i < 5; ++i) {
    int32_t id;
    std::memcpy(&id, img.data() + l.tables_at + 4 * i, 4);
    EXPECT_EQ(id, 100 + i);
  }
  // The gap between the staged bytes and the tables is zeros, not stale bytes.
  for (size_t i = at + sizeof(Desc); i < l.tables_at; ++i) ASSERT_EQ(img[i], 0) << i;
}

TEST(StepTapeTest, StepsThatDifferInDataHaveTheSameOps) {
  StepTape t;
  RecordStep(t, 41, 5);
  t.End();
  const std::vector<StepOp> first = t.ops();
  const uint64_t first_hash = t.Hash();
  std::vector<uint8_t> img1(t.layout().upload_bytes);
  t.WriteImage(0x1000, img1.data());

  // A later step: another slot, and its table grew past a block.
  RecordStep(t, 57, 40);
  const StepTape::Layout l = t.End();
  EXPECT_EQ(t.ops(), first);
  EXPECT_EQ(t.Hash(), first_hash);
  std::vector<uint8_t> img2(l.upload_bytes);
  t.WriteImage(0x1000, img2.data());
  EXPECT_NE(img1, img2);  // the data moved, the ops did not

  // Another shape (no scratch, other op) is other ops.
  t.Begin();
  StepOp op;
  op.kind = 1;
  t.Push(op);
  t.End();
  EXPECT_NE(t.ops(), first);
  EXPECT_NE(t.Hash(), first_hash);
}

TEST(StepTapeTest, BeginDropsTheLastStep) {
  StepTape t;
  RecordStep(t, 1, 2);
  t.End();
  t.Begin();
  EXPECT_TRUE(t.ops().empty());
  EXPECT_EQ(t.Stage("x", 1), 0u);
  EXPECT_EQ(t.StageTable(std::vector<int32_t>{1}), 0u);
  EXPECT_EQ(t.Scratch(1), 0u);
}

std::vector<StepOp> Ops(uint32_t kind, int n) {
  std::vector<StepOp> ops(n);
  for (StepOp& op : ops) op.kind = kind;
  return ops;
}

struct Destroyed {
  std::vector<void*> execs;
  std::function<void(StepGraphCache::Exec)> fn() {
    return [this](StepGraphCache::Exec e) { execs.push_back(e); };
  }
};

void* Exec(uintptr_t i) { return reinterpret_cast<void*>(i); }

using Action = StepGraphCache::Action;

TEST(StepGraphCacheTest, RunThenCaptureThenReplay) {
  Destroyed d;
  StepGraphCache c(8, d.fn());
  const std::vector<StepOp> a = Ops(1, 4);
  const uint64_t bases[] = {0x100, 0x200};
  EXPECT_EQ(c.Lookup(a, 11, bases).action, Action::kRun);
  EXPECT_EQ(c.Lookup(a, 11, bases).action, Action::kCapture);
  c.Store(Exec(1));
  EXPECT_EQ(c.graphs(), 1u);
  for (int i = 0; i < 3; ++i) {
    const StepGraphCache::Hit h = c.Lookup(a, 11, bases);
    EXPECT_EQ(h.action, Action::kReplay);
    EXPECT_EQ(h.exec, Exec(1));
  }
  EXPECT_TRUE(d.execs.empty());
}

TEST(StepGraphCacheTest, OtherAddressesStartOverAndReleaseTheGraph) {
  Destroyed d;
  StepGraphCache c(8, d.fn());
  const std::vector<StepOp> a = Ops(1, 4);
  const uint64_t bases[] = {0x100, 0x200};
  c.Lookup(a, 11, bases);
  c.Lookup(a, 11, bases);
  c.Store(Exec(1));
  const uint64_t moved[] = {0x100, 0x300};  // the GEMM scratch grew
  EXPECT_EQ(c.Lookup(a, 11, moved).action, Action::kRun);
  EXPECT_EQ(d.execs, std::vector<void*>{Exec(1)});
  EXPECT_EQ(c.Lookup(a, 11, moved).action, Action::kCapture);

  // The same hash over other ops (a collision) is another step too.
  c.Store(Exec(2));
  EXPECT_EQ(c.Lookup(Ops(2, 4), 11, moved).action, Action::kRun);
  EXPECT_EQ(d.execs, (std::vector<void*>{Exec(1), Exec(2)}));
}

TEST(StepGraphCacheTest, AlternatingStepsEachGetTheirGraph) {
  Destroyed d;
  StepGraphCache c(8, d.fn());
  const std::vector<StepOp> a = Ops(1, 4), b = Ops(1, 5);
  const uint64_t bases[] = {1};
  EXPECT_EQ(c.Lookup(a, 1, bases).action, Action::kRun);
  EXPECT_EQ(c.Lookup(b, 2, bases).action, Action::kRun);
  EXPECT_EQ(c.Lookup(a, 1, bases).action, Action::kCapture);
  c.Store(Exec(10));
  EXPECT_EQ(c.Lookup(b, 2, bases).action, Action::kCapture);
  c.Store(Exec(20));
  EXPECT_EQ(c.Lookup(a, 1, bases).exec, Exec(10));
  EXPECT_EQ(c.Lookup(b, 2, bases).exec, Exec(20));
  EXPECT_EQ(c.steps(), 2u);
  EXPECT_EQ(c.graphs(), 2u);
}

TEST(StepGraphCacheTest, TheLeastRecentlyUsedStepMakesRoom) {
  Destroyed d;
  StepGraphCache c(2, d.fn());
  const uint64_t bases[] = {1};
  const std::vector<StepOp> a = Ops(1, 1), b = Ops(2, 1), x = Ops(3, 1);
  c.Lookup(a, 1, bases);
  c.Lookup(a, 1, bases);
  c.Store(Exec(1));
  c.Lookup(b, 2, bases);
  c.Lookup(b, 2, bases);
  c.Store(Exec(2));
  c.Lookup(a, 1, bases);  // a is now the more recent
  EXPECT_EQ(c.Lookup(x, 3, bases).action, Action::kRun);
  EXPECT_EQ(d.execs, std::vector<void*>{Exec(2)});
  EXPECT_EQ(c.steps(), 2u);
  EXPECT_EQ(c.Lookup(a, 1, bases).action, Action::kReplay);
  EXPECT_EQ(c.Lookup(b, 2, bases).action, Action::kRun);  // seen afresh
}

TEST(StepGraphCacheTest, AFailedCaptureIsNotRetried) {
  Destroyed d;
  StepGraphCache c(4, d.fn());
  const uint64_t bases[] = {1};
  const std::vector<StepOp> a = Ops(1, 3);
  c.Lookup(a, 1, bases);
  EXPECT_EQ(c.Lookup(a, 1, bases).action, Action::kCapture);
  c.Store(nullptr);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(c.Lookup(a, 1, bases).action, Action::kRun);
  EXPECT_EQ(c.graphs(), 0u);
}

TEST(StepGraphCacheTest, ClearAndDestructionReleaseEveryGraph) {
  Destroyed d;
  {
    StepGraphCache c(4, d.fn());
    const uint64_t bases[] = {1};
    for (uint32_t k = 1; k <= 3; ++k) {
      c.Lookup(Ops(k, 1), k, bases);
      c.Lookup(Ops(k, 1), k, bases);
      c.Store(Exec(k));
    }
    c.Clear();
    EXPECT_EQ(d.execs.size(), 3u);
    EXPECT_EQ(c.steps(), 0u);
    c.Lookup(Ops(9, 1), 9, bases);
    c.Lookup(Ops(9, 1), 9, bases);
    c.Store(Exec(9));
  }
  EXPECT_EQ(d.execs.size(), 4u);
  EXPECT_EQ(d.execs.back(), Exec(9));
}

}  // namespace
}  // namespace tripod
