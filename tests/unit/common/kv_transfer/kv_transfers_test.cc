// KvTransfers: the state machine of a transfer (reserved -> receiving -> complete -> adopted, or
// failed / expired / cancelled), leases freeing reservations whether or not data arrived, refused
// chunks aborting the transfer, one stream per transfer, specific statuses for late chunks, ids,
// and shutdown. No model: the destination is a small paged cache.
#include "common/kv_transfer/kv_transfers.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "common/kv/contiguous_kv_cache.h"
#include "common/kv/paged_kv_cache.h"
#include "common/kv_transfer/kv_chunk_codec.h"
#include "common/util/mutex.h"

namespace tripod::kv_transfers_test {
namespace {

const KvLayout kLayout{2, 2, 32, KvDtype::kF32};
constexpr int kBlocks = 64;

class KvTransfersTest : public ::testing::Test {
 protected:
  void SetUp() override { Make(KvTransfersOptions()); }

  void Make(const KvTransfersOptions& o) {
    transfers_.reset();
    PagedKvOptions po;
    po.layout = kLayout;
    po.block_tokens = 16;
    po.budget_bytes = size_t{1} * kBlocks * 16 * kLayout.bytes_per_token();
    po.watermark = 0;
    auto c = PagedKvCache::Create(po);
    ASSERT_TRUE(c.ok()) << c.status();
    cache_ = std::move(*c);
    transfers_ = std::make_unique<KvTransfers>(
        o, kLayout,
        [this](int32_t kv) {
          MutexLock lock(&mu_);
          released_.push_back(kv);
          cache_->FreeSequence(kv);  // the release runs on the reaper's thread too
        },
        [this](const TransferEnd& e) {
          MutexLock lock(&mu_);
          ends_.push_back(e);
        });
  }

  // What DecodeEngine::ReserveKv makes: a sequence with room for n_slots + 1 and its view.
  KvReservation Reserve(int n_slots) {
    MutexLock lock(&mu_);
    KvReservation r;
    r.kv_seq = cache_->NewSequence(1);
    EXPECT_TRUE(cache_->EnsureCapacity(r.kv_seq, n_slots + 1));
    r.n_slots = n_slots;
    r.blocks = cache_->BlocksFor(n_slots + 1);
    r.store = cache_->WriteView(r.kv_seq);
    return r;
  }

  TransferTicket Add(int n_prompt, absl::Duration lease = absl::ZeroDuration()) {
    TransferSpec spec;
    spec.n_prompt = n_prompt;
    spec.plan_key = 1;
    spec.lease = lease;
    return transfers_->Add(Reserve(n_prompt - 1), spec);
  }

  // A source of KV: n slots of random values.
  std::unique_ptr<ContiguousKvCache> Source(int n, uint32_t seed) {
    auto c = ContiguousKvCache::Create(kLayout, 1, std::max(n, 1));
    EXPECT_TRUE(c.ok());
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1, 1);
    for (int l = 0; l < kLayout.n_layers; ++l) {
      const KvLayerRef r = (*c)->Layer(0, l);
      for (int h = 0; h < kLayout.n_kv_heads; ++h) {
        for (int s = 0; s < n; ++s) {
          float* k = reinterpret_cast<float*>(r.k_at(s, h, kLayout.head_dim));
          float* v = reinterpret_cast<float*>(r.v_at(s, h, kLayout.head_dim));
          for (int e = 0; e < kLayout.head_dim; ++e) {
            k[e] = u(rng);
            v[e] = u(rng);
          }
        }
      }
    }
    return std::move(*c);
  }

  // The transfer's chunks: per layer, slots in pieces of `per` slots; then the end message.
  static std::vector<v1::KvChunk> Chunks(KvStore& src, int n, uint64_t id, int per = 8) {
    std::vector<v1::KvChunk> out;
    uint64_t bytes = 0;
    for (int l = 0; l < kLayout.n_layers; ++l) {
      for (int s = 0; s < n; s += per) {
        v1::KvChunk c;
        EncodeKvChunk(src, 0, l, l + 1, s, std::min(n, s + per), &c);
        c.set_transfer_id(id);
        c.set_seq(static_cast<uint32_t>(out.size()));
        bytes += c.payload().size();
        out.push_back(std::move(c));
      }
    }
    v1::KvChunk end;
    MakeKvEnd(id, static_cast<uint32_t>(out.size()), static_cast<uint32_t>(out.size()), bytes,
              &end);
    out.push_back(std::move(end));
    return out;
  }

  std::vector<int32_t> Released() {
    MutexLock lock(&mu_);
    return released_;
  }
  std::vector<TransferEnd> Ends() {
    MutexLock lock(&mu_);
    return ends_;
  }
  int FreeBlocks() {
    MutexLock lock(&mu_);
    return cache_->num_free_blocks();
  }
  // Waits (bounded) until `n` reservations were released and `n` ends reported: the reaper
  // releases first and reports after, outside the lock, so a test reading Ends() must wait too.
  bool AwaitReleased(size_t n, absl::Duration limit = absl::Seconds(10)) {
    const absl::Time until = absl::Now() + limit;
    while (absl::Now() < until) {
      if (Released().size() >= n && Ends().size() >= n) return true;
      absl::SleepFor(absl::Milliseconds(2));
    }
    return false;
  }
  TransferState State(uint64_t id) {
    absl::StatusOr<TransferState> s = transfers_->state(id);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : TransferState::kFailed;
  }

  Mutex mu_;
  std::unique_ptr<PagedKvCache> cache_;
  std::vector<int32_t> released_;
  std::vector<TransferEnd> ends_;
  std::unique_ptr<KvTransfers> transfers_;
};

bool Contains(const absl::Status& s, const std::string& what) {
  return s.message().find(what) != std::string::npos;
}

TEST_F(KvTransfersTest, CompleteTransferIsAdoptedWithItsData) {
  constexpr int n = 41;  // 40 slots: 3 blocks with the last token's room
  const TransferTicket t = Add(n);
  EXPECT_NE(t.transfer_id, 0u);
  EXPECT_EQ(t.lease, absl::Seconds(30));
  EXPECT_EQ(State(t.transfer_id), TransferState::kReserved);
  EXPECT_EQ(transfers_->active(), 1);
  auto src = Source(n - 1, 1);
  std::vector<v1::KvChunk> chunks = Chunks(*src, n - 1, t.transfer_id);
  ASSERT_TRUE(transfers_->OpenStream(t.transfer_id).ok());
  absl::Status second = transfers_->OpenStream(t.transfer_id);
  EXPECT_EQ(second.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(second, "already has a PushKv stream")) << second;
  for (size_t i = 0; i + 1 < chunks.size(); ++i) {
    absl::StatusOr<PushProgress> p = transfers_->Push(t.transfer_id, chunks[i]);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->chunks, i + 1);
    EXPECT_FALSE(p->complete);
    EXPECT_EQ(State(t.transfer_id), TransferState::kReceiving);
    absl::StatusOr<bool> done = transfers_->AwaitComplete(t.transfer_id, absl::ZeroDuration());
    ASSERT_TRUE(done.ok());
    EXPECT_FALSE(*done);
  }
  absl::StatusOr<PushProgress> p = transfers_->Push(t.transfer_id, chunks.back());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->complete);
  EXPECT_EQ(p->slots, n - 1);
  EXPECT_EQ(p->bytes, KvChunkPayloadBytes(kLayout, kLayout.n_layers, n - 1));
  EXPECT_TRUE(transfers_->CloseStream(t.transfer_id, absl::OkStatus()).ok());
  EXPECT_EQ(State(t.transfer_id), TransferState::kComplete);
  absl::StatusOr<bool> done = transfers_->AwaitComplete(t.transfer_id, absl::Seconds(1));
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(*done);

  absl::StatusOr<AdoptedKv> a = transfers_->Adopt(t.transfer_id, n);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->n_slots, n - 1);
  EXPECT_FALSE(a->trimmed);
  EXPECT_EQ(State(t.transfer_id), TransferState::kAdopted);
  EXPECT_EQ(transfers_->active(), 0);
  EXPECT_TRUE(Released().empty());  // the blocks are the adopter's now
  {
    MutexLock lock(&mu_);
    for (int l = 0; l < kLayout.n_layers; ++l) {
      const KvLayerRef dst = cache_->Layer(a->kv_seq, l), from = src->Layer(0, l);
      for (int h = 0; h < kLayout.n_kv_heads; ++h) {
        for (int s = 0; s < n - 1; ++s) {
          ASSERT_EQ(std::memcmp(dst.k_at(s, h, 32), from.k_at(s, h, 32), 128), 0);
          ASSERT_EQ(std::memcmp(dst.v_at(s, h, 32), from.v_at(s, h, 32), 128), 0);
        }
      }
    }
    cache_->FreeSequence(a->kv_seq);
  }
  // Too late now, with a status that says why.
  absl::StatusOr<PushProgress> late = transfers_->Push(t.transfer_id, chunks[0]);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(late.status(), "adopted")) << late.status();
  EXPECT_EQ(transfers_->Adopt(t.transfer_id, n).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_EQ(Ends().size(), 1u);
  EXPECT_EQ(Ends()[0].reason, "adopted");
  EXPECT_EQ(FreeBlocks(), kBlocks);
}

TEST_F(KvTransfersTest, RefusedChunksAbortTheTransferAndFreeItsBlocks) {
  struct Case {
    std::string name;
    std::function<void(std::vector<v1::KvChunk>&)> spoil;
    absl::StatusCode code;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"checksum", [](auto& c) { c[2].set_xxh3(c[2].xxh3() ^ 1); }, absl::StatusCode::kDataLoss,
       "checksum"},
      {"gap", [](auto& c) { c.erase(c.begin() + 2); }, absl::StatusCode::kInvalidArgument, "gap"},
      {"past the reservation",
       [](auto& c) {
         c[2].set_slot_begin(16);
         c[2].set_slot_end(48);
       },
       absl::StatusCode::kOutOfRange, "overflows the reservation"},
      {"short end", [](auto& c) { c.erase(c.end() - 2); }, absl::StatusCode::kInvalidArgument,
       "end message"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    const size_t released_before = Released().size();
    const TransferTicket t = Add(33);
    auto src = Source(32, 2);
    std::vector<v1::KvChunk> chunks = Chunks(*src, 32, t.transfer_id);
    k.spoil(chunks);
    ASSERT_TRUE(transfers_->OpenStream(t.transfer_id).ok());
    absl::Status refused;
    for (const v1::KvChunk& c : chunks) {
      absl::StatusOr<PushProgress> p = transfers_->Push(t.transfer_id, c);
      if (!p.ok()) {
        refused = p.status();
        break;
      }
    }
    // Already ended by the refusal: closing says so.
    EXPECT_EQ(transfers_->CloseStream(t.transfer_id, refused).code(),
              absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(refused.code(), k.code) << refused;
    EXPECT_TRUE(Contains(refused, k.says)) << refused;
    EXPECT_TRUE(Contains(refused, absl::StrCat("transfer ", t.transfer_id))) << refused;
    EXPECT_EQ(State(t.transfer_id), TransferState::kFailed);
    EXPECT_EQ(Released().size(), released_before + 1);
    EXPECT_EQ(FreeBlocks(), kBlocks);
    // A late chunk, and a Generate waiting on it, learn what happened.
    absl::StatusOr<PushProgress> late = transfers_->Push(t.transfer_id, chunks[0]);
    EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(Contains(late.status(), "aborted earlier")) << late.status();
    EXPECT_TRUE(Contains(late.status(), k.says)) << late.status();
    EXPECT_EQ(transfers_->AwaitComplete(t.transfer_id, absl::Seconds(1)).status().code(), k.code);
    EXPECT_EQ(Ends().back().reason, "chunk_rejected");
  }
  EXPECT_EQ(transfers_->active(), 0);
}

TEST_F(KvTransfersTest, LeaseExpiryFreesReservationsWhetherOrNotDataArrived) {
  const absl::Time t0 = absl::Now();
  const TransferTicket untouched = Add(20, absl::Milliseconds(400));
  const TransferTicket partial = Add(20, absl::Milliseconds(400));
  const TransferTicket complete = Add(20, absl::Milliseconds(400));
  const TransferTicket lasting = Add(20, absl::Seconds(30));
  EXPECT_GE(untouched.deadline, t0 + absl::Milliseconds(400));
  auto src = Source(19, 3);
  std::vector<v1::KvChunk> pc = Chunks(*src, 19, partial.transfer_id);
  ASSERT_TRUE(transfers_->OpenStream(partial.transfer_id).ok());
  ASSERT_TRUE(transfers_->Push(partial.transfer_id, pc[0]).ok());
  std::vector<v1::KvChunk> cc = Chunks(*src, 19, complete.transfer_id);
  ASSERT_TRUE(transfers_->OpenStream(complete.transfer_id).ok());
  for (const v1::KvChunk& c : cc) ASSERT_TRUE(transfers_->Push(complete.transfer_id, c).ok());
  EXPECT_EQ(State(complete.transfer_id), TransferState::kComplete);
  EXPECT_EQ(transfers_->active(), 4);

  ASSERT_TRUE(AwaitReleased(3));
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(400));  // not before the deadline
  for (uint64_t id : {untouched.transfer_id, partial.transfer_id, complete.transfer_id}) {
    EXPECT_EQ(State(id), TransferState::kExpired);
    absl::StatusOr<bool> w = transfers_->AwaitComplete(id, absl::ZeroDuration());
    EXPECT_EQ(w.status().code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_TRUE(Contains(w.status(), "lease of 400 ms expired")) << w.status();
  }
  EXPECT_EQ(State(lasting.transfer_id), TransferState::kReserved);
  EXPECT_EQ(transfers_->active(), 1);
  // Blocks of all three freed; the lasting one's (2 blocks) still held.
  EXPECT_EQ(FreeBlocks(), kBlocks - 2);
  // A late chunk is refused, naming the lease.
  absl::StatusOr<PushProgress> late = transfers_->Push(partial.transfer_id, pc[1]);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(Contains(late.status(), "lease")) << late.status();
  EXPECT_EQ(transfers_->OpenStream(untouched.transfer_id).code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(transfers_->Adopt(complete.transfer_id, 20).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  int expired = 0;
  for (const TransferEnd& e : Ends()) expired += e.reason == "expired";
  EXPECT_EQ(expired, 3);
}

// The lease runs out while a stream is busy writing chunks: the blocks are freed once, after the
// chunk in progress, and the stream is told why.
TEST_F(KvTransfersTest, ExpiryDuringAStreamReleasesOnceAfterTheChunkInProgress) {
  constexpr int n = 501;
  // 150 ms of lease against at least 250 ms of chunks: it runs out mid-stream, and a loaded
  // machine (TSan beside other work) still opens the stream within it (60 ms did not).
  const TransferTicket t = Add(n, absl::Milliseconds(150));
  auto src = Source(n - 1, 4);
  std::vector<v1::KvChunk> chunks = Chunks(*src, n - 1, t.transfer_id, 1);  // 1000 small chunks
  ASSERT_TRUE(transfers_->OpenStream(t.transfer_id).ok());
  absl::Status refused;
  for (const v1::KvChunk& c : chunks) {
    absl::StatusOr<PushProgress> p = transfers_->Push(t.transfer_id, c);
    if (!p.ok()) {
      refused = p.status();
      break;
    }
    absl::SleepFor(absl::Microseconds(250));
  }
  EXPECT_EQ(transfers_->CloseStream(t.transfer_id, refused).code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(refused.code(), absl::StatusCode::kDeadlineExceeded) << refused;
  ASSERT_TRUE(AwaitReleased(1));
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(Released().size(), 1u);
  EXPECT_EQ(FreeBlocks(), kBlocks);
  EXPECT_EQ(State(t.transfer_id), TransferState::kExpired);
}

TEST_F(KvTransfersTest, CancelStreamEndAndMismatchedPromptAbort) {
  auto src = Source(16, 5);
  // Cancel: a later chunk is refused with CANCELLED.
  const TransferTicket a = Add(17);
  std::vector<v1::KvChunk> ac = Chunks(*src, 16, a.transfer_id);
  ASSERT_TRUE(transfers_->OpenStream(a.transfer_id).ok());
  ASSERT_TRUE(transfers_->Push(a.transfer_id, ac[0]).ok());
  EXPECT_TRUE(transfers_->Cancel(a.transfer_id, "a test"));
  EXPECT_FALSE(transfers_->Cancel(a.transfer_id, "again"));
  EXPECT_FALSE(transfers_->Cancel(12345, "unknown"));
  absl::StatusOr<PushProgress> late = transfers_->Push(a.transfer_id, ac[1]);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(Contains(late.status(), "a test")) << late.status();
  EXPECT_EQ(State(a.transfer_id), TransferState::kCancelled);

  // The stream ends without its end message (the sender died): aborted.
  const TransferTicket b = Add(17);
  std::vector<v1::KvChunk> bc = Chunks(*src, 16, b.transfer_id);
  ASSERT_TRUE(transfers_->OpenStream(b.transfer_id).ok());
  ASSERT_TRUE(transfers_->Push(b.transfer_id, bc[0]).ok());
  absl::Status closed = transfers_->CloseStream(b.transfer_id, absl::CancelledError("peer"));
  EXPECT_EQ(closed.code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(Contains(closed, "peer")) << closed;
  EXPECT_EQ(State(b.transfer_id), TransferState::kFailed);
  absl::StatusOr<bool> w = transfers_->AwaitComplete(b.transfer_id, absl::ZeroDuration());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(Contains(w.status(), "without its end message")) << w.status();

  // Generate with a prompt of another length: aborted, freed.
  const TransferTicket c = Add(17);
  std::vector<v1::KvChunk> cc = Chunks(*src, 16, c.transfer_id);
  ASSERT_TRUE(transfers_->OpenStream(c.transfer_id).ok());
  for (const v1::KvChunk& ch : cc) ASSERT_TRUE(transfers_->Push(c.transfer_id, ch).ok());
  EXPECT_TRUE(transfers_->CloseStream(c.transfer_id, absl::OkStatus()).ok());
  EXPECT_EQ(State(c.transfer_id), TransferState::kComplete);  // a clean close keeps it
  absl::StatusOr<AdoptedKv> bad = transfers_->Adopt(c.transfer_id, 18);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(State(c.transfer_id), TransferState::kFailed);

  // Unknown ids.
  EXPECT_EQ(transfers_->OpenStream(777).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(transfers_->AwaitComplete(777, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kNotFound);

  EXPECT_EQ(Released().size(), 3u);
  EXPECT_EQ(FreeBlocks(), kBlocks);
  EXPECT_EQ(transfers_->active(), 0);
}

TEST_F(KvTransfersTest, WhenSettledFiresOnceOnCompletionOrEnd) {
  auto src = Source(16, 6);
  std::atomic<int> completed{0}, cancelled{0}, expired{0}, at_once{0};
  // Fires when the last chunk completes the transfer, not before.
  const TransferTicket a = Add(17);
  transfers_->WhenSettled(a.transfer_id, [&] {
    EXPECT_TRUE(*transfers_->AwaitComplete(a.transfer_id, absl::ZeroDuration()));
    ++completed;
  });
  std::vector<v1::KvChunk> ac = Chunks(*src, 16, a.transfer_id);
  ASSERT_TRUE(transfers_->OpenStream(a.transfer_id).ok());
  for (size_t i = 0; i + 1 < ac.size(); ++i) {
    ASSERT_TRUE(transfers_->Push(a.transfer_id, ac[i]).ok());
    EXPECT_EQ(completed.load(), 0);
  }
  ASSERT_TRUE(transfers_->Push(a.transfer_id, ac.back()).ok());
  EXPECT_EQ(completed.load(), 1);
  // Complete already, or unknown: at once, on this thread.
  transfers_->WhenSettled(a.transfer_id, [&] { ++at_once; });
  transfers_->WhenSettled(999, [&] { ++at_once; });
  EXPECT_EQ(at_once.load(), 2);
  absl::StatusOr<AdoptedKv> adopted = transfers_->Adopt(a.transfer_id, 17);
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  {
    MutexLock lock(&mu_);
    cache_->FreeSequence(adopted->kv_seq);
  }
  // A cancel and an expired lease end the wait with what ended the transfer; two waiters both.
  const TransferTicket b = Add(17);
  for (int i = 0; i < 2; ++i) {
    transfers_->WhenSettled(b.transfer_id, [&] {
      EXPECT_EQ(transfers_->AwaitComplete(b.transfer_id, absl::ZeroDuration()).status().code(),
                absl::StatusCode::kCancelled);
      ++cancelled;
    });
  }
  EXPECT_TRUE(transfers_->Cancel(b.transfer_id, "a test"));
  EXPECT_EQ(cancelled.load(), 2);
  const TransferTicket c = Add(17, absl::Milliseconds(100));
  transfers_->WhenSettled(c.transfer_id, [&] {
    EXPECT_EQ(State(c.transfer_id), TransferState::kExpired);
    ++expired;
  });
  const absl::Time until = absl::Now() + absl::Seconds(30);
  while (expired.load() == 0 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(expired.load(), 1);
  EXPECT_EQ(completed.load(), 1);
  EXPECT_EQ(cancelled.load(), 2);
}

TEST_F(KvTransfersTest, IdsAreUniqueNonZeroAndShutdownFreesEverything) {
  std::set<uint64_t> ids;
  for (int i = 0; i < 2000; ++i) {
    const TransferTicket t = Add(1);  // 0 slots, one block for the last token
    EXPECT_NE(t.transfer_id, 0u);
    ids.insert(t.transfer_id);
    ASSERT_TRUE(transfers_->Cancel(t.transfer_id, "next"));
  }
  EXPECT_EQ(ids.size(), 2000u);
  const TransferTicket a = Add(30), b = Add(30);
  EXPECT_EQ(transfers_->active(), 2);
  transfers_->Shutdown();
  EXPECT_EQ(transfers_->active(), 0);
  EXPECT_EQ(State(a.transfer_id), TransferState::kCancelled);
  EXPECT_EQ(State(b.transfer_id), TransferState::kCancelled);
  const TransferTicket after = Add(30);  // refused at once
  EXPECT_EQ(State(after.transfer_id), TransferState::kCancelled);
  EXPECT_EQ(Released().size(), 2003u);
  EXPECT_EQ(FreeBlocks(), kBlocks);
}

// A tombstone says what happened for a while, then the id is simply unknown.
TEST_F(KvTransfersTest, TombstonesAgeOut) {
  KvTransfersOptions o;
  o.tombstone_ttl = absl::Milliseconds(100);
  Make(o);
  const TransferTicket t = Add(5);
  ASSERT_TRUE(transfers_->Cancel(t.transfer_id, "test"));
  EXPECT_EQ(transfers_->OpenStream(t.transfer_id).code(), absl::StatusCode::kCancelled);
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (transfers_->state(t.transfer_id).ok() && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(transfers_->OpenStream(t.transfer_id).code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tripod::kv_transfers_test
