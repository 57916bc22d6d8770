// KvReceiver; see kv_receiver.h.
#include "common/kv_transfer/kv_receiver.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace tripod {

const char* KvReceiveStateName(KvReceiveState s) {
  switch (s) {
    case KvReceiveState::kIdle:
      return "idle";
    case KvReceiveState::kReceiving:
      return "receiving";
    case KvReceiveState::kComplete:
      return "complete";
    case KvReceiveState::kFailed:
      return "failed";
  }
  return "?";
}

KvReceiver::~KvReceiver() {
  if (state_ == KvReceiveState::kReceiving) {
    Close(absl::AbortedError("the receiver went away")).IgnoreError();
  }
}

absl::StatusOr<PushProgress> KvReceiver::Fail(absl::Status why) {
  state_ = KvReceiveState::kFailed;
  failure_ = why;
  return why;
}

absl::StatusOr<PushProgress> KvReceiver::Receive(const v1::KvChunk& chunk) {
  switch (state_) {
    case KvReceiveState::kIdle: {
      if (chunk.transfer_id() == 0) {
        return Fail(absl::InvalidArgumentError(
            "PushKv: the first chunk names no transfer (transfer_id 0)"));
      }
      // Refused (another stream holds it, it ended, it is unknown): nothing to close.
      if (absl::Status st = transfers_.OpenStream(chunk.transfer_id()); !st.ok()) {
        return Fail(st);
      }
      id_ = chunk.transfer_id();
      state_ = KvReceiveState::kReceiving;
      break;
    }
    case KvReceiveState::kReceiving:
      break;
    case KvReceiveState::kComplete:
    case KvReceiveState::kFailed:
      return absl::FailedPreconditionError(
          absl::StrCat("PushKv: a chunk after the stream was ", KvReceiveStateName(state_)));
  }
  absl::StatusOr<PushProgress> p;
  if (chunk.link_id() != 0 && !chunk.end()) {
    // The payload comes off the link first, whatever becomes of the transfer: the link's two
    // ends must stay in step for the payloads after it.
    const absl::Status got =
        links_ == nullptr
            ? absl::FailedPreconditionError(absl::StrCat("chunk ", chunk.seq(), ": no KV link ",
                                                         chunk.link_id(), " on this decode worker"))
            : links_->Receive(
                  chunk, [&] { return transfers_.CheckLinkChunk(id_, chunk); },
                  [&](const uint8_t* rows) {
                    p = transfers_.Push(id_, chunk, rows);
                    return absl::OkStatus();
                  });
    if (!got.ok()) {
      transfers_.Cancel(id_, std::string(got.message()));
      p = got;
    }
  } else {
    p = transfers_.Push(id_, chunk);
  }
  if (!p.ok()) {
    transfers_.CloseStream(id_, p.status()).IgnoreError();  // already ended by the refusal
    return Fail(p.status());
  }
  if (p->complete) {
    transfers_.CloseStream(id_, absl::OkStatus()).IgnoreError();  // complete: OK
    state_ = KvReceiveState::kComplete;
  }
  return p;
}

absl::Status KvReceiver::Close(const absl::Status& why) {
  switch (state_) {
    case KvReceiveState::kComplete:
      return absl::OkStatus();
    case KvReceiveState::kFailed:
      return failure_;
    case KvReceiveState::kIdle:
      state_ = KvReceiveState::kFailed;
      failure_ = absl::InvalidArgumentError("PushKv: the stream carried no chunk");
      return failure_;
    case KvReceiveState::kReceiving:
      break;
  }
  state_ = KvReceiveState::kFailed;
  failure_ = transfers_.CloseStream(id_, why);
  return failure_;
}

}  // namespace tripod
