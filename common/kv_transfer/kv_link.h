// KvLink: a data path for KV-chunk payloads in device memory between one prefill worker and one
// decode worker (Decode.OpenKvLink sets it up). The chunk headers, checks and acknowledgements
// stay on the PushKv stream; only the payload bytes take the link. Implementations: NCCL
// (nccl_kv_link.h, GPU to GPU; built into tripod_cuda from nccl/) and TCP (tcp_kv_link.h, the
// same protocol on machines without GPUs; with a shared device buffer, the IPC link).
//
// A new kind of link: implement KvLink here, name it in proto KvLinkKind, make the decode end in
// KvLinks::Open (kv_links.cc) and the prefill end in KvLinkCache::Open (kv_link_cache.cc). The
// sender and the receiver use any KvLink as they find it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace tripod {

class KvLink {
 public:
  virtual ~KvLink() = default;
  virtual const char* kind() const = 0;  // "nccl" | "tcp"
  // `bytes` of the KV store's device memory to, or from, the other end, in the order both ends
  // call them; waits at most `timeout`. After an error the link is broken: every later call fails
  // at once with that error. Thread-safe (one call at a time).
  virtual absl::Status Send(const uint8_t* device, size_t bytes, absl::Duration timeout) = 0;
  virtual absl::Status Recv(uint8_t* device, size_t bytes, absl::Duration timeout) = 0;
};

}  // namespace tripod
