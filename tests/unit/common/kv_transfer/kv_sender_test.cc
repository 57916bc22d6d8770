// KvSender against a real gRPC decode side on loopback (fake_decode.h): chunk pieces stay under
// 1 MiB and tile their range; the KV arrives byte for byte with consecutive numbers and the end
// message; a one-token prompt's transfer is the end message alone; the decode side's refusal comes
// back with its code and message; a stalled decode side blocks the pusher after a bounded number
// of chunks (backpressure) and Abort wakes it; a missing acknowledgement times out; an
// unreachable worker is UNAVAILABLE. Every wait is bounded.
#include "common/kv_transfer/kv_sender.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>

#include "absl/time/clock.h"
#include "common/kv/contiguous_kv_cache.h"
#include "common/kv/kv_snapshot.h"
#include "common/kv_transfer/kv_sender_factory.h"
#include "common/rpc/protocol.h"
#include "tests/unit/common/kv_transfer/fake_decode.h"

namespace tripod::kv_sender_test {
namespace {

const KvLayout kLayout{30, 3, 64, KvDtype::kF16};  // SmolLM2-135M's KV, f16: 768 B a slot-layer

// A store of n_slots with random bytes in every layer (both sides have the same type: bytes are
// copied, never converted).
std::unique_ptr<ContiguousKvCache> RandomStore(int n_slots, KvSnapshot* snap, int seed = 1) {
  snap->layout = kLayout;
  snap->n_slots = n_slots;
  const size_t bytes =
      size_t{1} * kLayout.n_layers * kLayout.n_kv_heads * n_slots * snap->row_bytes();
  std::mt19937 rng(seed);
  snap->k.resize(bytes);
  snap->v.resize(bytes);
  for (auto* buf : {&snap->k, &snap->v}) {
    for (uint8_t& x : *buf) x = static_cast<uint8_t>(rng());
  }
  auto store = *ContiguousKvCache::Create(kLayout, 1, std::max(n_slots, 1));
  EXPECT_TRUE(WriteSnapshot(*snap, *store, 0).ok());
  return store;
}

bool Equal(const KvSnapshot& a, const KvSnapshot& b) {
  return a.k.size() == b.k.size() && a.v.size() == b.v.size() &&
         std::memcmp(a.k.data(), b.k.data(), a.k.size()) == 0 &&
         std::memcmp(a.v.data(), b.v.data(), a.v.size()) == 0;
}

// Pushes the KV as the engine's sink would: per chunk of 64 slots, layers 0..19 one by one, then
// 20..29 as one range.
absl::Status PushLikeTheEngine(KvSender& sender, KvStore& store, int n_slots) {
  for (int b = 0; b < n_slots; b += 64) {
    const int e = std::min(b + 64, n_slots);
    for (int l = 0; l < 20; ++l) {
      if (absl::Status s = sender.PushRange(store, 0, {l, l + 1, b, e}); !s.ok()) return s;
    }
    if (absl::Status s = sender.PushRange(store, 0, {20, 30, b, e}); !s.ok()) return s;
  }
  return absl::OkStatus();
}

TEST(SplitKvRangeTest, PiecesFitAndTileTheRange) {
  for (const KvRange r : {KvRange{20, 30, 0, 40}, KvRange{0, 1, 0, 3000}, KvRange{20, 30, 5, 1005},
                          KvRange{3, 4, 7, 8}}) {
    const std::vector<KvRange> pieces = SplitKvRange(kLayout, r, kMaxKvChunkPayload);
    std::vector<int> next(kLayout.n_layers, r.slot_begin);
    for (const KvRange& p : pieces) {
      EXPECT_LE(KvChunkPayloadBytes(kLayout, p.n_layers(), p.n_slots()), kMaxKvChunkPayload);
      ASSERT_GT(p.n_layers(), 0);
      ASSERT_GT(p.n_slots(), 0);
      for (int l = p.layer_begin; l < p.layer_end; ++l) {
        ASSERT_GE(l, r.layer_begin);
        ASSERT_LT(l, r.layer_end);
        EXPECT_EQ(p.slot_begin, next[l]) << "layer " << l << ": slots in order, no gap or overlap";
        next[l] = p.slot_end;
      }
    }
    for (int l = r.layer_begin; l < r.layer_end; ++l) EXPECT_EQ(next[l], r.slot_end);
  }
  // Small ranges travel as one chunk; 1000 slots of a layer (768 KB) one layer a chunk.
  EXPECT_EQ(SplitKvRange(kLayout, {20, 30, 0, 40}, kMaxKvChunkPayload).size(), 1u);
  EXPECT_EQ(SplitKvRange(kLayout, {20, 30, 5, 1005}, kMaxKvChunkPayload).size(), 10u);
  EXPECT_EQ(SplitKvRange(kLayout, {0, 1, 0, 3000}, kMaxKvChunkPayload).size(), 3u);
}

TEST(KvSenderTest, DeliversTheKvInOrder) {
  KvSnapshot src;
  auto store = RandomStore(100, &src);
  FakeDecode decode(7, kLayout, 100);
  KvSenderOptions o;
  o.peer = decode.address();
  std::unique_ptr<KvSender> owned = NewPushKvSender(NewWorkerChannel(decode.address()), 7, o);
  KvSender& sender = *owned;
  ASSERT_TRUE(PushLikeTheEngine(sender, *store, 100).ok());
  auto ack = sender.Finish();
  ASSERT_TRUE(ack.ok()) << ack.status();
  const KvSenderStats st = sender.stats();
  EXPECT_EQ(ack->chunks(), st.chunks);
  EXPECT_EQ(ack->bytes(), st.bytes);
  EXPECT_EQ(ack->slots(), 100);
  EXPECT_EQ(st.chunks, 2u * 21u);
  EXPECT_EQ(st.bytes, 100u * kLayout.bytes_per_token());
  ASSERT_TRUE(st.first_handed.has_value() && st.ack.has_value());
  EXPECT_LE(*st.first_handed, *st.ack);
  const std::vector<uint32_t> seqs = decode.seqs();
  ASSERT_EQ(seqs.size(), st.chunks + 1);
  for (size_t i = 0; i < seqs.size(); ++i) EXPECT_EQ(seqs[i], i);
  EXPECT_TRUE(decode.completed());
  EXPECT_TRUE(Equal(decode.Received(), src));
}

TEST(KvSenderTest, EmptyTransferIsTheEndMessageAlone) {
  FakeDecode decode(8, kLayout, 0);
  std::unique_ptr<KvSender> owned = NewPushKvSender(NewWorkerChannel(decode.address()), 8);
  KvSender& sender = *owned;
  auto ack = sender.Finish();
  ASSERT_TRUE(ack.ok()) << ack.status();
  EXPECT_EQ(ack->chunks(), 0u);
  EXPECT_EQ(decode.seqs(), std::vector<uint32_t>{0});
  EXPECT_TRUE(decode.completed());
}

TEST(KvSenderTest, DecodeRefusalComesBackAsItWasSent) {
  KvSnapshot src;
  auto store = RandomStore(100, &src);
  FakeDecode decode(9, kLayout, 100);
  FakeDecode::Behavior b;
  b.refuse_at_seq = 2;
  b.refusal = grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "transfer 9: the lease expired");
  decode.set_behavior(b);
  std::unique_ptr<KvSender> owned = NewPushKvSender(NewWorkerChannel(decode.address()), 9);
  KvSender& sender = *owned;
  const absl::Status pushed = PushLikeTheEngine(sender, *store, 100);
  auto ack = sender.Finish();
  // Whichever saw it first (a Push, or Finish) has the decode side's status.
  const absl::Status s = pushed.ok() ? ack.status() : pushed;
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(s.message(), "transfer 9: the lease expired");
  EXPECT_FALSE(ack.ok());
  EXPECT_EQ(ack.status().message(), "transfer 9: the lease expired");
}

// The decode side reads nothing until Release(): a paused or stalled decode worker.
void Hold(FakeDecode& decode) {
  FakeDecode::Behavior b;
  b.hold = true;
  decode.set_behavior(b);
}

TEST(KvSenderTest, StalledDecodeSideBlocksThePusherThenAbortWakesIt) {
  const int n_slots = KvChunkSlots(kLayout);  // one ~1 MiB chunk per layer: 30 MiB in all
  KvSnapshot src;
  auto store = RandomStore(n_slots, &src);
  for (bool abort : {false, true}) {
    SCOPED_TRACE(abort ? "abort" : "release");
    FakeDecode decode(10, kLayout, n_slots);
    Hold(decode);
    KvSenderOptions o;
    o.max_queued_bytes = size_t{2} << 20;
    std::unique_ptr<KvSender> owned = NewPushKvSender(NewWorkerChannel(decode.address()), 10, o);
    KvSender& sender = *owned;
    std::atomic<bool> pushed{false};
    absl::Status push_status;
    std::thread pusher([&] {
      push_status = sender.PushRange(*store, 0, {0, 30, 0, n_slots});
      pushed = true;
    });
    absl::SleepFor(absl::Milliseconds(500));
    // 2 MiB queued, one chunk in Write, and what the sockets and HTTP/2 windows hold: far fewer
    // than the 30 chunks a pusher without backpressure would have handed over by now.
    EXPECT_FALSE(pushed);
    EXPECT_LT(sender.stats().chunks, 16u);
    if (abort) {
      sender.Abort();
    } else {
      decode.Release();
    }
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (!pushed && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
    ASSERT_TRUE(pushed) << "the pusher stayed blocked";
    pusher.join();
    if (abort) {
      EXPECT_EQ(push_status.code(), absl::StatusCode::kCancelled) << push_status;
      EXPECT_EQ(sender.Finish().status().code(), absl::StatusCode::kCancelled);
      grpc::StatusCode code;
      decode.Release();
      ASSERT_TRUE(decode.WaitDone(absl::Seconds(30), &code));
      EXPECT_FALSE(decode.completed());
    } else {
      ASSERT_TRUE(push_status.ok()) << push_status;
      auto ack = sender.Finish();
      ASSERT_TRUE(ack.ok()) << ack.status();
      EXPECT_EQ(ack->chunks(), 30u);
      EXPECT_TRUE(Equal(decode.Received(), src));
    }
  }
}

TEST(KvSenderTest, ADecodeSideThatTakesNothingFailsThePushAfterTheStallTimeout) {
  // A paused decode worker: the queue fills and stays full; after stall_timeout the push fails
  // UNAVAILABLE (the prefill worker reports it as the decode side's failure, and its engine goes
  // on to the next job) rather than waiting for the decode worker to move again.
  const int n_slots = KvChunkSlots(kLayout);
  KvSnapshot src;
  auto store = RandomStore(n_slots, &src);
  FakeDecode decode(12, kLayout, n_slots);
  Hold(decode);
  KvSenderOptions o;
  o.max_queued_bytes = size_t{2} << 20;
  o.stall_timeout = std::chrono::milliseconds(300);
  o.peer = "paused-decode";
  std::unique_ptr<KvSender> owned = NewPushKvSender(NewWorkerChannel(decode.address()), 12, o);
  KvSender& sender = *owned;
  const absl::Time t0 = absl::Now();
  const absl::Status s = sender.PushRange(*store, 0, {0, 30, 0, n_slots});
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("paused-decode: the decode worker took no KV for 300 ms"),
            std::string::npos)
      << s;
  EXPECT_LT(absl::Now() - t0, absl::Seconds(20));
  EXPECT_LT(sender.stats().chunks, 30u);
  EXPECT_EQ(sender.Finish().status().code(), absl::StatusCode::kUnavailable);
  decode.Release();
  ASSERT_TRUE(decode.WaitDone(absl::Seconds(30)));  // the call was cancelled: its handler ended
  EXPECT_FALSE(decode.completed());
}

TEST(KvSenderTest, MissingAcknowledgementTimesOut) {
  FakeDecode decode(11, kLayout, 0);
  FakeDecode::Behavior b;
  b.ack_delay = absl::Seconds(20);
  decode.set_behavior(b);
  KvSenderOptions o;
  o.ack_timeout = std::chrono::milliseconds(200);
  std::unique_ptr<KvSender> owned = NewPushKvSender(NewWorkerChannel(decode.address()), 11, o);
  KvSender& sender = *owned;
  const absl::Time t0 = absl::Now();
  auto ack = sender.Finish();
  EXPECT_EQ(ack.status().code(), absl::StatusCode::kDeadlineExceeded) << ack.status();
  EXPECT_LT(absl::Now() - t0, absl::Seconds(10));
  ASSERT_TRUE(decode.WaitDone(absl::Seconds(30)));  // the call was cancelled: its handler ended
  EXPECT_FALSE(decode.completed());
}

TEST(KvSenderTest, UnreachableWorkerIsUnavailable) {
  std::string address;
  {
    // A port that was free a moment ago and has nobody listening now.
    FakeDecode gone(12, kLayout, 0);
    address = gone.address();
  }
  KvSenderOptions o;
  std::unique_ptr<KvSender> owned =
      NewPushKvSender(NewWorkerChannel(address), 12, o,
                      std::chrono::system_clock::now() + std::chrono::seconds(20));
  KvSender& sender = *owned;
  auto ack = sender.Finish();
  EXPECT_EQ(ack.status().code(), absl::StatusCode::kUnavailable) << ack.status();
}

}  // namespace
}  // namespace tripod::kv_sender_test
