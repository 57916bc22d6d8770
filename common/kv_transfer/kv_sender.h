// KvSender: the prefill side of one KV transfer. The engine thread encodes KV chunks and hands
// them over (Push / PushRange / PushTrimmed); the sender's own thread opens the stream
// (KvChunkStream: the PushKv call, or what a test puts in its place) and writes them in order,
// numbered 0, 1, 2, ...; Finish() sends the end message with the totals and waits for the decode
// side's acknowledgement. Between the two threads is a queue bounded in bytes: when the network
// cannot keep up, Push blocks (backpressure) rather than buffering the whole prompt's KV. Abort()
// cancels the stream, and the decode side then frees its reservation. With a KV link (options.link)
// PushRange sends each chunk's header on the stream and its payload on the link.
//
// Errors travel back as statuses: once the stream fails (the decode side refused a chunk, the
// deadline passed, the peer went away), Push and Finish return the decode side's status, code
// and message as it sent them; after Abort they return CANCELLED. Poll() says where it stands.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/kv/kv_layout.h"
#include "common/kv/kv_snapshot.h"
#include "common/kv/kv_store.h"
#include "common/kv_transfer/kv_chunk_stream.h"
#include "common/kv_transfer/kv_sink.h"
#include "common/kv_transfer/open_kv_link.h"
#include "common/util/mutex.h"
#include "tripod/v1/decode.pb.h"

namespace tripod {

struct KvSenderOptions {
  // Encoded chunks waiting for the network, at most (one chunk is always let in).
  size_t max_queued_bytes = size_t{64} << 20;
  // How long Finish() waits for the acknowledgement once the end message is queued.
  std::chrono::milliseconds ack_timeout{30000};
  // How long a Push waits for room in a full queue: a decode side that takes nothing for this
  // long (paused, or its network stalled) fails the transfer (UNAVAILABLE) rather than holding
  // the prefill engine, and every request behind this one, until it moves again.
  std::chrono::milliseconds stall_timeout{10000};
  std::string peer;  // the decode address, for messages
  // A KV link to the decode worker for PushRange's payloads (device to device); null: none.
  std::shared_ptr<OpenKvLink> link;
  absl::Duration link_timeout = absl::Seconds(30);  // one payload on the link, at most
  // The link failed (it is marked so): called once per failed push, on the pushing thread.
  std::function<void(const std::shared_ptr<OpenKvLink>&, const absl::Status&)> on_link_failed;
};

// Where a sender stands (Poll).
enum class KvSendState : uint8_t {
  kSending,       // pushes are taken
  kFinishing,     // the end message is queued; the acknowledgement is awaited
  kAcknowledged,  // the decode side took the whole transfer
  kFailed,        // the stream ended otherwise (refused, unreachable, stalled, no acknowledgement)
  kAborted,       // Abort()
};
const char* KvSendStateName(KvSendState s);

struct KvSenderStats {
  using Time = std::chrono::steady_clock::time_point;
  uint32_t chunks = 0;  // data chunks handed over
  uint64_t bytes = 0;   // their payload bytes
  // The first message (data or end) handed over by Push or Finish: the transfer's start, with
  // the connection's set-up where the channel had none.
  std::optional<Time> first_handed;
  std::optional<Time> ack;  // the decode side's response arrived
};

// The pieces `range` is sent in: each at most max_payload bytes (a single layer x slot row of
// more is sent alone), slots split first, then as many layers per piece as fit. Every layer's
// slots come in ascending order, as the decode side requires.
std::vector<KvRange> SplitKvRange(const KvLayout& layout, const KvRange& range, size_t max_payload);

class KvSender {
 public:
  // Starts the sender thread, which opens `stream`.
  KvSender(std::unique_ptr<KvChunkStream> stream, uint64_t transfer_id,
           KvSenderOptions options = {});
  ~KvSender();  // Abort() unless Finish() succeeded; joins the thread
  KvSender(const KvSender&) = delete;
  KvSender& operator=(const KvSender&) = delete;

  // Queues a data chunk (its transfer_id and seq are set here); blocks while the queue is full.
  // Engine thread (one pushing thread).
  absl::Status Push(v1::KvChunk chunk);
  // Encodes `range` of kv_seq in `store` into chunks of at most 1 MiB and pushes them: a KvSink.
  // With a link, each chunk's rows are gathered into the link's buffer, its header (link fields,
  // no payload) pushed, then the payload sent on the link in link_seq order, waiting at most
  // options.link_timeout; a link that fails is marked so (link.failed), options.on_link_failed
  // hears of it, and the push fails UNAVAILABLE. The store's memory is then the link's.
  absl::Status PushRange(KvStore& store, int32_t kv_seq, const KvRange& range);
  // Queues the end message (totals of what was pushed), waits for the acknowledgement (bounded
  // by options.ack_timeout: DEADLINE_EXCEEDED, and the call cancelled), returns it. Once.
  absl::StatusOr<v1::PushKvResponse> Finish();
  // Pushes a whole trimmed snapshot (every layer, its kept entries) with each chunk's kept
  // positions, never on a link; the decode side's reservation must hold kv.n_slots slots (and,
  // for per-layer budgets, name the same first slot per layer: padding is not sent).
  absl::Status PushTrimmed(const KvSnapshot& kv);
  // Cancels the stream; blocked Push and Finish calls return CANCELLED. Any thread; idempotent.
  void Abort();

  KvSendState Poll() const;
  KvSenderStats stats() const;

 private:
  void Loop();
  absl::Status PushRangeOnLink(KvStore& store, int32_t kv_seq, const KvRange& range,
                               OpenKvLink& link);
  // Push, calling `seal` on the chunk once its transfer_id and seq are set (a link payload's MAC
  // covers them).
  absl::Status Enqueue(v1::KvChunk chunk, const std::function<void(v1::KvChunk&)>& seal);
  // The status a pusher sees once the stream is over or aborted (OK while it goes on).
  absl::Status StoppedStatus() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Abort's work, mu_ held.
  void AbortLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::unique_ptr<KvChunkStream> stream_;
  const uint64_t transfer_id_;
  const KvSenderOptions options_;
  v1::PushKvResponse response_;  // the sender thread's until done_

  mutable Mutex mu_;
  CondVar cv_;  // any change of the fields below
  std::deque<v1::KvChunk> queue_ ABSL_GUARDED_BY(mu_);
  size_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool end_queued_ ABSL_GUARDED_BY(mu_) = false;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  // Aborted because the queue stayed full for stall_timeout.
  bool stalled_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;    // the call is over (Loop returned)
  absl::Status status_ ABSL_GUARDED_BY(mu_);  // the call's, once done_
  KvSenderStats stats_ ABSL_GUARDED_BY(mu_);

  std::thread thread_;
};

// What opens the sender of one transfer (the job runner's only view of the wire):
// kv_sender_factory.h makes the real one; a test may pass any other (in_process_kv_stream.h).
struct KvSendTarget {
  std::string address;  // the decode worker's
  // The name its certificate is checked against (NewWorkerChannel's tls_name; empty: address).
  std::string tls_name;
  uint64_t transfer_id = 0;
  // The whole transfer's deadline (the caller's, e.g. Prefill.Run's); max(): none.
  std::chrono::system_clock::time_point deadline = std::chrono::system_clock::time_point::max();
  // Whether the KV may take a KV link (untrimmed KV, sent as the forward makes it).
  bool may_link = false;
};

using OpenKvSender = std::function<std::unique_ptr<KvSender>(const KvSendTarget& target)>;

}  // namespace tripod
