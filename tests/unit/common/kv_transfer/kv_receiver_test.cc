// KvReceiver's states (idle -> receiving -> complete, or failed: no transfer named, an unknown or
// taken transfer, a refused chunk, a stream that ended early), and a KvSender -> KvReceiver round
// trip through the in-process stream: the KV lands byte for byte and is adopted; a dropped chunk
// (the fault wrapper) fails the transfer at the gap; an abort frees the reservation.
#include "common/kv_transfer/kv_receiver.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "common/kv/contiguous_kv_cache.h"
#include "common/kv/kv_snapshot.h"
#include "common/kv/paged_kv_cache.h"
#include "common/kv_transfer/fault_injecting_stream.h"
#include "common/kv_transfer/in_process_kv_stream.h"
#include "common/kv_transfer/kv_chunk_codec.h"
#include "common/kv_transfer/kv_sender.h"
#include "common/util/mutex.h"

namespace tripod {
namespace {

const KvLayout kLayout{2, 2, 32, KvDtype::kF32};
constexpr int kBlocks = 64;

class KvReceiverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PagedKvOptions po;
    po.layout = kLayout;
    po.block_tokens = 16;
    po.budget_bytes = size_t{1} * kBlocks * 16 * kLayout.bytes_per_token();
    po.watermark = 0;
    auto c = PagedKvCache::Create(po);
    ASSERT_TRUE(c.ok()) << c.status();
    cache_ = std::move(*c);
    transfers_ = std::make_unique<KvTransfers>(KvTransfersOptions(), kLayout, [this](int32_t kv) {
      MutexLock lock(&mu_);
      ++released_;
      cache_->FreeSequence(kv);
    });
  }
  void TearDown() override { transfers_.reset(); }

  // A transfer of an n_prompt-token prompt's KV (n_prompt - 1 slots).
  uint64_t Add(int n_prompt) {
    MutexLock lock(&mu_);
    KvReservation r;
    r.kv_seq = cache_->NewSequence(1);
    EXPECT_TRUE(cache_->EnsureCapacity(r.kv_seq, n_prompt));
    r.n_slots = n_prompt - 1;
    r.blocks = cache_->BlocksFor(n_prompt);
    r.store = cache_->WriteView(r.kv_seq);
    TransferSpec spec;
    spec.n_prompt = n_prompt;
    spec.plan_key = 1;
    return transfers_->Add(std::move(r), spec).transfer_id;
  }

  // n slots of random bytes, and their snapshot.
  static std::unique_ptr<ContiguousKvCache> Source(int n, KvSnapshot* snap) {
    auto c = *ContiguousKvCache::Create(kLayout, 1, n);
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1, 1);
    for (int l = 0; l < kLayout.n_layers; ++l) {
      const KvLayerRef r = c->Layer(0, l);
      for (int h = 0; h < kLayout.n_kv_heads; ++h) {
        for (int s = 0; s < n; ++s) {
          float* k = reinterpret_cast<float*>(r.k_at(s, h, kLayout.head_dim));
          float* v = reinterpret_cast<float*>(r.v_at(s, h, kLayout.head_dim));
          for (int e = 0; e < kLayout.head_dim; ++e) k[e] = u(rng), v[e] = u(rng);
        }
      }
    }
    *snap = *ExportSnapshot(*c, 0, n);
    return c;
  }

  static v1::KvChunk Chunk(KvStore& src, uint64_t id, uint32_t seq, int layer, int s0, int s1) {
    v1::KvChunk c;
    EncodeKvChunk(src, 0, layer, layer + 1, s0, s1, &c);
    c.set_transfer_id(id);
    c.set_seq(seq);
    return c;
  }

  int released() {
    MutexLock lock(&mu_);
    return released_;
  }

  Mutex mu_;
  std::unique_ptr<PagedKvCache> cache_;
  int released_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<KvTransfers> transfers_;
};

TEST_F(KvReceiverTest, GoesIdleReceivingComplete) {
  KvSnapshot snap;
  auto src = Source(8, &snap);
  const uint64_t id = Add(9);
  KvReceiver rx(*transfers_, nullptr);
  EXPECT_EQ(rx.state(), KvReceiveState::kIdle);
  ASSERT_TRUE(rx.Receive(Chunk(*src, id, 0, 0, 0, 8)).ok());
  EXPECT_EQ(rx.state(), KvReceiveState::kReceiving);
  EXPECT_EQ(rx.transfer_id(), id);
  EXPECT_EQ(*transfers_->state(id), TransferState::kReceiving);
  const v1::KvChunk second = Chunk(*src, id, 1, 1, 0, 8);
  ASSERT_TRUE(rx.Receive(second).ok());
  v1::KvChunk end;
  MakeKvEnd(id, 2, 2, 2 * second.payload().size(), &end);
  absl::StatusOr<PushProgress> p = rx.Receive(end);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->complete);
  EXPECT_EQ(p->chunks, 2u);
  EXPECT_EQ(rx.state(), KvReceiveState::kComplete);
  EXPECT_EQ(*transfers_->state(id), TransferState::kComplete);
  EXPECT_TRUE(rx.Close(absl::AbortedError("late")).ok()) << "complete stays complete";
  EXPECT_EQ(rx.Receive(end).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(rx.state(), KvReceiveState::kComplete);
}

TEST_F(KvReceiverTest, FirstChunkWithoutTransferOrUnknownFails) {
  KvReceiver none(*transfers_, nullptr);
  v1::KvChunk c;
  EXPECT_EQ(none.Receive(c).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(none.state(), KvReceiveState::kFailed);
  EXPECT_EQ(none.Close(absl::OkStatus()).code(), absl::StatusCode::kInvalidArgument);

  KvReceiver unknown(*transfers_, nullptr);
  c.set_transfer_id(12345);
  EXPECT_EQ(unknown.Receive(c).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(unknown.state(), KvReceiveState::kFailed);

  KvReceiver empty(*transfers_, nullptr);
  EXPECT_EQ(empty.Close(absl::OkStatus()).code(), absl::StatusCode::kInvalidArgument)
      << "a stream that carried no chunk";
}

TEST_F(KvReceiverTest, SecondStreamOnATransferIsRefusedAndTheFirstGoesOn) {
  KvSnapshot snap;
  auto src = Source(8, &snap);
  const uint64_t id = Add(9);
  KvReceiver first(*transfers_, nullptr);
  ASSERT_TRUE(first.Receive(Chunk(*src, id, 0, 0, 0, 8)).ok());
  KvReceiver second(*transfers_, nullptr);
  EXPECT_FALSE(second.Receive(Chunk(*src, id, 1, 1, 0, 8)).ok());
  EXPECT_EQ(second.state(), KvReceiveState::kFailed);
  EXPECT_EQ(first.state(), KvReceiveState::kReceiving);
  EXPECT_EQ(*transfers_->state(id), TransferState::kReceiving);
}

TEST_F(KvReceiverTest, RefusedChunkFailsTheTransferAndFreesItsBlocks) {
  KvSnapshot snap;
  auto src = Source(8, &snap);
  const uint64_t id = Add(9);
  KvReceiver rx(*transfers_, nullptr);
  ASSERT_TRUE(rx.Receive(Chunk(*src, id, 0, 0, 0, 8)).ok());
  const absl::Status refused = rx.Receive(Chunk(*src, id, 5, 1, 0, 8)).status();  // a gap
  EXPECT_FALSE(refused.ok());
  EXPECT_EQ(rx.state(), KvReceiveState::kFailed);
  EXPECT_EQ(*transfers_->state(id), TransferState::kFailed);
  EXPECT_EQ(released(), 1);
  EXPECT_EQ(rx.Close(absl::OkStatus()), refused) << "Close repeats the refusal";
}

TEST_F(KvReceiverTest, StreamEndingEarlyAbortsTheTransfer) {
  KvSnapshot snap;
  auto src = Source(8, &snap);
  const uint64_t id = Add(9);
  {
    KvReceiver rx(*transfers_, nullptr);
    ASSERT_TRUE(rx.Receive(Chunk(*src, id, 0, 0, 0, 8)).ok());
    const absl::Status st = rx.Close(absl::CancelledError("the sender cancelled the call"));
    EXPECT_EQ(st.code(), absl::StatusCode::kAborted) << st;
    EXPECT_EQ(rx.state(), KvReceiveState::kFailed);
  }
  EXPECT_EQ(*transfers_->state(id), TransferState::kFailed);
  EXPECT_EQ(released(), 1);
  // A receiver dropped while receiving closes its stream too.
  const uint64_t id2 = Add(9);
  {
    KvReceiver rx(*transfers_, nullptr);
    ASSERT_TRUE(rx.Receive(Chunk(*src, id2, 0, 0, 0, 8)).ok());
  }
  EXPECT_EQ(*transfers_->state(id2), TransferState::kFailed);
  EXPECT_EQ(released(), 2);
}

TEST_F(KvReceiverTest, SenderToReceiverThroughTheInProcessStream) {
  constexpr int kSlots = 40;
  KvSnapshot snap;
  auto src = Source(kSlots, &snap);
  const uint64_t id = Add(kSlots + 1);
  KvSender sender(std::make_unique<InProcessKvStream>(*transfers_), id);
  EXPECT_EQ(sender.Poll(), KvSendState::kSending);
  for (int s = 0; s < kSlots; s += 16) {
    ASSERT_TRUE(sender.PushRange(*src, 0, {0, 1, s, std::min(s + 16, kSlots)}).ok());
    ASSERT_TRUE(sender.PushRange(*src, 0, {1, 2, s, std::min(s + 16, kSlots)}).ok());
  }
  absl::StatusOr<v1::PushKvResponse> ack = sender.Finish();
  ASSERT_TRUE(ack.ok()) << ack.status();
  EXPECT_EQ(sender.Poll(), KvSendState::kAcknowledged);
  EXPECT_EQ(ack->chunks(), sender.stats().chunks);
  EXPECT_EQ(ack->bytes(), sender.stats().bytes);
  EXPECT_EQ(ack->slots(), kSlots);
  absl::StatusOr<AdoptedKv> a = transfers_->Adopt(id, kSlots + 1);
  ASSERT_TRUE(a.ok()) << a.status();
  const KvSnapshot got = *ExportSnapshot(*cache_, a->kv_seq, kSlots);
  ASSERT_EQ(got.k.size(), snap.k.size());
  EXPECT_EQ(std::memcmp(got.k.data(), snap.k.data(), snap.k.size()), 0);
  EXPECT_EQ(std::memcmp(got.v.data(), snap.v.data(), snap.v.size()), 0);
}

TEST_F(KvReceiverTest, ADroppedChunkFailsTheTransferAtTheGap) {
  KvSnapshot snap;
  auto src = Source(8, &snap);
  const uint64_t id = Add(9);
  TransferFaultRates rates;
  rates.drop = 1;
  TransferFaultInjector faults(rates);
  KvSender sender(std::make_unique<FaultInjectingStream>(
                      std::make_unique<InProcessKvStream>(*transfers_), faults),
                  id);
  // Every data chunk vanishes: the receiver sees the end message where chunk 0 was due.
  ASSERT_TRUE(sender.PushRange(*src, 0, {0, 2, 0, 8}).ok());
  const absl::StatusOr<v1::PushKvResponse> ack = sender.Finish();
  EXPECT_FALSE(ack.ok());
  EXPECT_EQ(sender.Poll(), KvSendState::kFailed);
  EXPECT_EQ(faults.count(ChunkFault::kDrop), sender.stats().chunks);
  EXPECT_EQ(*transfers_->state(id), TransferState::kFailed);
  EXPECT_EQ(released(), 1);
}

TEST_F(KvReceiverTest, AbortCancelsTheTransfer) {
  KvSnapshot snap;
  auto src = Source(8, &snap);
  const uint64_t id = Add(9);
  KvSender sender(std::make_unique<InProcessKvStream>(*transfers_), id);
  ASSERT_TRUE(sender.PushRange(*src, 0, {0, 1, 0, 8}).ok());
  // Once the chunk is in (a stream that never bound its transfer leaves it to its lease).
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (*transfers_->state(id) == TransferState::kReserved && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(*transfers_->state(id), TransferState::kReceiving);
  sender.Abort();
  EXPECT_EQ(sender.Poll(), KvSendState::kAborted);
  EXPECT_EQ(sender.Finish().status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(sender.PushRange(*src, 0, {1, 2, 0, 8}).code(), absl::StatusCode::kCancelled);
  // The transfer ends and its blocks are freed at once (no lease runs out).
  EXPECT_EQ(released(), 1);
  EXPECT_EQ(*transfers_->state(id), TransferState::kFailed);
}

}  // namespace
}  // namespace tripod
