// InProcessKvStream; see in_process_kv_stream.h.
#include "common/kv_transfer/in_process_kv_stream.h"

namespace tripod {

bool InProcessKvStream::Write(const v1::KvChunk& chunk) {
  MutexLock lock(&mu_);
  if (cancelled_) return false;
  absl::StatusOr<PushProgress> p = receiver_.Receive(chunk);
  if (!p.ok()) return false;
  last_ = *p;
  return true;
}

absl::StatusOr<v1::PushKvResponse> InProcessKvStream::Finish() {
  MutexLock lock(&mu_);
  if (receiver_.state() != KvReceiveState::kComplete) {
    const absl::Status st = receiver_.Close(absl::AbortedError("the sender closed the stream"));
    // A cancelled call ends CANCELLED for its client, whatever the handler answered.
    return cancelled_ ? absl::CancelledError("the call was cancelled") : st;
  }
  v1::PushKvResponse r;
  r.set_chunks(last_.chunks);
  r.set_bytes(last_.bytes);
  r.set_slots(last_.slots);
  return r;
}

void InProcessKvStream::Cancel() {
  MutexLock lock(&mu_);
  cancelled_ = true;
  // As gRPC's cancellation would: the handler sees the stream end.
  if (receiver_.state() == KvReceiveState::kReceiving) {
    receiver_.Close(absl::CancelledError("the sender cancelled the call")).IgnoreError();
  }
}

}  // namespace tripod
