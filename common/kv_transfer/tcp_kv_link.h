// The TCP KvLink: the KV link's protocol (Decode.OpenKvLink, payloads in link order beside their
// PushKv headers, KvLinkHash) over a plain TCP connection, for machines without GPUs, where NCCL
// cannot run: the payload is copied out of device memory (the store's KvMemory) at the sending end
// and into it at the receiving end. The decode worker listens (one port per link, one connection,
// which must name the link and answer the listener's random challenge with the link's key:
// kv_link_auth.h), the prefill worker connects. The IPC link is the same
// connection with a shared device buffer for the payloads (KvLinkSharedBuffer).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/kv/kv_memory.h"
#include "common/kv_transfer/kv_link.h"

namespace tripod {

// An IPC link's buffer (KV_LINK_IPC: two processes on one device): device memory both ends map,
// the decode worker's (KvMemory::alloc_shared) and the prefill worker's view of it (open_shared).
// A link with one passes each payload through it, in pieces of its size, device to device; the
// TCP connection then carries only each piece's length and the receiver's word that it took it.
struct KvLinkSharedBuffer {
  uint8_t* p = nullptr;
  size_t bytes = 0;
  std::function<void(uint8_t*)> release;  // KvMemory::free (the owner) or close_shared
};

class TcpKvLinkListener {
 public:
  // Listens on an ephemeral port of `host` (an address of this machine).
  static absl::StatusOr<std::unique_ptr<TcpKvLinkListener>> Listen(const std::string& host);
  ~TcpKvLinkListener();
  int port() const { return port_; }
  // Waits at most `timeout` for the connection that names `link_id` and proves `key` (others are
  // closed), and makes it a link whose payloads move through `memory`'s copies (which must
  // outlive it), and through `shared` when it holds a buffer (released with the link, or here on
  // failure).
  absl::StatusOr<std::unique_ptr<KvLink>> Accept(uint64_t link_id, const std::string& key,
                                                 const KvMemory& memory, absl::Duration timeout,
                                                 KvLinkSharedBuffer shared = {});

 private:
  TcpKvLinkListener(int fd, int port) : fd_(fd), port_(port) {}
  int fd_;
  int port_;
};

// Joins link `link_id` at host:port, proving `key` (the OpenKvLink reply's).
absl::StatusOr<std::unique_ptr<KvLink>> ConnectTcpKvLink(const std::string& host, int port,
                                                         uint64_t link_id, const std::string& key,
                                                         const KvMemory& memory,
                                                         absl::Duration timeout,
                                                         KvLinkSharedBuffer shared = {});

}  // namespace tripod
