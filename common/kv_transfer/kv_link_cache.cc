// KvLinkCache; see kv_link_cache.h.
#include "common/kv_transfer/kv_link_cache.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/kv_transfer/kv_chunk_codec.h"
#include "common/kv_transfer/kv_link_auth.h"
#include "common/kv_transfer/nccl_kv_link.h"
#include "common/kv_transfer/tcp_kv_link.h"
#include "common/rpc/protocol.h"
#include "spdlog/spdlog.h"
#include "tripod/v1/decode.grpc.pb.h"

namespace tripod {

absl::StatusOr<KvLinkMode> ParseKvLinkMode(std::string_view name) {
  if (name == "none") return KvLinkMode::kNone;
  if (name == "auto") return KvLinkMode::kAuto;
  if (name == "nccl") return KvLinkMode::kNccl;
  if (name == "tcp") return KvLinkMode::kTcp;
  if (name == "ipc") return KvLinkMode::kIpc;
  return absl::InvalidArgumentError(absl::StrCat("unknown KV link mode '", std::string(name),
                                                 "' (auto | none | nccl | ipc | tcp)"));
}

OpenKvLink::~OpenKvLink() {
  if (buffer != nullptr) memory->free(buffer);
}

KvLinkCache::KvLinkCache(const KvLinkCacheOptions& options, const KvMemory* memory, KvDtype dtype,
                         std::function<void(const char*)> on_link,
                         std::function<void(const std::string&)> on_fallback)
    : options_(options),
      memory_(memory),
      dtype_(dtype),
      on_link_(std::move(on_link)),
      on_fallback_(std::move(on_fallback)) {}

bool KvLinkCache::enabled() const {
  const bool kind = options_.mode == KvLinkMode::kTcp || options_.mode == KvLinkMode::kNccl ||
                    options_.mode == KvLinkMode::kIpc ||
                    (options_.mode == KvLinkMode::kAuto && (options_.nccl || options_.gpu));
  return kind && memory_ != nullptr && memory_->gather_rows && memory_->hash;
}

KvLinkCache::~KvLinkCache() {
  std::vector<Setup> setups;
  {
    MutexLock lock(&mu_);
    setups.swap(setups_);
  }
  for (Setup& s : setups) s.thread.join();
}

std::shared_ptr<OpenKvLink> KvLinkCache::Get(const std::string& address,
                                             const std::shared_ptr<grpc::Channel>& channel) {
  if (!enabled()) return nullptr;
  std::string reason;
  {
    MutexLock lock(&mu_);
    Peer& p = peers_[address];
    if (p.link != nullptr) {
      if (on_link_) on_link_(p.link->link->kind());
      return p.link;
    }
    if (p.opening) {
      reason = "a KV link is being set up";
    } else if (absl::Now() < p.retry_at) {
      reason = p.reason;
    } else {
      p.opening = true;
      reason = "a KV link is being set up";
      std::erase_if(setups_, [](Setup& s) {
        if (!s.done->load()) return false;
        s.thread.join();
        return true;
      });
      auto done = std::make_shared<std::atomic<bool>>(false);
      std::thread setup([this, address, channel, done] {
        absl::StatusOr<std::shared_ptr<OpenKvLink>> made = Open(address, channel);
        MutexLock lock(&mu_);
        Peer& p = peers_[address];
        p.opening = false;
        if (made.ok()) {
          p.link = *made;
          p.failures = 0;
          spdlog::info("KV link {} ({}) to {} open", p.link->id, p.link->link->kind(), address);
        } else {
          Backoff(p, std::string(made.status().message()));
          spdlog::warn("no KV link to {}: {}; payloads go in the PushKv messages until {}", address,
                       p.reason, absl::FormatTime(p.retry_at));
        }
        done->store(true);
      });
      setups_.push_back(Setup{std::move(setup), std::move(done)});
    }
  }
  if (on_fallback_) on_fallback_(reason);
  return nullptr;
}

void KvLinkCache::Failed(const std::shared_ptr<OpenKvLink>& link, const absl::Status& why) {
  MutexLock lock(&mu_);
  Peer& p = peers_[link->peer];
  if (p.link != link) return;
  p.link = nullptr;
  Backoff(p, absl::StrCat("KV link ", link->id, " failed: ", why.message()));
  spdlog::warn("KV link {} to {} failed: {}", link->id, link->peer, why.ToString());
}

void KvLinkCache::Backoff(Peer& p, std::string reason) {
  p.retry_at = absl::Now() + options_.retry_after * (int64_t{1} << std::min(p.failures, 6));
  ++p.failures;
  p.reason = std::move(reason);
}

absl::StatusOr<std::shared_ptr<OpenKvLink>> KvLinkCache::Open(
    const std::string& address, const std::shared_ptr<grpc::Channel>& channel) {
  // NCCL unless told otherwise or unbuilt; the decode worker grants IPC in its place when it
  // shares this worker's device.
  v1::KvLinkKind asked = v1::KV_LINK_NCCL;
  if (options_.mode == KvLinkMode::kTcp) asked = v1::KV_LINK_TCP;
  if (options_.mode == KvLinkMode::kIpc || (options_.mode == KvLinkMode::kAuto && !options_.nccl)) {
    asked = v1::KV_LINK_IPC;
  }
  v1::OpenKvLinkRequest req;
  req.set_kind(asked);
  req.set_kv_dtype(KvDtypeToWire(dtype_));
  req.set_device(memory_->device);
  v1::OpenKvLinkResponse resp;
  std::unique_ptr<grpc::ClientContext> ctx =
      NewClientContext(std::chrono::milliseconds(absl::ToInt64Milliseconds(options_.open_timeout)));
  const grpc::Status st = v1::Decode::NewStub(channel)->OpenKvLink(ctx.get(), req, &resp);
  if (!st.ok()) {
    return absl::Status(FromGrpcStatus(st).code(), absl::StrCat("the decode worker offers no ",
                                                                asked == v1::KV_LINK_NCCL  ? "NCCL"
                                                                : asked == v1::KV_LINK_IPC ? "IPC"
                                                                                           : "TCP",
                                                                " link: ", st.error_message()));
  }
  const v1::KvLinkKind kind = resp.kind() != v1::KV_LINK_UNSPECIFIED ? resp.kind() : asked;
  auto link = std::make_shared<OpenKvLink>();
  if (kind != v1::KV_LINK_NCCL) {
    if (absl::Status st = CheckKvLinkKey(resp.link_key()); !st.ok()) return st;
    link->key = resp.link_key();
  }
  link->id = resp.link_id();
  link->peer = address;
  link->memory = memory_;
  absl::StatusOr<std::unique_ptr<KvLink>> made;
  if (kind == v1::KV_LINK_NCCL) {
    made = OpenNcclLink(resp.nccl_unique_id(), /*rank=*/0, options_.open_timeout);
  } else {
    // The decode worker listens where its gRPC server does.
    const std::string host = address.substr(0, address.rfind(':'));
    const std::string bare =
        host.size() > 2 && host.front() == '[' ? host.substr(1, host.size() - 2) : host;
    KvLinkSharedBuffer shared;
    if (kind == v1::KV_LINK_IPC) {
      std::string error = "this worker's KV memory maps no other process's";
      if (memory_->open_shared) shared.p = memory_->open_shared(resp.ipc_handle(), &error);
      if (shared.p != nullptr && resp.ipc_bytes() == 0) {
        memory_->close_shared(shared.p);
        shared.p = nullptr;
        error = "the decode worker named no size for it";
      }
      if (shared.p == nullptr) {
        return absl::UnavailableError(
            absl::StrCat("the IPC link's buffer cannot be mapped here: ", error));
      }
      shared.bytes = resp.ipc_bytes();
      shared.release = memory_->close_shared;
    }
    made = ConnectTcpKvLink(bare, resp.tcp_port(), link->id, link->key, *memory_,
                            options_.open_timeout, std::move(shared));
  }
  if (!made.ok()) return made.status();
  link->link = std::move(*made);
  return link;
}

}  // namespace tripod
