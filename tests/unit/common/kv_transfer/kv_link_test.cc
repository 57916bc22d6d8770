// KV links without a GPU: KvLinkHash (host and a device memory's agree; every word and its place
// count), the TCP link between guarded memories (payloads in order, the set-up naming its link
// and proving its key, timeouts that break the link), the IPC link through a shared buffer, and the
// receiver's checks of link chunks.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "common/compute/cpu/cpu_backend.h"
#include "common/compute/guarded_kv_backend.h"
#include "common/kv/contiguous_kv_cache.h"
#include "common/kv/kv_link_hash.h"
#include "common/kv/kv_snapshot.h"
#include "common/kv_transfer/kv_chunk_codec.h"
#include "common/kv_transfer/kv_link_auth.h"
#include "common/kv_transfer/nccl_kv_link.h"
#include "common/kv_transfer/tcp_kv_link.h"

namespace tripod {
namespace {

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// Device memory of `memory` holding `bytes` (the caller frees it).
uint8_t* other_alloc(const KvMemory& memory, const std::vector<uint8_t>& bytes) {
  uint8_t* p = memory.alloc(bytes.size());
  memory.from_host(p, bytes.data(), bytes.size());
  return p;
}

class KvLinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = MakeGuardedKvBackend(MakeCpuBackend(CpuBackendOptions{}));
    memory_ = *backend_->DeviceKvMemory();
  }
  // Device memory holding `bytes`.
  uint8_t* Device(const std::vector<uint8_t>& bytes) {
    uint8_t* p = memory_.alloc(bytes.size());
    memory_.from_host(p, bytes.data(), bytes.size());
    owned_.push_back(p);
    return p;
  }
  std::vector<uint8_t> Host(const uint8_t* p, size_t n) {
    std::vector<uint8_t> v(n);
    memory_.to_host(v.data(), p, n);
    return v;
  }
  void TearDown() override {
    for (uint8_t* p : owned_) memory_.free(p);
  }
  std::unique_ptr<Backend> backend_;
  KvMemory memory_;
  std::vector<uint8_t*> owned_;
};

TEST_F(KvLinkTest, TheHashSeesEveryWordAndItsPlace) {
  for (size_t n : {size_t{0}, size_t{5}, size_t{8}, size_t{1000}, size_t{4099}}) {
    const std::vector<uint8_t> a = RandomBytes(n, static_cast<uint32_t>(n));
    const uint64_t h = KvLinkHash(a.data(), a.size());
    EXPECT_EQ(memory_.hash(Device(a), n), h) << n;
    if (n < 16) continue;
    std::vector<uint8_t> flipped = a;
    flipped[n - 1] ^= 0x10;
    EXPECT_NE(KvLinkHash(flipped.data(), n), h);
    std::vector<uint8_t> swapped = a;  // two words trade places
    std::swap_ranges(swapped.begin(), swapped.begin() + 8, swapped.begin() + 8);
    ASSERT_NE(swapped, a);
    EXPECT_NE(KvLinkHash(swapped.data(), n), h);
    EXPECT_NE(KvLinkHash(a.data(), n - 1), h);  // a lost tail
  }
}

TEST_F(KvLinkTest, TcpLinkCarriesPayloadsInOrderBetweenDeviceMemories) {
  auto listener = TcpKvLinkListener::Listen("127.0.0.1");
  ASSERT_TRUE(listener.ok()) << listener.status();
  const uint64_t id = 77;
  absl::StatusOr<std::unique_ptr<KvLink>> accepted;
  const std::string key(kKvLinkKeyBytes, 'k');
  std::thread acceptor(
      [&] { accepted = (*listener)->Accept(id, key, memory_, absl::Seconds(10)); });
  // A connection that names another link, or this one without its key, is turned away (it
  // cannot tell: the listener closes it); the right one is taken.
  auto stray =
      ConnectTcpKvLink("127.0.0.1", (*listener)->port(), id + 1, key, memory_, absl::Seconds(10));
  auto keyless = ConnectTcpKvLink("127.0.0.1", (*listener)->port(), id,
                                  std::string(kKvLinkKeyBytes, 'x'), memory_, absl::Seconds(10));
  auto sender =
      ConnectTcpKvLink("127.0.0.1", (*listener)->port(), id, key, memory_, absl::Seconds(10));
  acceptor.join();
  // The impostor's connection is closed at the other end.
  ASSERT_TRUE(keyless.ok()) << keyless.status();
  {
    const absl::Status st =
        (*keyless)->Recv(Device(std::vector<uint8_t>(16)), 16, absl::Seconds(5));
    EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
    EXPECT_NE(st.message().find("closed"), std::string::npos) << st;
  }
  ASSERT_TRUE(sender.ok()) << sender.status();
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  EXPECT_STREQ((*sender)->kind(), "tcp");
  const std::vector<uint8_t> a = RandomBytes(3 << 20, 1), b = RandomBytes(17, 2);
  uint8_t* from_a = Device(a);
  uint8_t* from_b = Device(b);
  uint8_t* to_a = Device(std::vector<uint8_t>(a.size()));
  uint8_t* to_b = Device(std::vector<uint8_t>(b.size()));
  std::thread send([&] {
    EXPECT_TRUE((*sender)->Send(from_a, a.size(), absl::Seconds(10)).ok());
    EXPECT_TRUE((*sender)->Send(from_b, b.size(), absl::Seconds(10)).ok());
  });
  ASSERT_TRUE((*accepted)->Recv(to_a, a.size(), absl::Seconds(10)).ok());
  ASSERT_TRUE((*accepted)->Recv(to_b, b.size(), absl::Seconds(10)).ok());
  send.join();
  EXPECT_EQ(Host(to_a, a.size()), a);
  EXPECT_EQ(Host(to_b, b.size()), b);
  // Nothing comes: the wait ends, and the link is broken from then on.
  const absl::Status late = (*accepted)->Recv(to_b, b.size(), absl::Milliseconds(100));
  EXPECT_EQ(late.code(), absl::StatusCode::kDeadlineExceeded) << late;
  EXPECT_EQ((*accepted)->Recv(to_b, b.size(), absl::Seconds(10)), late);
  // Its end was shut down: the sender finds out (a payload larger than the socket's buffers).
  EXPECT_FALSE((*sender)->Send(from_a, a.size(), absl::Seconds(5)).ok());
}

// The IPC link: a TCP connection for the lengths and acknowledgements, the payloads through a
// buffer the receiver's memory shares and the sender's maps by its handle (here two guarded
// memories, as two processes on one device would have), in pieces of the buffer's size.
TEST_F(KvLinkTest, IpcLinkCarriesPayloadsThroughASharedBuffer) {
  std::unique_ptr<Backend> other = MakeGuardedKvBackend(MakeCpuBackend(CpuBackendOptions{}));
  const KvMemory sender_memory = *other->DeviceKvMemory();
  ASSERT_FALSE(memory_.device.empty());
  EXPECT_EQ(sender_memory.device, memory_.device);  // one machine: one "device"

  const size_t buffer_bytes = 64 << 10;
  std::string handle;
  uint8_t* owned = memory_.alloc_shared(buffer_bytes, &handle);
  ASSERT_NE(owned, nullptr);
  std::string error;
  EXPECT_EQ(sender_memory.open_shared("/tripod-kv-no-such-buffer", &error), nullptr);
  EXPECT_NE(error.find("no-such-buffer"), std::string::npos) << error;
  uint8_t* mapped = sender_memory.open_shared(handle, &error);
  ASSERT_NE(mapped, nullptr) << error;

  auto listener = TcpKvLinkListener::Listen("127.0.0.1");
  ASSERT_TRUE(listener.ok()) << listener.status();
  const std::string key(kKvLinkKeyBytes, 'i');
  absl::StatusOr<std::unique_ptr<KvLink>> accepted;
  std::thread acceptor([&] {
    accepted = (*listener)->Accept(5, key, memory_, absl::Seconds(10),
                                   KvLinkSharedBuffer{owned, buffer_bytes, memory_.free});
  });
  auto sender =
      ConnectTcpKvLink("127.0.0.1", (*listener)->port(), 5, key, sender_memory, absl::Seconds(10),
                       KvLinkSharedBuffer{mapped, buffer_bytes, sender_memory.close_shared});
  acceptor.join();
  ASSERT_TRUE(sender.ok()) << sender.status();
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  EXPECT_STREQ((*sender)->kind(), "ipc");
  EXPECT_STREQ((*accepted)->kind(), "ipc");

  // 3 MiB (49 pieces, the last one short), one byte less than a piece, nothing, and one piece.
  const std::vector<std::vector<uint8_t>> payloads = {
      RandomBytes(3 << 20, 3), RandomBytes(buffer_bytes - 1, 4), {}, RandomBytes(buffer_bytes, 5)};
  std::vector<uint8_t*> from, to;
  for (const auto& p : payloads) {
    from.push_back(p.empty() ? nullptr : other_alloc(sender_memory, p));
    to.push_back(p.empty() ? nullptr : Device(std::vector<uint8_t>(p.size())));
  }
  std::thread send([&] {
    for (size_t i = 0; i < payloads.size(); ++i) {
      EXPECT_TRUE((*sender)->Send(from[i], payloads[i].size(), absl::Seconds(10)).ok()) << i;
    }
  });
  for (size_t i = 0; i < payloads.size(); ++i) {
    ASSERT_TRUE((*accepted)->Recv(to[i], payloads[i].size(), absl::Seconds(10)).ok()) << i;
  }
  send.join();
  for (size_t i = 0; i < payloads.size(); ++i) {
    if (!payloads[i].empty()) {
      EXPECT_EQ(Host(to[i], payloads[i].size()), payloads[i]) << i;
    }
  }
  // Nothing more comes: the wait ends and the link breaks; the sender then finds its end shut.
  const absl::Status late = (*accepted)->Recv(to[0], 16, absl::Milliseconds(100));
  EXPECT_EQ(late.code(), absl::StatusCode::kDeadlineExceeded) << late;
  EXPECT_FALSE((*sender)->Send(from[0], payloads[0].size(), absl::Seconds(5)).ok());

  // The links release the buffer: the owner's is freed (its name unlinked), the view unmapped.
  sender->reset();
  accepted->reset();
  for (size_t i = 0; i < payloads.size(); ++i) {
    if (from[i] != nullptr) sender_memory.free(from[i]);
  }
  EXPECT_EQ(sender_memory.open_shared(handle, &error), nullptr);
}

TEST_F(KvLinkTest, NobodyJoiningTimesTheSetUpOut) {
  auto listener = TcpKvLinkListener::Listen("127.0.0.1");
  ASSERT_TRUE(listener.ok());
  const std::string key(kKvLinkKeyBytes, 'n');
  auto none = (*listener)->Accept(1, key, memory_, absl::Milliseconds(100));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kDeadlineExceeded) << none.status();
  // An IPC link's buffer is released when its set-up fails.
  std::string handle, error;
  uint8_t* owned = memory_.alloc_shared(4096, &handle);
  ASSERT_NE(owned, nullptr);
  none = (*listener)->Accept(1, key, memory_, absl::Milliseconds(100),
                             KvLinkSharedBuffer{owned, 4096, memory_.free});
  EXPECT_FALSE(none.ok());
  EXPECT_EQ(memory_.open_shared(handle, &error), nullptr);
  if (!NcclLinksBuilt()) {
    EXPECT_EQ(NewNcclLinkId().status().code(), absl::StatusCode::kFailedPrecondition);
  }
}

// The receiver's checks of a chunk whose payload came on a link.
TEST_F(KvLinkTest, TheReceiverChecksLinkChunksAndScattersTheirRows) {
  const KvLayout layout{2, 2, 64, KvDtype::kF16};
  auto src = ContiguousKvCache::Create(layout, 1, 20);
  auto dst = ContiguousKvCache::Create(layout, 1, 20, memory_);
  ASSERT_TRUE(src.ok() && dst.ok());
  // Random rows in the source, through a snapshot.
  KvSnapshot s;
  s.layout = layout;
  s.n_slots = 20;
  s.k = RandomBytes(2 * 2 * 20 * 128, 3);
  s.v = RandomBytes(2 * 2 * 20 * 128, 4);
  for (size_t i = 1; i < s.k.size(); i += 2) s.k[i] &= 0x3b, s.v[i] &= 0x3b;  // finite f16
  ASSERT_TRUE(WriteSnapshot(s, **src, 0).ok());
  v1::KvChunk c;
  EncodeKvChunk(**src, 0, 0, 2, 0, 20, &c);
  const std::string payload = c.payload();
  uint8_t* rows = Device(std::vector<uint8_t>(payload.begin(), payload.end()));
  c.clear_payload();
  c.set_transfer_id(5);
  c.set_link_id(9);
  c.set_link_bytes(payload.size());
  {
    KvChunkReceiver rx(5, layout, 20, 20);
    EXPECT_FALSE(rx.Accept(c, **dst, 0).ok());  // a link chunk whose payload never came
  }
  {
    KvChunkReceiver rx(5, layout, 20, 20);
    v1::KvChunk wrong = c;
    wrong.set_link_bytes(payload.size() - 2);
    const absl::Status st = rx.Accept(wrong, **dst, 0, rows);
    EXPECT_NE(st.message().find("the link payload holds"), std::string::npos) << st;
  }
  {
    KvChunkReceiver rx(5, layout, 20, 20);
    v1::KvChunk both = c;
    both.set_payload(payload);
    EXPECT_FALSE(rx.Accept(both, **dst, 0, rows).ok());
  }
  KvChunkReceiver rx(5, layout, 20, 20);
  ASSERT_TRUE(rx.Accept(c, **dst, 0, rows).ok());
  EXPECT_EQ(rx.bytes(), payload.size());
  auto back = ExportSnapshot(**dst, 0, 20);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->k, s.k);
  EXPECT_EQ(back->v, s.v);
}

}  // namespace
}  // namespace tripod
