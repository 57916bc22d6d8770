// KvLinks, the decode worker's side of KV links: what it refuses and why, and payloads taken in
// link order whatever order their headers come in, each checked by its hash (over a TCP link
// between guarded memories; NCCL needs GPUs).
#include "common/kv_transfer/kv_links.h"

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "common/compute/cpu/cpu_backend.h"
#include "common/compute/guarded_kv_backend.h"
#include "common/kv/kv_link_hash.h"
#include "common/kv_transfer/kv_chunk_codec.h"
#include "common/kv_transfer/tcp_kv_link.h"

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
  std::unique_ptr<Backend> backend_;
  KvMemory memory_;
  KvLinksOptions options_;
};

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
  EXPECT_EQ(links.Receive(unknown, [](const uint8_t*) { return absl::OkStatus(); }).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(KvLinksTest, PayloadsAreTakenInLinkOrderAndCheckedByTheirHash) {
  KvLinks links(options_, &memory_, KvDtype::kF16);
  absl::StatusOr<v1::OpenKvLinkResponse> r = links.Open(Tcp());
  ASSERT_TRUE(r.ok()) << r.status();
  absl::StatusOr<std::unique_ptr<KvLink>> sender =
      ConnectTcpKvLink("127.0.0.1", r->tcp_port(), r->link_id(), memory_, absl::Seconds(10));
  ASSERT_TRUE(sender.ok()) << sender.status();
  // Three payloads; the third's hash is wrong.
  std::mt19937 rng(1);
  std::vector<std::vector<uint8_t>> payloads(3);
  std::vector<v1::KvChunk> headers(3);
  std::vector<uint8_t*> device;
  for (int i = 0; i < 3; ++i) {
    payloads[i].resize(1000 + 4000 * i);
    for (uint8_t& b : payloads[i]) b = static_cast<uint8_t>(rng());
    headers[i].set_seq(i);
    headers[i].set_link_id(r->link_id());
    headers[i].set_link_seq(i);
    headers[i].set_link_bytes(payloads[i].size());
    headers[i].set_link_hash(KvLinkHash(payloads[i].data(), payloads[i].size()) + (i == 2));
    device.push_back(memory_.alloc(payloads[i].size()));
    memory_.from_host(device.back(), payloads[i].data(), payloads[i].size());
  }
  std::thread send([&] {
    for (int i = 0; i < 3; ++i) {
      EXPECT_TRUE((*sender)->Send(device[i], payloads[i].size(), absl::Seconds(10)).ok());
    }
  });
  // Payload 1's header comes first, on another thread: it waits for payload 0's turn.
  std::vector<int> order;
  std::mutex order_mu;
  auto take = [&](int i) {
    return links.Receive(headers[i], [&, i](const uint8_t* rows) {
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
  EXPECT_EQ(order, (std::vector<int>{0, 1}));
  // A payload whose turn has passed is refused.
  EXPECT_EQ(take(0).code(), absl::StatusCode::kInvalidArgument);
  for (uint8_t* p : device) memory_.free(p);
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
  absl::StatusOr<std::unique_ptr<KvLink>> sender =
      ConnectTcpKvLink("127.0.0.1", r->tcp_port(), r->link_id(), theirs, absl::Seconds(10),
                       KvLinkSharedBuffer{mapped, r->ipc_bytes(), theirs.close_shared});
  ASSERT_TRUE(sender.ok()) << sender.status();
  std::vector<uint8_t> payload(10000);  // three pieces
  std::mt19937 rng(3);
  for (uint8_t& b : payload) b = static_cast<uint8_t>(rng());
  uint8_t* from = theirs.alloc(payload.size());
  theirs.from_host(from, payload.data(), payload.size());
  std::thread send(
      [&] { EXPECT_TRUE((*sender)->Send(from, payload.size(), absl::Seconds(10)).ok()); });
  v1::KvChunk h;
  h.set_link_id(r->link_id());
  h.set_link_bytes(payload.size());
  h.set_link_hash(KvLinkHash(payload.data(), payload.size()));
  std::vector<uint8_t> got(payload.size());
  EXPECT_TRUE(links
                  .Receive(h,
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
  const absl::Status st = links.Receive(h, [](const uint8_t*) { return absl::OkStatus(); });
  // Failed, and dropped by a later Open: unknown now.
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("no KV link"), std::string::npos) << st;
  EXPECT_EQ(links.open_links(), 1);  // the last one, failed too, until the next Open
}

}  // namespace
}  // namespace tripod
