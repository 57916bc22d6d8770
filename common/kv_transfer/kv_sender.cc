// KvSender; see kv_sender.h.
#include "common/kv_transfer/kv_sender.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/kv/contiguous_kv_cache.h"
#include "common/kv_transfer/kv_chunk_codec.h"
#include "common/kv_transfer/kv_link_auth.h"
#include "common/util/status_macros.h"

namespace tripod {
namespace {

// Bytes a queued chunk counts for: its payload and a little for the header.
size_t QueuedBytes(const v1::KvChunk& c) { return c.payload().size() + 64; }

}  // namespace

const char* KvSendStateName(KvSendState s) {
  switch (s) {
    case KvSendState::kSending:
      return "sending";
    case KvSendState::kFinishing:
      return "finishing";
    case KvSendState::kAcknowledged:
      return "acknowledged";
    case KvSendState::kFailed:
      return "failed";
    case KvSendState::kAborted:
      return "aborted";
  }
  return "?";
}

std::vector<KvRange> SplitKvRange(const KvLayout& layout, const KvRange& range,
                                  size_t max_payload) {
  std::vector<KvRange> pieces;
  const size_t one = std::max<size_t>(1, KvChunkPayloadBytes(layout, 1, 1));
  const int slots = static_cast<int>(std::max<size_t>(1, max_payload / one));
  for (int s0 = range.slot_begin; s0 < range.slot_end; s0 += slots) {
    const int s1 = std::min(s0 + slots, range.slot_end);
    const int layers = static_cast<int>(std::max<size_t>(1, max_payload / (one * (s1 - s0))));
    for (int l0 = range.layer_begin; l0 < range.layer_end; l0 += layers) {
      pieces.push_back(KvRange{l0, std::min(l0 + layers, range.layer_end), s0, s1});
    }
  }
  return pieces;
}

KvSender::KvSender(std::unique_ptr<KvChunkStream> stream, uint64_t transfer_id,
                   KvSenderOptions options)
    : stream_(std::move(stream)), transfer_id_(transfer_id), options_(std::move(options)) {
  thread_ = std::thread([this] { Loop(); });
}

KvSender::~KvSender() {
  Abort();
  if (thread_.joinable()) thread_.join();
}

void KvSender::Loop() {
  // Opening the call waits for the connection: here, not on the engine thread.
  stream_->Open();
  while (true) {
    v1::KvChunk msg;
    {
      MutexLock lock(&mu_);
      while (queue_.empty() && !aborted_) cv_.Wait(&mu_);
      if (aborted_) break;
      msg = std::move(queue_.front());
      queue_.pop_front();
      queued_bytes_ -= QueuedBytes(msg);
      cv_.SignalAll();
    }
    if (msg.end()) {
      stream_->WriteLast(msg);
      break;
    }
    // False: the call is over (the decode side answered early, with an error); Finish says why.
    if (!stream_->Write(msg)) break;
  }
  absl::StatusOr<v1::PushKvResponse> answer = stream_->Finish();
  MutexLock lock(&mu_);
  done_ = true;
  status_ = answer.status();
  if (answer.ok()) {
    response_ = *std::move(answer);
    stats_.ack = std::chrono::steady_clock::now();
  }
  queue_.clear();
  queued_bytes_ = 0;
  cv_.SignalAll();
}

absl::Status KvSender::StoppedStatus() const {
  if (stalled_) {
    return absl::UnavailableError(absl::StrCat(
        "KV transfer ", transfer_id_, " to ", options_.peer, ": the decode worker took no KV for ",
        options_.stall_timeout.count(), " ms with ", queued_bytes_ >> 10,
        " KiB waiting (paused, or its network stalled)"));
  }
  if (aborted_) {
    return absl::CancelledError(
        absl::StrCat("KV transfer ", transfer_id_, " to ", options_.peer, " aborted"));
  }
  if (!done_) return absl::OkStatus();
  if (!status_.ok()) return status_;
  if (end_queued_) return absl::OkStatus();  // acknowledged
  return absl::InternalError(absl::StrCat("KV transfer ", transfer_id_, " to ", options_.peer,
                                          ": the decode worker ended the stream before the end"));
}

absl::Status KvSender::Push(v1::KvChunk chunk) { return Enqueue(std::move(chunk), {}); }

absl::Status KvSender::Enqueue(v1::KvChunk chunk, const std::function<void(v1::KvChunk&)>& seal) {
  const size_t size = QueuedBytes(chunk);
  MutexLock lock(&mu_);
  if (end_queued_) return absl::FailedPreconditionError("KvSender: Push after Finish");
  // Backpressure: wait for room (one chunk always fits in an empty queue), for a while.
  const absl::Time until = absl::Now() + absl::FromChrono(options_.stall_timeout);
  const auto room = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !StoppedStatus().ok() || queue_.empty() ||
           queued_bytes_ + size <= options_.max_queued_bytes;
  };
  while (!room()) {
    if (cv_.WaitWithDeadline(&mu_, until) && !room()) {
      stalled_ = true;
      AbortLocked();
      break;
    }
  }
  RETURN_IF_ERROR(StoppedStatus());
  chunk.set_transfer_id(transfer_id_);
  chunk.set_seq(next_seq_++);
  if (seal) seal(chunk);
  if (!stats_.first_handed) stats_.first_handed = std::chrono::steady_clock::now();
  ++stats_.chunks;
  stats_.bytes += chunk.link_id() != 0 ? chunk.link_bytes() : chunk.payload().size();
  queued_bytes_ += size;
  queue_.push_back(std::move(chunk));
  cv_.SignalAll();
  return absl::OkStatus();
}

absl::Status KvSender::PushRange(KvStore& store, int32_t kv_seq, const KvRange& range) {
  {
    MutexLock lock(&mu_);
    RETURN_IF_ERROR(StoppedStatus());  // encode nothing for a stream that is over
  }
  if (options_.link != nullptr) {
    absl::Status st = PushRangeOnLink(store, kv_seq, range, *options_.link);
    if (!st.ok() && options_.on_link_failed) {
      bool failed;
      {
        MutexLock hold(&options_.link->mu);
        failed = options_.link->failed;
      }
      if (failed) options_.on_link_failed(options_.link, st);
    }
    return st;
  }
  for (const KvRange& p : SplitKvRange(store.layout(), range, kMaxKvChunkPayload)) {
    v1::KvChunk chunk;
    EncodeKvChunk(store, kv_seq, p.layer_begin, p.layer_end, p.slot_begin, p.slot_end, &chunk);
    RETURN_IF_ERROR(Push(std::move(chunk)));
  }
  return absl::OkStatus();
}

absl::Status KvSender::PushRangeOnLink(KvStore& store, int32_t kv_seq, const KvRange& range,
                                       OpenKvLink& link) {
  const KvLayout l = store.layout();
  const KvMemory& mem = *link.memory;
  for (const KvRange& p : SplitKvRange(l, range, kMaxKvChunkPayload)) {
    const size_t layer_bytes = KvChunkPayloadBytes(l, 1, p.n_slots());
    const size_t bytes = layer_bytes * p.n_layers();
    MutexLock hold(&link.mu);
    if (link.failed) return absl::UnavailableError(absl::StrCat("KV link ", link.id, " failed"));
    if (bytes > link.capacity) {
      if (link.buffer != nullptr) mem.free(link.buffer);
      link.buffer = mem.alloc(bytes);
      link.capacity = link.buffer != nullptr ? bytes : 0;
      if (link.buffer == nullptr) {
        return absl::ResourceExhaustedError(
            absl::StrCat("KV link ", link.id, ": no device memory for a payload of ", bytes));
      }
    }
    for (int layer = p.layer_begin; layer < p.layer_end; ++layer) {
      mem.gather_rows(store.Layer(kv_seq, layer), l.n_kv_heads, l.head_dim, p.slot_begin,
                      p.slot_end, link.buffer + (layer - p.layer_begin) * layer_bytes);
    }
    v1::KvChunk header;
    header.set_layer_begin(p.layer_begin);
    header.set_layer_end(p.layer_end);
    header.set_slot_begin(p.slot_begin);
    header.set_slot_end(p.slot_end);
    header.set_dtype(KvDtypeToWire(l.dtype));
    header.set_link_id(link.id);
    header.set_link_seq(link.next_seq);
    header.set_link_bytes(bytes);
    if (link.key.empty()) {
      header.set_link_hash(mem.hash(link.buffer, bytes));
      RETURN_IF_ERROR(Push(std::move(header)));
    } else {
      // Signed over the payload's digest here, and its identity once Enqueue numbers it.
      link.host.resize(bytes);
      mem.to_host(link.host.data(), link.buffer, bytes);
      const KvLinkDigest digest = KvLinkPayloadDigest(link.host.data(), bytes);
      RETURN_IF_ERROR(Enqueue(std::move(header), [&](v1::KvChunk& c) {
        c.set_link_mac(KvLinkPayloadMac(link.key, c, digest));
      }));
    }
    // Queued: the decode side takes this payload's turn when the header arrives.
    ++link.next_seq;
    if (absl::Status st = link.link->Send(link.buffer, bytes, options_.link_timeout); !st.ok()) {
      link.failed = true;
      return absl::UnavailableError(
          absl::StrCat("KV link ", link.id, " to ", options_.peer, ": ", st.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status KvSender::PushTrimmed(const KvSnapshot& kv) {
  {
    MutexLock lock(&mu_);
    RETURN_IF_ERROR(StoppedStatus());
  }
  const KvLayout& l = kv.layout;
  if (!kv.trimmed() || kv.n_slots <= 0) {
    return absl::InvalidArgumentError("KvSender: PushTrimmed needs trimmed KV");
  }
  // Through a store of its own, so that chunks are encoded as the untrimmed ones are.
  ASSIGN_OR_RETURN(std::unique_ptr<ContiguousKvCache> store,
                   ContiguousKvCache::Create(l, 1, kv.n_slots));
  RETURN_IF_ERROR(WriteSnapshot(kv, *store, 0));
  // A layer's padding (PyramidKV) is never sent: then each layer goes as its own range.
  std::vector<KvRange> pieces;
  if (kv.layer_first.empty()) {
    pieces = SplitKvRange(l, KvRange{0, l.n_layers, 0, kv.n_slots}, kMaxKvChunkPayload);
  } else {
    for (int layer = 0; layer < l.n_layers; ++layer) {
      if (kv.first_slot(layer) == kv.n_slots) continue;
      for (const KvRange& p :
           SplitKvRange(l, KvRange{layer, layer + 1, kv.first_slot(layer), kv.n_slots},
                        kMaxKvChunkPayload)) {
        pieces.push_back(p);
      }
    }
  }
  std::vector<int32_t> kept;
  for (const KvRange& p : pieces) {
    kept.clear();
    for (int layer = p.layer_begin; layer < p.layer_end; ++layer) {
      for (int h = 0; h < l.n_kv_heads; ++h) {
        const int32_t* row = &kv.positions[(size_t{1} * layer * l.n_kv_heads + h) * kv.n_slots];
        kept.insert(kept.end(), row + p.slot_begin, row + p.slot_end);
      }
    }
    v1::KvChunk chunk;
    EncodeKvChunk(*store, 0, p.layer_begin, p.layer_end, p.slot_begin, p.slot_end, &chunk, kept);
    RETURN_IF_ERROR(Push(std::move(chunk)));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::PushKvResponse> KvSender::Finish() {
  MutexLock lock(&mu_);
  RETURN_IF_ERROR(StoppedStatus());
  if (end_queued_) return absl::FailedPreconditionError("KvSender: Finish called twice");
  v1::KvChunk end;
  MakeKvEnd(transfer_id_, next_seq_++, stats_.chunks, stats_.bytes, &end);
  queue_.push_back(std::move(end));
  end_queued_ = true;
  if (!stats_.first_handed) stats_.first_handed = std::chrono::steady_clock::now();
  cv_.SignalAll();
  const absl::Time until = absl::Now() + absl::FromChrono(options_.ack_timeout);
  while (!done_ && !aborted_) {
    if (cv_.WaitWithDeadline(&mu_, until) && !done_ && !aborted_) {
      // No acknowledgement in time: end the call (the decode side frees its reservation).
      AbortLocked();
      return absl::DeadlineExceededError(absl::StrCat(
          "KV transfer ", transfer_id_, " to ", options_.peer, ": no acknowledgement within ",
          options_.ack_timeout.count(), " ms of the end message"));
    }
  }
  RETURN_IF_ERROR(StoppedStatus());
  return response_;  // the sender thread wrote it before done_
}

void KvSender::Abort() {
  MutexLock lock(&mu_);
  if (done_ || aborted_) return;
  AbortLocked();
}

void KvSender::AbortLocked() {
  aborted_ = true;
  stream_->Cancel();
  cv_.SignalAll();
}

KvSendState KvSender::Poll() const {
  MutexLock lock(&mu_);
  if (stalled_) return KvSendState::kFailed;
  if (aborted_) return KvSendState::kAborted;
  if (done_) {
    return status_.ok() && end_queued_ ? KvSendState::kAcknowledged : KvSendState::kFailed;
  }
  return end_queued_ ? KvSendState::kFinishing : KvSendState::kSending;
}

KvSenderStats KvSender::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

}  // namespace tripod
