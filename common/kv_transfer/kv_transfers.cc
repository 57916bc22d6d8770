// KvTransfers; see kv_transfers.h.
#include "common/kv_transfer/kv_transfers.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/kv_transfer/kv_chunk_codec.h"
#include "common/util/fmix64.h"
#include "common/util/status_macros.h"

namespace tripod {

const char* TransferStateName(TransferState s) {
  switch (s) {
    case TransferState::kReserved:
      return "reserved";
    case TransferState::kReceiving:
      return "receiving";
    case TransferState::kComplete:
      return "complete";
    case TransferState::kAdopted:
      return "adopted";
    case TransferState::kFailed:
      return "failed";
    case TransferState::kExpired:
      return "expired";
    case TransferState::kCancelled:
      return "cancelled";
  }
  return "?";
}

struct KvTransfers::Transfer {
  uint64_t id = 0;
  TransferState state = TransferState::kReserved;
  KvReservation res;
  int n_prompt = 0;
  uint64_t plan_key = 0;
  absl::Time created;
  absl::Time deadline;
  absl::Duration lease;
  std::unique_ptr<KvChunkReceiver> receiver;   // used by the stream's thread only
  bool streaming = false;                      // a PushKv stream is bound
  bool writing = false;                        // a chunk is going into the blocks right now
  bool release_pending = false;                // ended while writing: the writer releases
  uint32_t chunks_in = 0;                      // data chunks accepted (for messages)
  std::vector<std::function<void()>> settled;  // WhenSettled's, until it completes or ends
};

namespace {

bool IsLive(TransferState s) {
  return s == TransferState::kReserved || s == TransferState::kReceiving ||
         s == TransferState::kComplete;
}

int64_t Ms(absl::Duration d) { return absl::ToInt64Milliseconds(d); }

}  // namespace

KvTransfers::KvTransfers(const KvTransfersOptions& options, const KvLayout& layout,
                         ReleaseFn release, EndFn on_end)
    : options_(options), layout_(layout), release_(std::move(release)), on_end_(std::move(on_end)) {
  std::random_device rd;
  const uint64_t key = (uint64_t{rd()} << 32) ^ rd();
  {
    MutexLock lock(&mu_);
    id_key_ = key;
  }
  reaper_ = std::thread([this] { Reaper(); });
}

KvTransfers::~KvTransfers() { Shutdown(); }

uint64_t KvTransfers::NewId() {
  while (true) {
    // A bijection: distinct counters give distinct ids.
    const uint64_t id = Fmix64(id_key_ + ++id_counter_);
    if (id != 0) return id;
  }
}

TransferTicket KvTransfers::Add(KvReservation reservation, const TransferSpec& spec) {
  auto t = std::make_shared<Transfer>();
  t->n_prompt = spec.n_prompt;
  t->plan_key = spec.plan_key;
  t->created = absl::Now();
  t->lease = spec.lease > absl::ZeroDuration() ? std::min(spec.lease, options_.max_lease)
                                               : options_.default_lease;
  t->deadline = t->created + t->lease;
  TransferTicket ticket;
  Pending pending;
  {
    MutexLock lock(&mu_);
    t->id = NewId();
    t->receiver = std::make_unique<KvChunkReceiver>(t->id, layout_, reservation.n_slots,
                                                    std::max(spec.n_prompt - 1, 0), spec.dtype,
                                                    reservation.layer_first);
    t->res = std::move(reservation);
    ticket = {t->id, t->deadline, t->lease};
    deadlines_.emplace(t->deadline, t->id);
    live_[t->id] = std::move(t);
    if (stop_) {
      End(Live(ticket.transfer_id), TransferState::kCancelled,
          absl::CancelledError(absl::StrCat("transfer ", ticket.transfer_id,
                                            " was cancelled: the worker is shutting down")),
          "cancelled", pending);
    }
    reaper_wake_.Signal();
  }
  Run(pending);
  return ticket;
}

std::shared_ptr<KvTransfers::Transfer> KvTransfers::Live(uint64_t id) const {
  auto it = live_.find(id);
  return it == live_.end() ? nullptr : it->second;
}

absl::Status KvTransfers::NotLive(uint64_t id, bool for_chunk) const {
  auto it = tombs_.find(id);
  if (it == tombs_.end()) {
    return absl::NotFoundError(absl::StrCat("transfer ", id,
                                            " is unknown to this worker (never reserved here, or "
                                            "it ended more than ",
                                            absl::FormatDuration(options_.tombstone_ttl), " ago)"));
  }
  const Tombstone& t = it->second;
  switch (t.state) {
    case TransferState::kAdopted:
      return absl::FailedPreconditionError(
          absl::StrCat("transfer ", id, " is complete and a request has adopted its KV"));
    case TransferState::kExpired:
    case TransferState::kCancelled:
      return t.status;  // DEADLINE_EXCEEDED / CANCELLED, the message says when and why
    default:
      if (!for_chunk) return t.status;  // the root cause, with its own code
      return absl::FailedPreconditionError(
          absl::StrCat("transfer ", id, " was aborted earlier: ", t.status.message()));
  }
}

void KvTransfers::End(std::shared_ptr<Transfer> t, TransferState state, absl::Status status,
                      std::string reason, Pending& pending) {
  t->state = state;
  deadlines_.erase({t->deadline, t->id});
  live_.erase(t->id);
  const absl::Time now = absl::Now();
  tombs_[t->id] = Tombstone{state, status, now};
  tomb_order_.emplace_back(now, t->id);
  if (tomb_order_.size() == 1) reaper_wake_.Signal();  // its first tombstone deadline
  while (tomb_order_.size() > options_.max_tombstones) {
    tombs_.erase(tomb_order_.front().second);
    tomb_order_.pop_front();
  }
  if (state != TransferState::kAdopted) {
    if (t->writing) {
      t->release_pending = true;  // the writer still uses the view
    } else {
      pending.releases.push_back(t->res.kv_seq);
      t->res.store.reset();
    }
  } else {
    t->res.store.reset();
  }
  pending.ends.push_back(
      TransferEnd{t->id, state, std::move(reason), std::move(status), now - t->created});
  for (auto& fn : t->settled) pending.wakes.push_back(std::move(fn));
  t->settled.clear();
  changed_.SignalAll();
}

void KvTransfers::Run(Pending& pending) {
  for (int32_t kv : pending.releases) release_(kv);
  if (on_end_) {
    for (const TransferEnd& e : pending.ends) on_end_(e);
  }
  for (const auto& fn : pending.wakes) fn();
  pending = {};
}

absl::Status KvTransfers::OpenStream(uint64_t id) {
  MutexLock lock(&mu_);
  std::shared_ptr<Transfer> t = Live(id);
  if (t == nullptr) return NotLive(id, /*for_chunk=*/true);
  if (t->streaming) {
    return absl::FailedPreconditionError(
        absl::StrCat("transfer ", id, " already has a PushKv stream; one stream per transfer"));
  }
  if (t->state == TransferState::kComplete) {
    return absl::FailedPreconditionError(
        absl::StrCat("transfer ", id, " is already complete; nothing more is accepted"));
  }
  t->streaming = true;
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<KvTransfers::Transfer>> KvTransfers::Streaming(uint64_t id) const {
  std::shared_ptr<Transfer> t = Live(id);
  if (t == nullptr) return NotLive(id, /*for_chunk=*/true);
  if (!t->streaming) {
    return absl::FailedPreconditionError(
        absl::StrCat("transfer ", id, ": a chunk outside its PushKv stream"));
  }
  return t;
}

absl::StatusOr<PushProgress> KvTransfers::Push(uint64_t id, const v1::KvChunk& chunk,
                                               const uint8_t* device_rows) {
  std::shared_ptr<Transfer> t;
  absl::Status early;
  Pending pending;
  {
    MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(t, Streaming(id));
    if (absl::Now() >= t->deadline) {
      // The reaper has not got to it yet: the lease is over all the same.
      End(t, TransferState::kExpired,
          absl::DeadlineExceededError(absl::StrCat("transfer ", id, ": its lease of ", Ms(t->lease),
                                                   " ms expired before chunk ", chunk.seq(),
                                                   " arrived; its blocks were freed")),
          "expired", pending);
      early = NotLive(id, /*for_chunk=*/true);
    } else {
      if (t->state == TransferState::kReserved) t->state = TransferState::kReceiving;
      t->writing = true;
      ++writers_;
    }
  }
  if (!early.ok()) {
    Run(pending);
    return early;
  }
  // Outside the lock: checking and writing a chunk into the blocks takes a while, and the blocks
  // cannot go away meanwhile (End defers the release to us).
  absl::Status st = chunk.end()
                        ? t->receiver->Finish(chunk)
                        : t->receiver->Accept(chunk, *t->res.store, t->res.kv_seq, device_rows);
  PushProgress progress;
  progress.chunks = t->receiver->chunks();
  progress.bytes = t->receiver->bytes();
  progress.slots = t->receiver->slots_done();
  progress.complete = t->receiver->complete();
  absl::Status result;
  {
    MutexLock lock(&mu_);
    t->writing = false;
    --writers_;
    if (st.ok() && !chunk.end()) t->chunks_in = progress.chunks;
    if (t->release_pending) {
      // It expired or was cancelled while this chunk was written.
      t->release_pending = false;
      pending.releases.push_back(t->res.kv_seq);
      t->res.store.reset();
      result = NotLive(id, /*for_chunk=*/true);
    } else if (!IsLive(t->state)) {
      result = NotLive(id, /*for_chunk=*/true);
    } else if (!st.ok()) {
      End(t, TransferState::kFailed, st, "chunk_rejected", pending);
      result = st;
    } else if (progress.complete) {
      t->state = TransferState::kComplete;
      for (auto& fn : t->settled) pending.wakes.push_back(std::move(fn));
      t->settled.clear();
      changed_.SignalAll();
    }
    changed_.SignalAll();  // writers_ changed (Shutdown waits for 0)
  }
  Run(pending);
  if (!result.ok()) return result;
  return progress;
}

absl::Status KvTransfers::CheckLinkChunk(uint64_t id, const v1::KvChunk& chunk) {
  std::shared_ptr<Transfer> t;
  {
    MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(t, Streaming(id));
  }
  // The receiver is the stream thread's, this one's.
  absl::Status st = t->receiver->CheckHeader(chunk);
  if (st.ok()) return st;
  Pending pending;
  {
    MutexLock lock(&mu_);
    if (IsLive(t->state)) End(t, TransferState::kFailed, st, "chunk_rejected", pending);
  }
  Run(pending);
  return st;
}

absl::Status KvTransfers::CloseStream(uint64_t id, const absl::Status& why) {
  Pending pending;
  absl::Status result;
  {
    MutexLock lock(&mu_);
    std::shared_ptr<Transfer> t = Live(id);
    if (t == nullptr) return NotLive(id, /*for_chunk=*/true);
    t->streaming = false;
    if (t->state != TransferState::kComplete) {
      result = absl::AbortedError(
          absl::StrCat("transfer ", id, ": the PushKv stream ended after ", t->chunks_in,
                       " chunks without its end message",
                       why.ok() ? std::string() : absl::StrCat(" (", why.message(), ")"),
                       "; its blocks were freed"));
      End(t, TransferState::kFailed, result, "stream_ended", pending);
    }
  }
  Run(pending);
  return result;
}

absl::StatusOr<bool> KvTransfers::AwaitComplete(uint64_t id, absl::Duration wait) {
  const absl::Time until = absl::Now() + wait;
  MutexLock lock(&mu_);
  while (true) {
    std::shared_ptr<Transfer> t = Live(id);
    if (t == nullptr) return NotLive(id, /*for_chunk=*/false);
    if (t->state == TransferState::kComplete) return true;
    if (changed_.WaitWithDeadline(&mu_, until)) {
      t = Live(id);
      if (t == nullptr) return NotLive(id, false);
      return t->state == TransferState::kComplete;
    }
  }
}

void KvTransfers::WhenSettled(uint64_t id, std::function<void()> fn) {
  {
    MutexLock lock(&mu_);
    std::shared_ptr<Transfer> t = Live(id);
    if (t != nullptr && t->state != TransferState::kComplete) {
      t->settled.push_back(std::move(fn));
      return;
    }
  }
  fn();
}

absl::StatusOr<AdoptedKv> KvTransfers::Adopt(uint64_t id, int n_prompt) {
  absl::StatusOr<AdoptedKv> out;
  Pending pending;
  {
    MutexLock lock(&mu_);
    std::shared_ptr<Transfer> t = Live(id);
    if (t == nullptr) return NotLive(id, false);
    if (t->state != TransferState::kComplete) {
      return absl::FailedPreconditionError(absl::StrCat("transfer ", id, " is ",
                                                        TransferStateName(t->state),
                                                        ", not complete: its KV cannot be used"));
    }
    if (n_prompt != t->n_prompt) {
      out = absl::InvalidArgumentError(absl::StrCat(
          "transfer ", id, " holds KV of a ", t->n_prompt, "-token prompt; the request has ",
          n_prompt, " tokens (the transfer is aborted, its blocks freed)"));
      End(t, TransferState::kFailed, out.status(), "mismatch", pending);
    } else {
      AdoptedKv a;
      a.kv_seq = t->res.kv_seq;
      a.n_slots = t->res.n_slots;
      a.trimmed = t->receiver->trimmed();
      a.plan_key = t->plan_key;
      out = a;
      End(t, TransferState::kAdopted, absl::OkStatus(), "adopted", pending);
    }
  }
  Run(pending);
  return out;
}

bool KvTransfers::Cancel(uint64_t id, const std::string& why) {
  Pending pending;
  {
    MutexLock lock(&mu_);
    std::shared_ptr<Transfer> t = Live(id);
    if (t == nullptr) return false;
    End(t, TransferState::kCancelled,
        absl::CancelledError(
            absl::StrCat("transfer ", id, " was cancelled (", why, "); its blocks were freed")),
        "cancelled", pending);
  }
  Run(pending);
  return true;
}

void KvTransfers::Shutdown() {
  Pending pending;
  {
    MutexLock lock(&mu_);
    stop_ = true;
    reaper_wake_.Signal();
    std::vector<std::shared_ptr<Transfer>> all;
    for (const auto& [id, t] : live_) all.push_back(t);
    for (const auto& t : all) {
      End(t, TransferState::kCancelled,
          absl::CancelledError(
              absl::StrCat("transfer ", t->id, " was cancelled: the worker is shutting down")),
          "cancelled", pending);
    }
    // A writer still in a chunk releases its blocks when it leaves; wait for it (bounded: a
    // chunk is at most 1 MiB).
    const absl::Time until = absl::Now() + absl::Seconds(10);
    while (writers_ > 0 && !changed_.WaitWithDeadline(&mu_, until)) {
    }
  }
  if (reaper_.joinable()) reaper_.join();
  Run(pending);
}

int KvTransfers::active() const {
  MutexLock lock(&mu_);
  return static_cast<int>(live_.size());
}

absl::StatusOr<TransferState> KvTransfers::state(uint64_t id) const {
  MutexLock lock(&mu_);
  if (std::shared_ptr<Transfer> t = Live(id)) return t->state;
  auto it = tombs_.find(id);
  if (it == tombs_.end()) return absl::NotFoundError(absl::StrCat("transfer ", id, " is unknown"));
  return it->second.state;
}

void KvTransfers::Sweep(absl::Time now, Pending& pending) {
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    std::shared_ptr<Transfer> t = Live(deadlines_.begin()->second);
    if (t == nullptr) {  // cannot happen: End erases both
      deadlines_.erase(deadlines_.begin());
      continue;
    }
    End(t, TransferState::kExpired,
        absl::DeadlineExceededError(absl::StrCat(
            "transfer ", t->id, ": its lease of ", Ms(t->lease), " ms expired while it was ",
            TransferStateName(t->state), " (", t->chunks_in, " chunks in); its blocks were freed")),
        "expired", pending);
  }
  while (!tomb_order_.empty() && tomb_order_.front().first + options_.tombstone_ttl <= now) {
    // A tombstone is replaced only by itself (ids are never reused), so the order entry is its.
    tombs_.erase(tomb_order_.front().second);
    tomb_order_.pop_front();
  }
}

void KvTransfers::Reaper() {
  while (true) {
    Pending pending;
    {
      MutexLock lock(&mu_);
      if (stop_) return;
      const absl::Time now = absl::Now();
      Sweep(now, pending);
      absl::Time next = now + absl::Minutes(1);
      if (!deadlines_.empty()) next = std::min(next, deadlines_.begin()->first);
      if (!tomb_order_.empty()) {
        next = std::min(next, tomb_order_.front().first + options_.tombstone_ttl);
      }
      if (pending.releases.empty() && pending.ends.empty()) {
        reaper_wake_.WaitWithDeadline(&mu_, next);
        if (stop_) return;
        Sweep(absl::Now(), pending);
      }
    }
    Run(pending);
  }
}

}  // namespace tripod
