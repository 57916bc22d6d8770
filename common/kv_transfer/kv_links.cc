// KvLinks; see kv_links.h.
#include "common/kv_transfer/kv_links.h"

#include <algorithm>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/kv_transfer/kv_chunk_codec.h"
#include "common/kv_transfer/kv_link_auth.h"
#include "common/kv_transfer/nccl_kv_link.h"
#include "common/kv_transfer/tcp_kv_link.h"
#include "common/util/status_macros.h"

namespace tripod {

absl::StatusOr<KvLinksOptions> ParseKvLinks(absl::string_view kinds, absl::string_view backend,
                                            std::string tcp_host) {
  KvLinksOptions links;
  for (absl::string_view kind : absl::StrSplit(kinds, ',')) {
    if (kind == "nccl") {
      links.nccl = backend == "cuda" && NcclLinksBuilt();
    } else if (kind == "tcp") {
      links.tcp = true;
    } else if (kind == "ipc") {
      links.ipc = true;
    } else if (kind != "none" && !kind.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--kv_links: unknown kind '", kind, "' (nccl | ipc | tcp | none)"));
    }
  }
  links.tcp_host = std::move(tcp_host);
  return links;
}

struct KvLinks::Link {
  Mutex mu;
  CondVar cv;
  std::unique_ptr<KvLink> link ABSL_GUARDED_BY(mu);  // set once the other end joined
  absl::Status failed ABSL_GUARDED_BY(mu);           // set-up or a payload failed: the link is gone
  uint64_t next_seq ABSL_GUARDED_BY(mu) = 0;         // the next payload's link_seq
  // Device memory for one payload, grown as needed.
  uint8_t* buffer ABSL_GUARDED_BY(mu) = nullptr;
  size_t capacity ABSL_GUARDED_BY(mu) = 0;
  // TCP and IPC links: the key payloads are signed with (set before the link is shared, then
  // constant), and a host copy of one payload for its MAC. Empty for NCCL (KvLinkHash).
  std::string key;
  std::vector<uint8_t> host ABSL_GUARDED_BY(mu);
};

KvLinks::KvLinks(const KvLinksOptions& options, const KvMemory* memory, KvDtype dtype)
    : options_(options), memory_(memory), dtype_(dtype) {
  MutexLock lock(&mu_);
  next_id_ = std::random_device{}() | 1;
}

KvLinks::~KvLinks() {
  std::vector<Setup> setups;
  {
    MutexLock lock(&mu_);
    setups.swap(setups_);
  }
  for (Setup& s : setups) s.thread.join();
  MutexLock lock(&mu_);
  for (auto& [id, l] : links_) {
    MutexLock hold(&l->mu);
    if (l->buffer != nullptr) memory_->free(l->buffer);
  }
}

int KvLinks::open_links() const {
  MutexLock lock(&mu_);
  return static_cast<int>(links_.size());
}

absl::StatusOr<v1::OpenKvLinkResponse> KvLinks::Open(const v1::OpenKvLinkRequest& req) {
  const bool asked_nccl = req.kind() == v1::KV_LINK_NCCL, tcp = req.kind() == v1::KV_LINK_TCP,
             asked_ipc = req.kind() == v1::KV_LINK_IPC;
  if (!asked_nccl && !tcp && !asked_ipc) {
    return absl::InvalidArgumentError("OpenKvLink: no such link kind");
  }
  if (memory_ == nullptr || !memory_->gather_rows || !memory_->scatter_rows || !memory_->hash) {
    return absl::FailedPreconditionError(
        "OpenKvLink: this decode worker keeps its KV in host memory (--backend cpu): payloads "
        "travel in the PushKv messages");
  }
  // Both ends on this worker's device: NCCL cannot put two ranks there, a shared buffer can.
  const bool same_device =
      !req.device().empty() && !memory_->device.empty() && req.device() == memory_->device;
  const bool ipc = (asked_ipc || asked_nccl) && options_.ipc && same_device &&
                   memory_->alloc_shared && memory_->free;
  const bool nccl = asked_nccl && !ipc;
  if (asked_ipc && !ipc) {
    return absl::FailedPreconditionError(
        !options_.ipc ? "OpenKvLink: this decode worker takes no IPC links (--kv_links)"
        : !same_device
            ? absl::StrCat("OpenKvLink: the prefill worker's device (", req.device(),
                           ") is not this worker's (", memory_->device, "): no IPC link")
            : "OpenKvLink: this decode worker's KV memory cannot be shared with another process");
  }
  if (nccl && !options_.nccl) {
    return absl::FailedPreconditionError(
        NcclLinksBuilt() ? "OpenKvLink: this decode worker's KV is not in a GPU's memory"
                         : "OpenKvLink: this decode worker was built without NCCL");
  }
  if (tcp && !options_.tcp) {
    return absl::FailedPreconditionError(
        "OpenKvLink: this decode worker takes no TCP links (--kv_links)");
  }
  KvDtype theirs;
  if (!KvDtypeFromWire(req.kv_dtype(), &theirs) || theirs != dtype_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "OpenKvLink: the prefill worker's KV type is not this worker's (", KvDtypeName(dtype_),
        "): rows are converted on landing, which only PushKv payloads do"));
  }
  v1::OpenKvLinkResponse resp;
  resp.set_open_timeout_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(options_.open_timeout)));
  resp.set_kind(ipc ? v1::KV_LINK_IPC : nccl ? v1::KV_LINK_NCCL : v1::KV_LINK_TCP);
  auto link = std::make_shared<Link>();
  if (!nccl) {
    absl::StatusOr<std::string> key = KvLinkRandomBytes(kKvLinkKeyBytes);
    if (!key.ok()) return key.status();
    link->key = *key;
    resp.set_link_key(link->key);
  }
  std::string nccl_id;
  std::unique_ptr<TcpKvLinkListener> listener;
  KvLinkSharedBuffer shared;
  if (nccl) {
    absl::StatusOr<std::string> id = NewNcclLinkId();
    if (!id.ok()) return absl::FailedPreconditionError(id.status().message());
    nccl_id = *id;
    resp.set_nccl_unique_id(nccl_id);
  } else {
    absl::StatusOr<std::unique_ptr<TcpKvLinkListener>> l =
        TcpKvLinkListener::Listen(options_.tcp_host);
    if (!l.ok()) return absl::FailedPreconditionError(l.status().message());
    listener = std::move(*l);
    resp.set_tcp_port(listener->port());
  }
  if (ipc) {
    std::string handle;
    shared.bytes = std::max<size_t>(options_.ipc_buffer_bytes, 1);
    shared.p = memory_->alloc_shared(shared.bytes, &handle);
    if (shared.p == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "OpenKvLink: no device memory to share for an IPC link's buffer of ", shared.bytes));
    }
    shared.release = memory_->free;
    resp.set_ipc_handle(handle);
    resp.set_ipc_bytes(shared.bytes);
  }
  uint64_t id;
  {
    MutexLock lock(&mu_);
    // Drop links that failed (their set-up threads are done with them).
    for (auto it = links_.begin(); it != links_.end();) {
      bool failed;
      {
        MutexLock l(&it->second->mu);
        failed = !it->second->failed.ok();
      }
      // Erased once its lock is let go: this may free it.
      it = failed ? links_.erase(it) : std::next(it);
    }
    if (static_cast<int>(links_.size()) >= options_.max_links) {
      if (shared.p != nullptr) memory_->free(shared.p);
      return absl::ResourceExhaustedError(
          absl::StrCat("OpenKvLink: ", links_.size(), " links are open already"));
    }
    id = next_id_;
    next_id_ += 2;
    links_[id] = link;
    resp.set_link_id(id);
    // Set-up threads that are done are joined here, so that they do not pile up.
    std::erase_if(setups_, [](Setup& s) {
      if (!s.done->load()) return false;
      s.thread.join();
      return true;
    });
    // The other end joins in the background; Receive waits for it.
    auto done = std::make_shared<std::atomic<bool>>(false);
    std::thread setup([this, link, id, nccl_id, done, shared,
                       listener = std::shared_ptr<TcpKvLinkListener>(std::move(listener))] {
      absl::StatusOr<std::unique_ptr<KvLink>> made =
          listener ? listener->Accept(id, link->key, *memory_, options_.open_timeout, shared)
                   : OpenNcclLink(nccl_id, /*rank=*/1, options_.open_timeout);
      MutexLock lock(&link->mu);
      if (made.ok()) {
        link->link = std::move(*made);
      } else {
        link->failed = absl::UnavailableError(
            absl::StrCat("KV link ", id, " was never joined: ", made.status().message()));
      }
      link->cv.SignalAll();
      done->store(true);
    });
    setups_.push_back(Setup{std::move(setup), std::move(done)});
  }
  return resp;
}

std::shared_ptr<KvLinks::Link> KvLinks::Find(uint64_t id) const {
  MutexLock lock(&mu_);
  const auto it = links_.find(id);
  return it == links_.end() ? nullptr : it->second;
}

absl::Status KvLinks::Receive(const v1::KvChunk& h, const std::function<absl::Status()>& check,
                              const std::function<absl::Status(const uint8_t* rows)>& use) {
  std::shared_ptr<Link> l = Find(h.link_id());
  if (l == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("chunk ", h.seq(), ": no KV link ", h.link_id(), " on this decode worker"));
  }
  MutexLock lock(&l->mu);
  const absl::Time deadline = absl::Now() + options_.io_timeout;
  // The link's set-up, then this payload's turn.
  while (l->failed.ok() && (l->link == nullptr || l->next_seq != h.link_seq())) {
    if (h.link_seq() < l->next_seq) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk ", h.seq(), ": link payload ", h.link_seq(), " came already"));
    }
    if (l->cv.WaitWithDeadline(&l->mu, deadline) && absl::Now() >= deadline) {
      l->failed = absl::UnavailableError(absl::StrCat(
          "KV link ", h.link_id(), ": payload ", h.link_seq(), "'s turn never came (waiting for ",
          l->link == nullptr ? "the set-up" : absl::StrCat("payload ", l->next_seq), ")"));
      l->cv.SignalAll();
    }
  }
  if (!l->failed.ok()) return l->failed;
  const size_t bytes = h.link_bytes();
  if (bytes > options_.max_payload_bytes) {
    // No sender of ours names that much: the link is closed rather than read that far.
    l->failed = absl::InvalidArgumentError(absl::StrCat(
        "chunk ", h.seq(), ": a link payload of ", bytes, " bytes, more than any chunk carries (",
        options_.max_payload_bytes, "): KV link ", h.link_id(), " closed"));
    l->cv.SignalAll();
    return l->failed;
  }
  const absl::Status refused = check();
  if (bytes > l->capacity) {
    if (l->buffer != nullptr) memory_->free(l->buffer);
    l->buffer = memory_->alloc(bytes);
    l->capacity = l->buffer != nullptr ? bytes : 0;
    if (l->buffer == nullptr) {
      l->failed = absl::ResourceExhaustedError(
          absl::StrCat("KV link ", h.link_id(), ": no device memory for a payload of ", bytes));
      l->cv.SignalAll();
      return l->failed;
    }
  }
  if (absl::Status st = l->link->Recv(l->buffer, bytes, options_.io_timeout); !st.ok()) {
    l->failed = st;
    l->cv.SignalAll();
    return st;
  }
  ++l->next_seq;
  l->cv.SignalAll();
  // A refused header's payload is dropped; the link stays in step for the ones after it.
  if (!refused.ok()) return refused;
  // The bytes arrived whole, in order: a payload that fails its check fails its chunk, and the
  // link goes on (the next payload is checked on its own).
  if (!l->key.empty()) {
    l->host.resize(bytes);
    memory_->to_host(l->host.data(), l->buffer, bytes);
    RETURN_IF_ERROR(
        VerifyKvLinkPayloadMac(l->key, h, KvLinkPayloadDigest(l->host.data(), l->host.size())));
  } else if (memory_->hash(l->buffer, bytes) != h.link_hash()) {
    return absl::DataLossError(
        absl::StrCat("chunk ", h.seq(), ": checksum mismatch (KvLinkHash of the link payload)"));
  }
  // Still under the link's lock: the buffer is the next payload's as soon as it is let go.
  return use(l->buffer);
}

}  // namespace tripod
