// The continuous-batching scheduler on a tiny paged cache (no model): chunked prefill within the
// token budget, decode tokens first, preemption of the newest sequence when blocks run out (and
// recompute after), imported sequences as the last victims, a clear failure for a sequence
// that cannot fit even alone, and waiting (not failing) while KV reservations hold the blocks.
#include "decode_node/batch_scheduler.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

namespace tripod {
namespace {

constexpr int kBlockTokens = 4;

std::unique_ptr<PagedKvCache> TinyCache(int n_blocks) {
  PagedKvOptions o;
  o.layout = {1, 1, 4, KvDtype::kF32};  // 32 bytes per token
  o.block_tokens = kBlockTokens;
  o.budget_bytes = size_t{1} * n_blocks * kBlockTokens * o.layout.bytes_per_token();
  o.watermark = 0;
  auto c = PagedKvCache::Create(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(c).value();
}

SchedSeq MakeSeq(int64_t id, int n_prompt) {
  SchedSeq s;
  s.id = id;
  for (int i = 0; i < n_prompt; ++i) s.tokens.push_back(static_cast<int32_t>(1000 * id + i));
  s.n_prompt = n_prompt;
  return s;
}

// One step as the engine runs it: schedule, "forward", commit, sample a token for each
// sequence that reached its end.
StepSchedule RunStep(const SchedulerConfig& cfg, SchedulerQueues& q, PagedKvCache& cache) {
  StepSchedule s = ScheduleStep(cfg, q, cache);
  CommitStep(s, cache);
  for (const ScheduledChunk& c : s.chunks) {
    if (c.wants_logits) c.seq->tokens.push_back(7);
  }
  EXPECT_TRUE(cache.CheckConsistency().ok()) << cache.CheckConsistency();
  return s;
}

TEST(BatchSchedulerTest, ChunksAPromptWithinTheBudgetAndDecodesFirst) {
  auto cache = TinyCache(32);
  SchedulerConfig cfg;
  cfg.max_tokens_per_step = 4;
  SchedulerQueues q;
  SchedSeq a = MakeSeq(1, 3), b = MakeSeq(2, 10);
  q.waiting = {&a, &b};

  StepSchedule s = RunStep(cfg, q, *cache);  // a's prompt (3) + 1 token of b
  ASSERT_EQ(s.chunks.size(), 2u);
  EXPECT_EQ(s.chunks[0].n_tokens, 3);
  EXPECT_TRUE(s.chunks[0].wants_logits);
  EXPECT_EQ(s.chunks[1].n_tokens, 1);
  EXPECT_FALSE(s.chunks[1].wants_logits);

  s = RunStep(cfg, q, *cache);  // a decodes one, b gets 3 more
  ASSERT_EQ(s.chunks.size(), 2u);
  EXPECT_EQ(s.chunks[0].seq, &a);
  EXPECT_EQ(s.chunks[0].n_tokens, 1);
  EXPECT_EQ(s.chunks[1].n_tokens, 3);
  s = RunStep(cfg, q, *cache);
  s = RunStep(cfg, q, *cache);  // b: 1 + 3 + 3 + 3 = 10, done
  EXPECT_TRUE(s.chunks[1].wants_logits);
  EXPECT_EQ(b.n_computed, 10);
  EXPECT_EQ(cache->length(b.kv_seq), 10);
  EXPECT_EQ(a.n_computed, a.kv_len);

  ReleaseSequence(&a, q, *cache);
  ReleaseSequence(&b, q, *cache);
  EXPECT_EQ(cache->num_free_blocks(), cache->num_blocks());
}

TEST(BatchSchedulerTest, PreemptsTheNewestAndRecomputesItLater) {
  auto cache = TinyCache(6);  // 24 slots
  SchedulerConfig cfg;
  SchedulerQueues q;
  SchedSeq a = MakeSeq(1, 8), b = MakeSeq(2, 8);
  q.waiting = {&a, &b};
  RunStep(cfg, q, *cache);  // both admitted: 4 blocks
  ASSERT_EQ(q.running.size(), 2u);
  int preempted = 0;
  for (int step = 0; step < 12 && preempted == 0; ++step) {
    StepSchedule s = RunStep(cfg, q, *cache);
    preempted += static_cast<int>(s.preempted.size());
    if (!s.preempted.empty()) {
      EXPECT_EQ(s.preempted[0], &b);  // the newest
      EXPECT_EQ(q.waiting.front(), &b);
      EXPECT_EQ(b.kv_seq, -1);
      EXPECT_EQ(b.n_computed, 0);
    }
  }
  ASSERT_EQ(preempted, 1);
  // a finishes; b comes back and recomputes everything it had (prompt + generated).
  const size_t b_tokens = b.tokens.size();
  ReleaseSequence(&a, q, *cache);
  StepSchedule s = RunStep(cfg, q, *cache);
  ASSERT_EQ(s.chunks.size(), 1u);
  EXPECT_EQ(s.chunks[0].seq, &b);
  EXPECT_EQ(s.chunks[0].n_tokens + s.attached_slots, static_cast<int>(b_tokens));
  EXPECT_EQ(s.queried_tokens, static_cast<int>(b_tokens));  // its whole list, looked up again
  EXPECT_TRUE(s.chunks[0].wants_logits);
  EXPECT_EQ(b.preemptions, 1);
  ReleaseSequence(&b, q, *cache);
  EXPECT_EQ(cache->num_free_blocks(), cache->num_blocks());
}

TEST(BatchSchedulerTest, ImportedSequencesAreTheLastVictims) {
  auto cache = TinyCache(6);
  SchedulerConfig cfg;
  SchedulerQueues q;
  KvSnapshot snap;
  snap.layout = cache->layout();
  snap.n_slots = 7;
  snap.k.assign(size_t{7} * snap.row_bytes(), 0);
  snap.v = snap.k;
  SchedSeq a = MakeSeq(1, 8), imp = MakeSeq(2, 8);
  imp.snapshot = &snap;
  q.waiting = {&a, &imp};  // the import is the newest
  StepSchedule s = RunStep(cfg, q, *cache);
  ASSERT_EQ(s.admitted.size(), 2u);
  EXPECT_EQ(imp.kv_len, 8);  // 7 imported slots + the last prompt token
  EXPECT_EQ(imp.n_computed, 8);
  int preempted = 0;
  for (int step = 0; step < 12 && preempted == 0; ++step) {
    s = RunStep(cfg, q, *cache);
    preempted += static_cast<int>(s.preempted.size());
    if (!s.preempted.empty()) {
      EXPECT_EQ(s.preempted[0], &a);  // not the newer import
    }
  }
  ASSERT_EQ(preempted, 1);
  ReleaseSequence(&imp, q, *cache);
  // Re-admitted from scratch; a re-imported sequence would restart at its snapshot.
  s = RunStep(cfg, q, *cache);
  EXPECT_EQ(s.admitted.size(), 1u);
  ReleaseSequence(&a, q, *cache);
  EXPECT_EQ(cache->num_free_blocks(), cache->num_blocks());
}

TEST(BatchSchedulerTest, FailsASequenceThatCannotFitAlone) {
  auto cache = TinyCache(4);  // 16 slots
  SchedulerConfig cfg;
  cfg.max_tokens_per_step = 8;
  SchedulerQueues q;
  SchedSeq big = MakeSeq(1, 40), small = MakeSeq(2, 3);
  q.waiting = {&big, &small};
  bool failed = false;
  for (int step = 0; step < 6 && !failed; ++step) {
    StepSchedule s = RunStep(cfg, q, *cache);
    for (auto& [seq, st] : s.failed) {
      EXPECT_EQ(seq, &big);
      EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
      failed = true;
    }
  }
  ASSERT_TRUE(failed);
  StepSchedule s = RunStep(cfg, q, *cache);  // the next one runs
  ASSERT_EQ(s.chunks.size(), 1u);
  EXPECT_EQ(s.chunks[0].seq, &small);
  ReleaseSequence(&small, q, *cache);
  EXPECT_EQ(cache->num_free_blocks(), cache->num_blocks());
}

TEST(BatchSchedulerTest, WaitsForBlocksThatKvReservationsHold) {
  // A KV reservation (a transfer landing: blocks held outside the queues) takes 3 of 4 blocks.
  // A request that fits the pool but not what is left waits, with nothing running, rather than
  // fail as too big; so does a running one that cannot grow; both go on once the blocks return.
  auto cache = TinyCache(4);  // 16 slots
  SchedulerConfig cfg;
  cfg.max_tokens_per_step = 16;
  SchedulerQueues q;
  const int32_t reservation = cache->NewSequence(0);
  ASSERT_TRUE(cache->EnsureCapacity(reservation, 12));
  SchedSeq a = MakeSeq(1, 6);
  q.waiting = {&a};
  for (int step = 0; step < 3; ++step) {
    StepSchedule s = RunStep(cfg, q, *cache);
    EXPECT_TRUE(s.failed.empty());
    EXPECT_TRUE(s.chunks.empty());
    ASSERT_EQ(q.waiting.size(), 1u);
  }
  cache->FreeSequence(reservation);
  StepSchedule s = RunStep(cfg, q, *cache);
  ASSERT_EQ(s.chunks.size(), 1u);
  EXPECT_EQ(s.chunks[0].n_tokens, 6);

  // Running alone with 2 blocks; a reservation takes the other 2; growing past 8 slots waits.
  const int32_t second = cache->NewSequence(0);
  ASSERT_TRUE(cache->EnsureCapacity(second, 8));
  a.tokens.push_back(8);  // 7 tokens computed... then 8, 9: the third block is needed at slot 9
  a.tokens.push_back(9);
  a.tokens.push_back(10);
  s = RunStep(cfg, q, *cache);
  EXPECT_TRUE(s.failed.empty());
  EXPECT_EQ(q.running.size(), 0u);  // preempted to wait, not failed
  ASSERT_EQ(q.waiting.size(), 1u);
  cache->FreeSequence(second);
  s = RunStep(cfg, q, *cache);  // recomputed from its tokens
  ASSERT_EQ(s.chunks.size(), 1u);
  EXPECT_TRUE(s.failed.empty());
  ReleaseSequence(&a, q, *cache);
  EXPECT_EQ(cache->num_free_blocks(), cache->num_blocks());
}

TEST(BatchSchedulerTest, ReservedSequencesGoAheadOfAHeadThatWaits) {
  // The head of the queue waits for blocks that a reserved sequence behind it holds (its KV came
  // by transfer): the reserved one runs first, needing no new block, and frees them when done.
  auto cache = TinyCache(4);
  SchedulerConfig cfg;
  cfg.max_tokens_per_step = 16;
  SchedulerQueues q;
  const int32_t res = cache->NewSequence(0);
  ASSERT_TRUE(cache->EnsureCapacity(res, 9));  // 3 blocks: 8 transferred slots + the last token
  ASSERT_TRUE(cache->Append(res, std::vector<int32_t>(8, 5)));
  SchedSeq head = MakeSeq(1, 6), reserved = MakeSeq(2, 9);
  reserved.reserved_kv = res;
  reserved.reserved_slots = 8;
  q.waiting = {&head, &reserved};
  StepSchedule s = RunStep(cfg, q, *cache);
  ASSERT_EQ(s.chunks.size(), 1u);
  EXPECT_EQ(s.chunks[0].seq, &reserved);
  EXPECT_EQ(s.chunks[0].n_tokens, 1);
  EXPECT_TRUE(s.failed.empty());
  ASSERT_EQ(q.waiting.size(), 1u);
  EXPECT_EQ(q.waiting.front(), &head);
  ReleaseSequence(&reserved, q, *cache);
  s = RunStep(cfg, q, *cache);
  ASSERT_EQ(s.chunks.size(), 1u);
  EXPECT_EQ(s.chunks[0].seq, &head);
  ReleaseSequence(&head, q, *cache);
  EXPECT_EQ(cache->num_free_blocks(), cache->num_blocks());
}

}  // namespace
}  // namespace tripod
