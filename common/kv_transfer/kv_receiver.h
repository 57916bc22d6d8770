// KvReceiver: the decode side of one PushKv stream. It binds the stream to the transfer its first
// chunk names (KvTransfers::OpenStream), takes each chunk's payload off its KV link when it came
// on one (KvLinks), hands the chunk to the transfer, and closes the stream when it ends. Its state
// is one enum:
//
//   kIdle --first chunk--> kReceiving --end message checked--> kComplete
//     |                        |
//     +-- refused -----------> kFailed <-- a refused chunk, or the stream ended before the end
//
// A failed receiver has ended (or never bound) its transfer, whose blocks are free by then.
// Knows no gRPC: the PushKv handler reads the messages and answers with what this returns.
// One stream, one thread.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/kv_transfer/kv_links.h"
#include "common/kv_transfer/kv_transfers.h"
#include "tripod/v1/kv_chunk.pb.h"

namespace tripod {

enum class KvReceiveState : uint8_t { kIdle, kReceiving, kComplete, kFailed };
const char* KvReceiveStateName(KvReceiveState s);

class KvReceiver {
 public:
  // `links` may be null (no KV links: a link chunk is refused). Both must outlive the receiver.
  KvReceiver(KvTransfers& transfers, KvLinks* links) : transfers_(transfers), links_(links) {}
  // Ends a stream still receiving, as Close(ABORTED) would.
  ~KvReceiver();
  KvReceiver(const KvReceiver&) = delete;
  KvReceiver& operator=(const KvReceiver&) = delete;

  // The stream's next message (the first binds it). Progress so far, or why the chunk was
  // refused (then kFailed). After kComplete or kFailed: FAILED_PRECONDITION, nothing changes.
  absl::StatusOr<PushProgress> Receive(const v1::KvChunk& chunk);
  // The stream ended while receiving (`why`: how): the transfer is aborted, and its status is
  // returned (kFailed). OK once complete; after a refusal, that refusal's status.
  absl::Status Close(const absl::Status& why);

  KvReceiveState state() const { return state_; }
  uint64_t transfer_id() const { return id_; }

 private:
  absl::StatusOr<PushProgress> Fail(absl::Status why);

  KvTransfers& transfers_;
  KvLinks* const links_;
  KvReceiveState state_ = KvReceiveState::kIdle;
  uint64_t id_ = 0;
  absl::Status failure_;  // kFailed's
};

}  // namespace tripod
