// KvLinks: the decode worker's side of KV links (Decode.OpenKvLink; common/kv_transfer/kv_link.h).
// It decides whether a link of the asked kind can exist here, sets it up (the NCCL communicator's
// unique id handed out and this worker joining as rank 1, or a TCP port listened on, with a
// shared buffer for an IPC link: granted in NCCL's place when both ends are on one device), and
// receives link payloads for the PushKv handlers: strictly in the link's order (link_seq), since
// both ends of a link must make their calls in one order, whatever order the headers arrive in on
// their separate streams. Before a payload's bytes are taken its header is checked (its size
// within the largest chunk, its ranges against the transfer's reservation: no allocation sized by
// the wire before that); after, a TCP or IPC link's payload against its HMAC-SHA256 under the
// link's key (kv_link_auth.h), an NCCL link's against its KvLinkHash, before anyone uses it.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/kv/kv_layout.h"
#include "common/kv/kv_memory.h"
#include "common/kv_transfer/kv_link.h"
#include "common/util/mutex.h"
#include "tripod/v1/decode.pb.h"
#include "tripod/v1/kv_chunk.pb.h"

namespace tripod {

struct KvLinksOptions {
  bool nccl = false;  // this worker's KV is in a GPU's memory and the build has NCCL
  bool tcp = false;   // --kv_links allows TCP links (tests: KV out of the host's reach, no GPU)
  // --kv_links allows IPC links: to a prefill worker on this worker's device, in NCCL's place
  // (the memory must share allocations: KvMemory::alloc_shared).
  bool ipc = false;
  size_t ipc_buffer_bytes = size_t{64} << 20;  // one IPC link's buffer: payloads pass in pieces
  std::string tcp_host = "127.0.0.1";          // where TCP links listen (the gRPC address's host)
  absl::Duration open_timeout = absl::Seconds(10);  // the other end joins within this
  absl::Duration io_timeout = absl::Seconds(30);    // one payload, and one turn, within this
  int max_links = 64;                               // open or opening at once
  // The largest payload a chunk may carry (the sender's split: kMaxKvChunkPayload, or one slot of
  // one layer when that is more); a header naming more closes its link.
  size_t max_payload_bytes = size_t{1} << 20;
};

// The decode worker's --kv_links list (nccl | ipc | tcp | none, comma-separated) as options:
// nccl only with the CUDA backend in a build with NCCL; TCP links listen on `tcp_host`.
absl::StatusOr<KvLinksOptions> ParseKvLinks(absl::string_view kinds, absl::string_view backend,
                                            std::string tcp_host);

class KvLinks {
 public:
  // memory: the KV store's (null: host memory, which no link serves). dtype: the store's.
  KvLinks(const KvLinksOptions& options, const KvMemory* memory, KvDtype dtype);
  ~KvLinks();  // joins the set-up threads (each bounded by open_timeout)

  // Decode.OpenKvLink: a new link's id and what the other end needs to join, or
  // FAILED_PRECONDITION saying why this worker holds none of that kind. The set-up finishes in
  // the background; payloads wait for it (Receive).
  absl::StatusOr<v1::OpenKvLinkResponse> Open(const v1::OpenKvLinkRequest& request);

  // The payload of a link chunk (header.link_*), received into device memory when its turn on
  // the link comes, then checked (link_mac, or link_hash on NCCL) and handed to `use` (which
  // scatters it into the reservation; valid during the call only). `check` (the header against
  // the reservation) runs first, when the turn comes: a refused header's payload is taken off the
  // link and dropped, and its status returned. A link that fails (a payload larger than
  // max_payload_bytes among them) is closed: later chunks on it fail at once (UNAVAILABLE), and
  // the prefill worker falls back to PushKv payloads.
  absl::Status Receive(const v1::KvChunk& header, const std::function<absl::Status()>& check,
                       const std::function<absl::Status(const uint8_t* rows)>& use);

  int open_links() const;

 private:
  struct Link;
  std::shared_ptr<Link> Find(uint64_t id) const;

  const KvLinksOptions options_;
  const KvMemory* const memory_;
  const KvDtype dtype_;
  mutable Mutex mu_;
  std::map<uint64_t, std::shared_ptr<Link>> links_ ABSL_GUARDED_BY(mu_);
  struct Setup {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;  // the thread is about to end: join it
  };
  // Reaped by the next Open, the rest joined at the end.
  std::vector<Setup> setups_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tripod
