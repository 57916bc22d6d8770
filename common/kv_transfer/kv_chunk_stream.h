// KvChunkStream: the wire under a KvSender, one transfer's stream of KvChunk messages to the
// decode worker and its one answer. The sender's own thread makes every call but Cancel, in the
// order Open, Write..., WriteLast (at most once), Finish. Implementations: the PushKv gRPC call
// (push_kv_stream.h), fault injection around any other (fault_injecting_stream.h) and an
// in-process receiver for tests (in_process_kv_stream.h).
#pragma once

#include "absl/status/statusor.h"
#include "tripod/v1/decode.pb.h"
#include "tripod/v1/kv_chunk.pb.h"

namespace tripod {

class KvChunkStream {
 public:
  virtual ~KvChunkStream() = default;
  // Starts the call; may wait for the connection (hence on the sender's thread).
  virtual void Open() = 0;
  // One data chunk, numbered by the sender. False: the call is over (Finish says why).
  virtual bool Write(const v1::KvChunk& chunk) = 0;
  // The end message; nothing is written after it.
  virtual void WriteLast(const v1::KvChunk& end) = 0;
  // Waits for the call's end: the decode side's acknowledgement, or why there is none.
  virtual absl::StatusOr<v1::PushKvResponse> Finish() = 0;
  // Ends the call from any thread, at any time (before Open too): the decode side frees its
  // reservation, and a Write or Finish in progress returns.
  virtual void Cancel() = 0;
};

}  // namespace tripod
