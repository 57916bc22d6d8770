// KvLinkCache: the prefill worker's KV links (common/kv_transfer/kv_link.h), one per decode worker,
// opened on first use through Decode.OpenKvLink, and the choice of path for each transfer: the
// link when one is open or opens now, else the chunk payloads in the PushKv messages. A decode
// worker that refuses a link (its KV is on the CPU, no NCCL, another element type) or a link that
// fails is not asked again for `retry_after`, doubled after each failure in a row (up to 64x).
// A link is set up on a thread of its own (an NCCL communicator takes a while to come up, a
// set-up that times out longer): the engine never waits for one, and the transfers meanwhile
// send their payloads in the PushKv messages. Every fallback is counted, with its reason.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/kv/kv_layout.h"
#include "common/kv/kv_memory.h"
#include "common/kv_transfer/kv_link.h"
#include "common/kv_transfer/open_kv_link.h"
#include "common/util/mutex.h"
#include "grpcpp/grpcpp.h"

namespace tripod {

enum class KvLinkMode {
  kNone,  // payloads always in the PushKv messages
  kAuto,  // on a GPU: NCCL (the build has it), or IPC where the decode worker shares the GPU
  kNccl,  // NCCL, or IPC on one GPU (refused at start-up without a GPU backend)
  kTcp,   // the same protocol over TCP (tests: a KV out of the host's reach without a GPU)
  kIpc,   // a shared buffer on one device only (tests: the guarded memory's shared objects)
};
absl::StatusOr<KvLinkMode> ParseKvLinkMode(std::string_view name);

struct KvLinkCacheOptions {
  KvLinkMode mode = KvLinkMode::kNone;
  bool nccl = false;  // this worker's KV is in a GPU's memory and the build has NCCL
  bool gpu = false;   // this worker's KV is in a GPU's memory (an IPC link may serve)
  absl::Duration open_timeout = absl::Seconds(10);
  absl::Duration io_timeout = absl::Seconds(30);
  absl::Duration retry_after = absl::Seconds(60);
};

class KvLinkCache {
 public:
  // memory: the engine's KV memory (null: host, no link ever). dtype: its element type.
  // on_link(kind): a transfer takes a link; on_fallback(reason): a transfer that could have
  // taken one takes PushKv payloads.
  KvLinkCache(const KvLinkCacheOptions& options, const KvMemory* memory, KvDtype dtype,
              std::function<void(const char* kind)> on_link = {},
              std::function<void(const std::string& reason)> on_fallback = {});
  ~KvLinkCache();  // joins the set-ups (each bounded by open_timeout)

  // Whether links are ever tried.
  bool enabled() const;
  // The open link to `address`, or null: payloads go in the PushKv messages. With none open or
  // being set up, and the last refusal or failure older than its backoff, starts setting one up
  // over `channel` in the background. Never waits for the network.
  std::shared_ptr<OpenKvLink> Get(const std::string& address,
                                  const std::shared_ptr<grpc::Channel>& channel);
  // A link that failed: forgotten, and not retried for retry_after.
  void Failed(const std::shared_ptr<OpenKvLink>& link, const absl::Status& why);

 private:
  struct Peer {
    std::shared_ptr<OpenKvLink> link;
    absl::Time retry_at = absl::InfinitePast();
    std::string reason;  // why there is none
    int failures = 0;    // refusals and failures in a row
    bool opening = false;
  };
  struct Setup {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  // Sets p's next try after one more failure; mu_ held.
  void Backoff(Peer& p, std::string reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::shared_ptr<OpenKvLink>> Open(const std::string& address,
                                                   const std::shared_ptr<grpc::Channel>& channel);

  const KvLinkCacheOptions options_;
  const KvMemory* const memory_;
  const KvDtype dtype_;
  const std::function<void(const char*)> on_link_;
  const std::function<void(const std::string&)> on_fallback_;
  Mutex mu_;
  std::map<std::string, Peer> peers_ ABSL_GUARDED_BY(mu_);
  // Reaped by the next set-up, the rest joined at the end.
  std::vector<Setup> setups_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tripod
