// KvSender: the prefill side of Decode.PushKv for one transfer. The engine thread encodes KV
// chunks and hands them over (Push / PushRange); the sender's own thread opens the client-streaming
// call and writes them in order, numbered 0, 1, 2, ...; Finish() sends the end message with the
// totals and waits for the decode side's acknowledgement. Between the two threads is a queue
// bounded in bytes: when the network cannot keep up, Push blocks (backpressure) rather than
// buffering the whole prompt's KV. Abort() cancels the call, and the decode side then frees its
// reservation.
//
// Errors travel back as statuses: once the stream fails (the decode side refused a chunk, the
// deadline passed, the peer went away), Push and Finish return the decode side's status, code
// and message as it sent them; after Abort they return CANCELLED.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/kv/kv_layout.h"
#include "common/kv/kv_snapshot.h"
#include "common/kv/kv_store.h"
#include "grpcpp/grpcpp.h"
#include "prefill_node/kv_link_cache.h"
#include "prefill_node/kv_sink.h"
#include "prefill_node/transfer_faults.h"
#include "tripod/v1/decode.grpc.pb.h"

namespace tripod {

struct KvSenderOptions {
  // Encoded chunks waiting for the network, at most (one chunk is always let in).
  size_t max_queued_bytes = size_t{64} << 20;
  // The whole call's deadline (the caller's, e.g. Prefill.Run's); max(): none.
  std::chrono::system_clock::time_point deadline = std::chrono::system_clock::time_point::max();
  // How long Finish() waits for the acknowledgement once the end message is queued.
  std::chrono::milliseconds ack_timeout{30000};
  // How long a Push waits for room in a full queue: a decode side that takes nothing for this
  // long (paused, or its network stalled) fails the transfer (UNAVAILABLE) rather than holding
  // the prefill engine, and every request behind this one, until it moves again.
  std::chrono::milliseconds stall_timeout{10000};
  std::string peer;  // the decode address, for messages
  // Test-only: drops, corrupts or delays data chunks (transfer_faults.h); null: none.
  TransferFaultInjector* faults = nullptr;
};

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
  // Starts the sender thread, which opens the PushKv call on `channel`.
  KvSender(std::shared_ptr<grpc::Channel> channel, uint64_t transfer_id,
           KvSenderOptions options = {});
  ~KvSender();  // Abort() unless Finish() succeeded; joins the thread
  KvSender(const KvSender&) = delete;
  KvSender& operator=(const KvSender&) = delete;

  // Queues a data chunk (its transfer_id and seq are set here); blocks while the queue is full.
  // Engine thread (one pushing thread).
  absl::Status Push(v1::KvChunk chunk);
  // Encodes `range` of kv_seq in `store` into chunks of at most 1 MiB and pushes them: a KvSink.
  absl::Status PushRange(KvStore& store, int32_t kv_seq, const KvRange& range);
  // The same with the payloads on `link` (device to device): each chunk's rows gathered into the
  // link's buffer, its header (link fields, no payload) pushed, then the payload sent on the link
  // in link_seq order, waiting at most `timeout`. A link that fails is marked so (link.failed) and
  // the push fails UNAVAILABLE. The store's memory is link.memory. Engine thread.
  absl::Status PushRangeOnLink(KvStore& store, int32_t kv_seq, const KvRange& range,
                               OpenKvLink& link, absl::Duration timeout);
  // Queues the end message (totals of what was pushed), waits for the acknowledgement (bounded
  // by options.ack_timeout: DEADLINE_EXCEEDED, and the call cancelled), returns it. Once.
  absl::StatusOr<v1::PushKvResponse> Finish();
  // Pushes a whole trimmed snapshot (every layer, its kept entries) with each chunk's kept
  // positions; the decode side's reservation must hold kv.n_slots slots (and, for per-layer
  // budgets, name the same first slot per layer: padding is not sent).
  absl::Status PushTrimmed(const KvSnapshot& kv);
  // Cancels the call; blocked Push and Finish calls return CANCELLED. Any thread; idempotent.
  void Abort();

  KvSenderStats stats() const;

 private:
  void Loop();
  // The status a pusher sees once the stream is over or aborted (OK while it goes on); mu_ held.
  absl::Status StoppedStatus() const;

  const std::shared_ptr<grpc::Channel> channel_;
  const uint64_t transfer_id_;
  const KvSenderOptions options_;
  // Made before the thread starts and kept until it is joined, so that Abort may TryCancel it at
  // any time (gRPC cancels a call that starts after TryCancel).
  const std::unique_ptr<grpc::ClientContext> ctx_;
  v1::PushKvResponse response_;  // the sender thread's until done_

  mutable std::mutex mu_;       // std::mutex for TSan: see cancel_token.h
  std::condition_variable cv_;  // any change of the fields below
  // Guarded by mu_:
  std::deque<v1::KvChunk> queue_;
  size_t queued_bytes_ = 0;
  uint32_t next_seq_ = 0;
  bool end_queued_ = false;
  bool aborted_ = false;
  bool stalled_ = false;  // aborted because the queue stayed full for stall_timeout
  bool done_ = false;     // the call is over (Loop returned)
  absl::Status status_;   // the call's, once done_
  KvSenderStats stats_;

  std::thread thread_;
};

}  // namespace tripod
