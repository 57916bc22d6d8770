// KvLinks, the decode worker's side of KV links: what it refuses and why, payloads taken in link
// order whatever order their headers come in, each checked by its MAC under the link's key (over
// a TCP link between guarded memories; NCCL needs GPUs): altered, replayed, moved or wrongly
// keyed payloads fail, an oversized one closes the link before anything is allocated, a refused
// header's payload is dropped with the link kept in step.
#include "common/kv_transfer/kv_links.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "common/compute/cpu/cpu_backend.h"
#include "common/compute/guarded_kv_backend.h"
#include "common/kv/paged_kv_cache.h"
#include "common/kv_transfer/kv_chunk_codec.h"
#include "common/kv_transfer/kv_link_auth.h"
#include "common/kv_transfer/kv_receiver.h"
#include "common/kv_transfer/kv_transfers.h"
#include "common/kv_transfer/tcp_kv_link.h"
#include "common/util/mutex.h"

namespace tripod {
namespace {

class KvLinksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = MakeGuardedKvBackend(MakeCpuBackend(CpuBackendOptions{}));
    memory_ = *backend_->DeviceKvMemory();
    options_.tcp = true;
    options_.open_timeout = absl::Seconds(10);
    options_.io_timeout = absl::Seconds(10);
  }
  v1::OpenKvLinkRequest Tcp(KvDtype t = KvDtype::kF16) {
    v1::OpenKvLinkRequest r;
    r.set_kind(v1::KV_LINK_TCP);
    r.set_kv_dtype(KvDtypeToWire(t));
    return r;
  }
  static absl::Status Pass() { return absl::OkStatus(); }
  // A link of this worker's, joined from "the prefill worker" with `key` (the reply's by default).
  struct Joined {
    v1::OpenKvLinkResponse reply;
    std::unique_ptr<KvLink> sender;
  };
  Joined Join(KvLinks& links) {
    Joined j;
    absl::StatusOr<v1::OpenKvLinkResponse> r = links.Open(Tcp());
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return j;
    j.reply = *r;
    EXPECT_EQ(r->link_key().size(), kKvLinkKeyBytes);
    absl::StatusOr<std::unique_ptr<KvLink>> sender = ConnectTcpKvLink(
        "127.0.0.1", r->tcp_port(), r->link_id(), r->link_key(), memory_, absl::Seconds(10));
    EXPECT_TRUE(sender.ok()) << sender.status();
    if (sender.ok()) j.sender = std::move(*sender);
    return j;
  }
  // The header of payload `link_seq` of transfer `transfer`'s chunk `seq`, signed under `key`
  // over `signed_bytes`.
  static v1::KvChunk Header(const v1::OpenKvLinkResponse& r, uint64_t transfer, uint32_t seq,
                            uint64_t link_seq, const std::vector<uint8_t>& signed_bytes,
                            const std::string& key) {
    v1::KvChunk h;
    h.set_transfer_id(transfer);
    h.set_seq(seq);
    h.set_link_id(r.link_id());
    h.set_link_seq(link_seq);
    h.set_link_bytes(signed_bytes.size());
    h.set_link_mac(
        KvLinkPayloadMac(key, h, KvLinkPayloadDigest(signed_bytes.data(), signed_bytes.size())));
    return h;
  }
  // Sends `payloads` on `sender` in order, on a thread of its own.
  std::thread SendAll(KvLink& sender, const std::vector<std::vector<uint8_t>>& payloads) {
    return std::thread([this, &sender, &payloads] {
      for (const std::vector<uint8_t>& p : payloads) {
        uint8_t* d = memory_.alloc(p.size());
        memory_.from_host(d, p.data(), p.size());
        EXPECT_TRUE(sender.Send(d, p.size(), absl::Seconds(10)).ok());
        memory_.free(d);
      }
    });
  }
  std::unique_ptr<Backend> backend_;
  KvMemory memory_;
  KvLinksOptions options_;
};

std::vector<uint8_t> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

TEST_F(KvLinksTest, RefusesWhatItCannotHoldSayingWhy) {
  auto words = [](const absl::StatusOr<v1::OpenKvLinkResponse>& r) {
    return std::string(r.status().message());
  };
  KvLinks host(options_, nullptr, KvDtype::kF16);
  EXPECT_NE(words(host.Open(Tcp())).find("host memory"), std::string::npos);
  KvLinks links(options_, &memory_, KvDtype::kF16);
  EXPECT_NE(words(links.Open(Tcp(KvDtype::kF32))).find("KV type"), std::string::npos);
  v1::OpenKvLinkRequest nccl = Tcp();
  nccl.set_kind(v1::KV_LINK_NCCL);
  EXPECT_EQ(links.Open(nccl).status().code(), absl::StatusCode::kFailedPrecondition);
  KvLinksOptions no_tcp = options_;
  no_tcp.tcp = false;
  KvLinks closed(no_tcp, &memory_, KvDtype::kF16);
  EXPECT_NE(words(closed.Open(Tcp())).find("takes no TCP links"), std::string::npos);
  v1::KvChunk unknown;
  unknown.set_link_id(12345);
  EXPECT_EQ(links.Receive(unknown, Pass, [](const uint8_t*) { return absl::OkStatus(); }).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(KvLinksTest, PayloadsAreTakenInLinkOrderAndCheckedByTheirMac) {
  KvLinks links(options_, &memory_, KvDtype::kF16);
  Joined j = Join(links);
  ASSERT_NE(j.sender, nullptr);
  // Three payloads; the third has a byte flipped on its way (its MAC is over the bytes sent).
  std::vector<std::vector<uint8_t>> payloads;
  std::vector<v1::KvChunk> headers;
  for (int i = 0; i < 3; ++i) {
    payloads.push_back(Random(1000 + 4000 * i, i));
    headers.push_back(Header(j.reply, 9, i, i, payloads.back(), j.reply.link_key()));
  }
  payloads[2][1234] ^= 0x10;
  std::thread send = SendAll(*j.sender, payloads);
  // Payload 1's header comes first, on another thread: it waits for payload 0's turn.
  std::vector<int> order;
  std::mutex order_mu;
  auto take = [&](int i) {
    return links.Receive(headers[i], Pass, [&, i](const uint8_t* rows) {
      std::vector<uint8_t> got(payloads[i].size());
      memory_.to_host(got.data(), rows, got.size());
      EXPECT_EQ(got, payloads[i]) << i;
      std::lock_guard<std::mutex> lock(order_mu);
      order.push_back(i);
      return absl::OkStatus();
    });
  };
  absl::Status second;
  std::thread later([&] { second = take(1); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(take(0).ok());
  later.join();
  EXPECT_TRUE(second.ok()) << second;
  const absl::Status bad = take(2);
  send.join();
  EXPECT_EQ(bad.code(), absl::StatusCode::kDataLoss) << bad;
  EXPECT_NE(bad.message().find("HMAC-SHA256"), std::string::npos) << bad;
  EXPECT_EQ(order, (std::vector<int>{0, 1}));
  // A payload whose turn has passed is refused.
  EXPECT_EQ(take(0).code(), absl::StatusCode::kInvalidArgument);
}

// Whoever holds the link's key alone can sign its payloads, and a signature holds for one
// chunk's place only: an earlier chunk's MAC replayed with its bytes, a chunk moved to another
// transfer, and a payload signed under another key all fail before `use` sees a byte; a good
// payload after them passes (the link stays in step).
TEST_F(KvLinksTest, ReplayedMovedOrWronglyKeyedPayloadsFail) {
  KvLinks links(options_, &memory_, KvDtype::kF16);
  Joined j = Join(links);
  ASSERT_NE(j.sender, nullptr);
  const std::string& key = j.reply.link_key();
  const std::vector<uint8_t> a = Random(2048, 1), b = Random(2048, 2);
  const v1::KvChunk first = Header(j.reply, 9, 0, 0, a, key);
  v1::KvChunk replayed = Header(j.reply, 9, 1, 1, a, key);
  replayed.set_link_mac(first.link_mac());  // chunk 0's bytes and MAC again, as chunk 1
  v1::KvChunk moved = Header(j.reply, 9, 2, 2, a, key);
  moved.set_transfer_id(10);  // signed for transfer 9
  const v1::KvChunk wrong_key = Header(j.reply, 9, 2, 3, a, std::string(kKvLinkKeyBytes, '\x42'));
  const v1::KvChunk good = Header(j.reply, 9, 2, 4, b, key);
  const std::vector<std::vector<uint8_t>> sent = {a, a, a, a, b};
  std::thread send = SendAll(*j.sender, sent);
  int used = 0;
  auto use = [&](const uint8_t*) {
    ++used;
    return absl::OkStatus();
  };
  EXPECT_TRUE(links.Receive(first, Pass, use).ok());
  for (const v1::KvChunk& h : {replayed, moved, wrong_key}) {
    const absl::Status st = links.Receive(h, Pass, use);
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
    EXPECT_NE(st.message().find("HMAC-SHA256"), std::string::npos) << st;
  }
  // No MAC at all is refused the same way.
  v1::KvChunk bare = good;
  bare.clear_link_mac();
  EXPECT_EQ(used, 1);
  EXPECT_TRUE(links.Receive(good, Pass, use).ok());
  EXPECT_EQ(used, 2);
  send.join();
  EXPECT_FALSE(VerifyKvLinkPayloadMac(key, bare, KvLinkPayloadDigest(b.data(), b.size())).ok());
}

// A header that names more bytes than any chunk carries closes its link at once: no allocation
// of that size, no wait for bytes that are not coming in one piece. A header the transfer
// refuses (`check`) has its payload taken off the link and dropped: the next one still fits.
TEST_F(KvLinksTest, OversizedOrRefusedHeadersAreHandledBeforeTheirBytesLand) {
  options_.max_payload_bytes = 4096;
  KvMemory counted = memory_;
  size_t largest_alloc = 0;
  counted.alloc = [&](size_t n) {
    largest_alloc = std::max(largest_alloc, n);
    return memory_.alloc(n);
  };
  KvLinks links(options_, &counted, KvDtype::kF16);
  Joined j = Join(links);
  ASSERT_NE(j.sender, nullptr);
  const std::string& key = j.reply.link_key();
  const std::vector<uint8_t> a = Random(4096, 1), b = Random(100, 2);
  const std::vector<std::vector<uint8_t>> sent = {a, b};
  std::thread send = SendAll(*j.sender, sent);
  int used = 0, checked = 0;
  auto use = [&](const uint8_t*) {
    ++used;
    return absl::OkStatus();
  };
  const absl::Status refused = links.Receive(
      Header(j.reply, 9, 0, 0, a, key),
      [&] {
        ++checked;
        return absl::OutOfRangeError("the ranges overflow the reservation");
      },
      use);
  EXPECT_EQ(refused.code(), absl::StatusCode::kOutOfRange) << refused;
  EXPECT_EQ(used, 0);
  EXPECT_TRUE(links.Receive(Header(j.reply, 9, 1, 1, b, key), Pass, use).ok());
  EXPECT_EQ(used, 1);
  send.join();

  v1::KvChunk huge = Header(j.reply, 9, 2, 2, b, key);
  huge.set_link_bytes(uint64_t{1} << 40);
  const absl::Status st = links.Receive(
      huge,
      [&] {
        ++checked;
        return absl::OkStatus();
      },
      use);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("more than any chunk carries"), std::string::npos) << st;
  EXPECT_EQ(checked, 1);  // the oversized header never got that far
  EXPECT_LE(largest_alloc, size_t{4096});
  // The link is closed: what comes after fails at once.
  EXPECT_FALSE(links.Receive(Header(j.reply, 9, 3, 3, b, key), Pass, use).ok());
  EXPECT_EQ(used, 1);
}

// Through the PushKv receiver into a transfer: a payload with a flipped byte, a header whose size
// does not fit its ranges, and one larger than any chunk each fail the transfer with their reason,
// `use` never runs (no row is scattered) and the reservation's blocks are released.
TEST_F(KvLinksTest, ARefusedLinkChunkFailsItsTransferAndFreesItsKv) {
  const KvLayout layout{2, 2, 64, KvDtype::kF16};
  PagedKvOptions po;
  po.layout = layout;
  po.block_tokens = 16;
  po.budget_bytes = size_t{1} * 16 * 16 * layout.bytes_per_token();
  po.watermark = 0;
  po.device = memory_;
  absl::StatusOr<std::unique_ptr<PagedKvCache>> cache = PagedKvCache::Create(po);
  ASSERT_TRUE(cache.ok()) << cache.status();
  Mutex mu;
  int released = 0;
  KvTransfers transfers(KvTransfersOptions(), layout, [&](int32_t kv) {
    MutexLock lock(&mu);
    ++released;
    (*cache)->FreeSequence(kv);
  });
  auto add = [&] {
    MutexLock lock(&mu);
    KvReservation r;
    r.kv_seq = (*cache)->NewSequence(1);
    EXPECT_TRUE((*cache)->EnsureCapacity(r.kv_seq, 21));
    r.n_slots = 20;
    r.blocks = (*cache)->BlocksFor(21);
    r.store = (*cache)->WriteView(r.kv_seq);
    TransferSpec spec;
    spec.n_prompt = 21;
    spec.plan_key = 1;
    return transfers.Add(std::move(r), spec).transfer_id;
  };
  KvLinks links(options_, &memory_, KvDtype::kF16);
  Joined j = Join(links);
  ASSERT_NE(j.sender, nullptr);
  const size_t bytes = KvChunkPayloadBytes(layout, 2, 20);
  auto header = [&](uint64_t transfer, uint64_t link_seq, const std::vector<uint8_t>& payload) {
    v1::KvChunk h = Header(j.reply, transfer, 0, link_seq, payload, j.reply.link_key());
    h.set_layer_begin(0);
    h.set_layer_end(2);
    h.set_slot_begin(0);
    h.set_slot_end(20);
    h.set_dtype(KvDtypeToWire(KvDtype::kF16));
    h.set_link_mac(KvLinkPayloadMac(j.reply.link_key(), h,
                                    KvLinkPayloadDigest(payload.data(), payload.size())));
    return h;
  };
  const std::vector<uint8_t> good = Random(bytes, 1), longer = Random(bytes + 64, 2);
  std::vector<uint8_t> flipped = good;
  flipped[77] ^= 1;
  const std::vector<std::vector<uint8_t>> sent = {flipped, longer};
  std::thread send = SendAll(*j.sender, sent);
  int before = 0;
  {
    MutexLock lock(&mu);
    before = released;
  }
  const uint64_t t1 = add(), t2 = add(), t3 = add();
  KvReceiver r1(transfers, &links), r2(transfers, &links), r3(transfers, &links);
  const absl::Status altered = r1.Receive(header(t1, 0, good)).status();
  EXPECT_EQ(altered.code(), absl::StatusCode::kDataLoss) << altered;
  const absl::Status misfit = r2.Receive(header(t2, 1, longer)).status();
  EXPECT_EQ(misfit.code(), absl::StatusCode::kInvalidArgument) << misfit;
  EXPECT_NE(misfit.message().find("the link payload holds"), std::string::npos) << misfit;
  send.join();
  v1::KvChunk huge = header(t3, 2, good);
  huge.set_link_bytes(uint64_t{1} << 40);
  const absl::Status oversized = r3.Receive(huge).status();
  EXPECT_EQ(oversized.code(), absl::StatusCode::kInvalidArgument) << oversized;
  for (uint64_t t : {t1, t2, t3}) {
    EXPECT_FALSE(transfers.AwaitComplete(t, absl::ZeroDuration()).ok()) << t;
  }
  MutexLock lock(&mu);
  EXPECT_EQ(released - before, 3);
}

// A prefill worker on this worker's device asking for NCCL (which cannot put two ranks on one
// GPU) gets an IPC link: a shared buffer it maps by the handle, payloads through it. Asking for
// IPC from another device, or from a worker that takes none, is refused saying why.
TEST_F(KvLinksTest, OnOneDeviceAnIpcLinkServesInNcclsPlace) {
  options_.ipc = true;
  options_.ipc_buffer_bytes = 4096;
  KvLinks links(options_, &memory_, KvDtype::kF16);
  v1::OpenKvLinkRequest req = Tcp();
  req.set_kind(v1::KV_LINK_NCCL);
  req.set_device(memory_.device);
  absl::StatusOr<v1::OpenKvLinkResponse> r = links.Open(req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->kind(), v1::KV_LINK_IPC);
  EXPECT_EQ(r->ipc_bytes(), 4096u);
  EXPECT_TRUE(r->nccl_unique_id().empty());

  // The prefill worker's end, in "another process" (another guarded memory).
  std::unique_ptr<Backend> other = MakeGuardedKvBackend(MakeCpuBackend(CpuBackendOptions{}));
  const KvMemory theirs = *other->DeviceKvMemory();
  std::string error;
  uint8_t* mapped = theirs.open_shared(r->ipc_handle(), &error);
  ASSERT_NE(mapped, nullptr) << error;
  absl::StatusOr<std::unique_ptr<KvLink>> sender = ConnectTcpKvLink(
      "127.0.0.1", r->tcp_port(), r->link_id(), r->link_key(), theirs, absl::Seconds(10),
      KvLinkSharedBuffer{mapped, r->ipc_bytes(), theirs.close_shared});
  ASSERT_TRUE(sender.ok()) << sender.status();
  std::vector<uint8_t> payload(10000);  // three pieces
  std::mt19937 rng(3);
  for (uint8_t& b : payload) b = static_cast<uint8_t>(rng());
  uint8_t* from = theirs.alloc(payload.size());
  theirs.from_host(from, payload.data(), payload.size());
  std::thread send(
      [&] { EXPECT_TRUE((*sender)->Send(from, payload.size(), absl::Seconds(10)).ok()); });
  const v1::KvChunk h = Header(*r, 9, 0, 0, payload, r->link_key());
  std::vector<uint8_t> got(payload.size());
  EXPECT_TRUE(links
                  .Receive(h, Pass,
                           [&](const uint8_t* rows) {
                             memory_.to_host(got.data(), rows, got.size());
                             return absl::OkStatus();
                           })
                  .ok());
  send.join();
  EXPECT_EQ(got, payload);
  sender->reset();
  theirs.free(from);

  auto words = [](const absl::StatusOr<v1::OpenKvLinkResponse>& r) {
    return std::string(r.status().message());
  };
  v1::OpenKvLinkRequest ipc = req;
  ipc.set_kind(v1::KV_LINK_IPC);
  ipc.set_device("cuda:another-gpu");
  EXPECT_NE(words(links.Open(ipc)).find("is not this worker's"), std::string::npos);
  // Asked for NCCL from another device: NCCL it is, which this worker (no GPU) refuses.
  v1::OpenKvLinkRequest far = req;
  far.set_device("cuda:another-gpu");
  EXPECT_EQ(links.Open(far).status().code(), absl::StatusCode::kFailedPrecondition);
  options_.ipc = false;
  KvLinks no_ipc(options_, &memory_, KvDtype::kF16);
  ipc.set_device(memory_.device);
  EXPECT_NE(words(no_ipc.Open(ipc)).find("takes no IPC links"), std::string::npos);
}

TEST_F(KvLinksTest, ALinkNobodyJoinsFailsItsPayloadsAndSetUpsDoNotPileUp) {
  options_.open_timeout = absl::Milliseconds(50);
  KvLinks links(options_, &memory_, KvDtype::kF16);
  uint64_t first = 0;
  for (int i = 0; i < 5; ++i) {
    absl::StatusOr<v1::OpenKvLinkResponse> r = links.Open(Tcp());
    ASSERT_TRUE(r.ok()) << r.status();
    if (i == 0) first = r->link_id();
    std::this_thread::sleep_for(std::chrono::milliseconds(250));  // its set-up times out
  }
  v1::KvChunk h;
  h.set_link_id(first);
  h.set_link_bytes(8);
  const absl::Status st = links.Receive(h, Pass, [](const uint8_t*) { return absl::OkStatus(); });
  // Failed, and dropped by a later Open: unknown now.
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("no KV link"), std::string::npos) << st;
  EXPECT_EQ(links.open_links(), 1);  // the last one, failed too, until the next Open
}

}  // namespace
}  // namespace tripod
