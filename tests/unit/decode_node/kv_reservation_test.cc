// DecodeEngine's KV reservations: KV written in place into reserved blocks (as a transfer does,
// through the reservation's view) and adopted by a request gives exactly the tokens of the same
// KV imported as a snapshot and of the engine's own prefill (fp32, full plan), trimmed KV
// included; the watermark, releases, cancellation and preemption of an adopting sequence.
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/compute/cpu/cpu_backend.h"
#include "common/kv/contiguous_kv_cache.h"
#include "common/util/mutex.h"
#include "common/util/thread_pool.h"
#include "decode_node/decode_engine.h"
#include "tests/unit/decode_node/random_prompt.h"
#include "tests/unit/decode_node/reference_forward.h"
#include "tests/unit/decode_node/test_engine.h"
#include "tests/unit/test_model.h"

namespace tripod {
namespace {

constexpr size_t kF32BytesPerToken = 2ull * 30 * 3 * 64 * 4;  // the bundled model, f32 KV

DecodeEngineOptions Options(size_t kv_bytes = size_t{64} << 20) {
  return TestEngineOptions(kv_bytes);
}

std::unique_ptr<DecodeEngine> NewEngine(const DecodeEngineOptions& o) { return NewTestEngine(o); }

struct Stream {
  std::vector<int32_t> tokens;
  FinishReason finish = FinishReason::kNone;
  std::string error;
  int events = 0;
};

DecodeRequest Greedy(std::vector<int32_t> prompt, int max_tokens, Stream* out) {
  DecodeRequest r = GreedyRequest(std::move(prompt), max_tokens);
  r.on_event = [out](const TokenEvent& ev) {
    EXPECT_EQ(out->finish, FinishReason::kNone) << "event after the finish";
    if (ev.token >= 0) out->tokens.push_back(ev.token);
    out->finish = ev.finish;
    out->error = ev.error;
    ++out->events;
  };
  return r;
}

// `keep` of the snapshot's positions per (layer, head), a different random subset each (SpecKV's
// shape of trimmed KV).
KvSnapshot Trim(const KvSnapshot& full, int keep, uint32_t seed) {
  KvSnapshot t;
  t.layout = full.layout;
  t.n_slots = keep;
  t.plan_key = full.plan_key;
  const size_t row = full.row_bytes();
  std::mt19937 rng(seed);
  for (int l = 0; l < full.layout.n_layers; ++l) {
    for (int h = 0; h < full.layout.n_kv_heads; ++h) {
      std::vector<int32_t> pos(full.n_slots);
      for (int i = 0; i < full.n_slots; ++i) pos[i] = i;
      std::shuffle(pos.begin(), pos.end(), rng);
      pos.resize(keep);
      for (int32_t p : pos) {
        t.positions.push_back(p);
        const uint8_t* k = full.k.data() + full.offset(l, h, p);
        const uint8_t* v = full.v.data() + full.offset(l, h, p);
        t.k.insert(t.k.end(), k, k + row);
        t.v.insert(t.v.end(), v, v + row);
      }
    }
  }
  return t;
}

// Reserves, writes the snapshot through the reservation's view (from this thread, as a transfer
// would from its own) and returns the request that adopts it.
DecodeRequest AdoptingRequest(DecodeEngine& e, const std::vector<int32_t>& prompt,
                              const KvSnapshot& snap, int max_tokens, Stream* out) {
  absl::StatusOr<KvReservation> r = e.ReserveKv(snap.n_slots, snap.plan_key);
  EXPECT_TRUE(r.ok()) << r.status();
  DecodeRequest req = Greedy(prompt, max_tokens, out);
  if (!r.ok()) return req;
  EXPECT_EQ(r->n_slots, snap.n_slots);
  EXPECT_TRUE(WriteSnapshot(snap, *r->store, r->kv_seq).ok());
  req.reserved_kv_seq = r->kv_seq;
  req.reserved_slots = snap.n_slots;
  req.reserved_trimmed = snap.trimmed();
  return req;
}

void ExpectAllFree(const DecodeEngine& e) {
  EXPECT_TRUE(e.cache().CheckConsistency().ok()) << e.cache().CheckConsistency();
  EXPECT_EQ(e.cache().num_free_blocks(), e.cache().num_blocks());
  EXPECT_EQ(e.stats().reservations, 0);
  EXPECT_TRUE(e.idle());
}

class KvReservationTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { PinComputeThreads(); }
};

constexpr int kNew = 12;

TEST_F(KvReservationTest, AdoptedKvGivesTheImportAndLocalPrefillTokens) {
  auto e = NewEngine(Options());
  ASSERT_NE(e, nullptr);
  for (int n : {2, 17, 50, 97}) {  // one slot, part of a block, several blocks
    const std::vector<int32_t> prompt = RandomPrompt(n, 300 + n);
    const KvSnapshot snap = ReferencePrefillSnapshot(prompt);
    Stream local, imported, adopted;
    // Another engine for the local prefill, so that no prefix-cache hit is involved.
    auto fresh = NewEngine(Options());
    ASSERT_NE(fresh, nullptr);
    ASSERT_TRUE(fresh->Submit(Greedy(prompt, kNew, &local)).ok());
    ASSERT_TRUE(fresh->RunUntilIdle().ok());
    DecodeRequest imp = Greedy(prompt, kNew, &imported);
    imp.kv = std::make_shared<KvSnapshot>(snap);
    ASSERT_TRUE(e->Submit(std::move(imp)).ok());
    ASSERT_TRUE(e->RunUntilIdle().ok());
    const int64_t forward_before = e->stats().forward_tokens;
    ASSERT_TRUE(e->Submit(AdoptingRequest(*e, prompt, snap, kNew, &adopted)).ok());
    ASSERT_TRUE(e->RunUntilIdle().ok());
    EXPECT_EQ(e->stats().forward_tokens - forward_before, kNew);  // only the last prompt token
    ASSERT_EQ(local.tokens.size(), static_cast<size_t>(kNew)) << n;
    EXPECT_EQ(imported.tokens, local.tokens) << "prompt of " << n;
    EXPECT_EQ(adopted.tokens, local.tokens) << "prompt of " << n;
    EXPECT_EQ(adopted.finish, FinishReason::kLength);
    ExpectAllFree(*e);
  }
  EXPECT_EQ(e->stats().adopted, 4);
  // The adopted KV was published like an import's: the same prompt now hits the prefix cache.
  const std::vector<int32_t> prompt = RandomPrompt(97, 397);
  Stream again;
  const int64_t hits = e->stats().prefix_hit_slots;
  ASSERT_TRUE(e->Submit(Greedy(prompt, 1, &again)).ok());
  ASSERT_TRUE(e->RunUntilIdle().ok());
  EXPECT_EQ(e->stats().prefix_hit_slots - hits, 96);
}

TEST_F(KvReservationTest, TrimmedAdoptedKvGivesTheTrimmedImportsTokens) {
  auto e = NewEngine(Options());
  ASSERT_NE(e, nullptr);
  const std::vector<int32_t> prompt = RandomPrompt(80, 11);
  const KvSnapshot trimmed = Trim(ReferencePrefillSnapshot(prompt), 45, 5);
  Stream imported, adopted;
  DecodeRequest imp = Greedy(prompt, kNew, &imported);
  imp.kv = std::make_shared<KvSnapshot>(trimmed);
  ASSERT_TRUE(e->Submit(std::move(imp)).ok());
  ASSERT_TRUE(e->RunUntilIdle().ok());
  ASSERT_TRUE(e->Submit(AdoptingRequest(*e, prompt, trimmed, kNew, &adopted)).ok());
  ASSERT_TRUE(e->RunUntilIdle().ok());
  ASSERT_EQ(imported.tokens.size(), static_cast<size_t>(kNew));
  EXPECT_EQ(adopted.tokens, imported.tokens);
  EXPECT_EQ(e->cache().num_cached_blocks(), 0);  // trimmed KV is never shared
  ExpectAllFree(*e);
}

TEST_F(KvReservationTest, WatermarkReleaseAndBadAdoptions) {
  // 24 blocks of 16 slots, 2 of them kept free by the watermark.
  DecodeEngineOptions o = Options(24 * 16 * kF32BytesPerToken);
  o.watermark = 0.1;
  auto e = NewEngine(o);
  ASSERT_NE(e, nullptr);
  ASSERT_EQ(e->cache().num_blocks(), 24);
  ASSERT_EQ(e->cache().watermark_blocks(), 2);

  absl::StatusOr<KvReservation> huge = e->ReserveKv(24 * 16, 1);
  ASSERT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(huge.status().message().find("never fit"), std::string::npos) << huge.status();
  EXPECT_EQ(e->ReserveKv(-1, 1).status().code(), absl::StatusCode::kInvalidArgument);

  absl::StatusOr<KvReservation> a = e->ReserveKv(16 * 16 - 1, 1);  // 16 blocks with the last slot
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->blocks, 16);
  absl::StatusOr<KvReservation> b = e->ReserveKv(7 * 16, 1);  // 8 blocks: into the watermark
  ASSERT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(b.status().message().find("full for now"), std::string::npos) << b.status();
  absl::StatusOr<KvReservation> c = e->ReserveKv(5 * 16, 1);  // 6 blocks: fits
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NE(a->kv_seq, c->kv_seq);
  DecodeEngineStats st = e->stats();
  EXPECT_EQ(st.reservations, 2);
  EXPECT_EQ(st.free_blocks, 2);
  EXPECT_EQ(st.total_blocks, 24);

  e->ReleaseKv(a->kv_seq);
  e->ReleaseKv(a->kv_seq);  // twice: ignored
  e->ReleaseKv(12345);      // unknown: ignored
  EXPECT_EQ(e->stats().free_blocks, 18);
  EXPECT_EQ(e->stats().reservations, 1);

  // Adopting a released reservation, or with the wrong slot count, ends with an error event.
  Stream released, wrong;
  DecodeRequest r1 = Greedy(RandomPrompt(16 * 16, 1), 2, &released);
  r1.reserved_kv_seq = a->kv_seq;
  r1.reserved_slots = 16 * 16 - 1;
  ASSERT_TRUE(e->Submit(std::move(r1)).ok());
  DecodeRequest r2 = Greedy(RandomPrompt(50, 2), 2, &wrong);
  r2.reserved_kv_seq = c->kv_seq;
  r2.reserved_slots = 49;
  ASSERT_TRUE(e->Submit(std::move(r2)).ok());
  ASSERT_TRUE(e->RunUntilIdle().ok());
  EXPECT_EQ(released.finish, FinishReason::kError);
  EXPECT_NE(released.error.find("unknown"), std::string::npos) << released.error;
  EXPECT_EQ(wrong.finish, FinishReason::kError);
  EXPECT_NE(wrong.error.find("80 slots"), std::string::npos) << wrong.error;
  // The mismatched request took the reservation over and freed it with itself.
  ExpectAllFree(*e);

  // Submit's own checks.
  Stream s;
  DecodeRequest bad = Greedy(RandomPrompt(10, 3), 2, &s);
  bad.reserved_kv_seq = 0;
  bad.reserved_slots = 8;  // untrimmed KV must be n-1 = 9 slots
  EXPECT_EQ(e->Submit(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad.reserved_trimmed = true;
  bad.reserved_slots = 10;  // more than n-1
  EXPECT_EQ(e->Submit(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad.reserved_slots = 8;
  bad.kv = std::make_shared<KvSnapshot>();
  EXPECT_EQ(e->Submit(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(KvReservationTest, CancelledAdoptingRequestFreesTheReservation) {
  auto e = NewEngine(Options());
  ASSERT_NE(e, nullptr);
  const std::vector<int32_t> prompt = RandomPrompt(40, 9);
  const KvSnapshot snap = ReferencePrefillSnapshot(prompt);
  Stream s;
  auto id = e->Submit(AdoptingRequest(*e, prompt, snap, 8, &s));
  ASSERT_TRUE(id.ok());
  EXPECT_LT(e->stats().free_blocks, e->stats().total_blocks);
  e->Cancel(*id);  // before it ever ran
  ASSERT_TRUE(e->RunUntilIdle().ok());
  EXPECT_EQ(s.finish, FinishReason::kCancelled);
  EXPECT_TRUE(s.tokens.empty());
  ExpectAllFree(*e);
}

// Two adopting sequences that cannot both grow to the end: the newer is preempted (no snapshot to
// re-import) and recomputes its prompt and tokens; fp32 full-plan KV makes that exact.
TEST_F(KvReservationTest, PreemptedAdoptingSequenceRecomputesToTheSameTokens) {
  constexpr int kLong = 60;
  const std::vector<int32_t> p1 = RandomPrompt(150, 21), p2 = RandomPrompt(150, 22);
  std::vector<std::vector<int32_t>> ref;
  {
    auto big = NewEngine(Options());
    ASSERT_NE(big, nullptr);
    for (const auto& p : {p1, p2}) {
      Stream s;
      ASSERT_TRUE(big->Submit(Greedy(p, kLong, &s)).ok());
      ASSERT_TRUE(big->RunUntilIdle().ok());
      ref.push_back(s.tokens);
    }
  }
  // 24 blocks: each sequence ends at 210 slots (14 blocks), both together need 28.
  DecodeEngineOptions o = Options(24 * 16 * kF32BytesPerToken);
  o.watermark = 0;
  auto e = NewEngine(o);
  ASSERT_NE(e, nullptr);
  Stream s1, s2;
  const KvSnapshot k1 = ReferencePrefillSnapshot(p1), k2 = ReferencePrefillSnapshot(p2);
  ASSERT_TRUE(e->Submit(AdoptingRequest(*e, p1, k1, kLong, &s1)).ok());
  ASSERT_TRUE(e->Submit(AdoptingRequest(*e, p2, k2, kLong, &s2)).ok());
  ASSERT_TRUE(e->RunUntilIdle().ok());
  EXPECT_GT(e->stats().preemptions, 0);
  EXPECT_EQ(s1.finish, FinishReason::kLength);
  EXPECT_EQ(s2.finish, FinishReason::kLength);
  EXPECT_EQ(s1.tokens, ref[0]);
  EXPECT_EQ(s2.tokens, ref[1]);
  ExpectAllFree(*e);
}

// With the loop running, reservations are made and released from other threads at step
// boundaries while requests run, and the KV is written from yet another thread.
TEST_F(KvReservationTest, ReservationsFromOtherThreadsWhileTheLoopRuns) {
  auto e = NewEngine(Options());
  ASSERT_NE(e, nullptr);
  const std::vector<int32_t> prompt = RandomPrompt(70, 31);
  const KvSnapshot snap = ReferencePrefillSnapshot(prompt);
  Stream local;
  ASSERT_TRUE(e->Submit(Greedy(prompt, kNew, &local)).ok());
  ASSERT_TRUE(e->RunUntilIdle().ok());
  e->Start();

  // Background traffic so that reservations land between steps.
  std::deque<Stream> busy(3);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(e->Submit(Greedy(RandomPrompt(30 + i, 40 + i), 24, &busy[i])).ok());
  }
  absl::StatusOr<KvReservation> spare;
  std::thread reserver([&] { spare = e->ReserveKv(100, 7); });
  absl::StatusOr<KvReservation> r = e->ReserveKv(snap.n_slots, snap.plan_key);
  reserver.join();
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(spare.ok()) << spare.status();
  std::thread writer([&] { EXPECT_TRUE(WriteSnapshot(snap, *r->store, r->kv_seq).ok()); });
  writer.join();
  e->ReleaseKv(spare->kv_seq);

  Mutex mu;
  bool done = false;
  Stream adopted;
  DecodeRequest req = Greedy(prompt, kNew, &adopted);
  TokenCallback inner = req.on_event;
  req.on_event = [&, inner](const TokenEvent& ev) {
    inner(ev);
    if (ev.finish != FinishReason::kNone) {
      MutexLock lock(&mu);
      done = true;
    }
  };
  req.reserved_kv_seq = r->kv_seq;
  req.reserved_slots = snap.n_slots;
  ASSERT_TRUE(e->Submit(std::move(req)).ok());
  const absl::Time until = absl::Now() + absl::Seconds(120);
  for (bool finished = false; !finished && absl::Now() < until;) {
    {
      MutexLock lock(&mu);
      finished = done;
    }
    if (!finished) absl::SleepFor(absl::Milliseconds(1));
  }
  {
    MutexLock lock(&mu);
    EXPECT_TRUE(done) << "no finish event within 120 s";
  }
  const absl::Time idle_until = absl::Now() + absl::Seconds(120);
  while (!e->idle() && absl::Now() < idle_until) absl::SleepFor(absl::Milliseconds(5));
  e->Stop();
  EXPECT_EQ(adopted.tokens, local.tokens);
  for (const Stream& s : busy) EXPECT_EQ(s.finish, FinishReason::kLength);
  ExpectAllFree(*e);
}

}  // namespace
}  // namespace tripod
