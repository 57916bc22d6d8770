// OpenKvLink: the prefill end of a KV link that is up (KvLinkCache opens it, KvSender sends
// payloads on it). A transfer holds `mu` from taking a payload's link_seq to the end of its Send,
// so that payloads leave in link_seq order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/kv/kv_memory.h"
#include "common/kv_transfer/kv_link.h"
#include "common/util/mutex.h"

namespace tripod {

struct OpenKvLink {
  ~OpenKvLink();
  uint64_t id = 0;
  std::string peer;
  std::unique_ptr<KvLink> link;
  // TCP and IPC links: the key each payload is signed with (kv_link_auth.h). Empty for NCCL.
  std::string key;
  const KvMemory* memory = nullptr;
  Mutex mu;
  uint64_t next_seq ABSL_GUARDED_BY(mu) = 0;
  uint8_t* buffer ABSL_GUARDED_BY(mu) = nullptr;  // device memory for one payload, grown as needed
  size_t capacity ABSL_GUARDED_BY(mu) = 0;
  std::vector<uint8_t> host ABSL_GUARDED_BY(mu);  // a payload's host copy, for its MAC
  // A Send failed: the link is out of step, never used again.
  bool failed ABSL_GUARDED_BY(mu) = false;
};

}  // namespace tripod
