// InProcessKvStream: a KvChunkStream that hands each chunk straight to a KvReceiver in this
// process, as the decode worker's PushKv handler would, and answers as it would: for tests of
// the sender, the receiver and what sits on either (no sockets, no gRPC).
#pragma once

#include "common/kv_transfer/kv_chunk_stream.h"
#include "common/kv_transfer/kv_receiver.h"
#include "common/util/mutex.h"

namespace tripod {

class InProcessKvStream final : public KvChunkStream {
 public:
  // `transfers` (and `links`, which may be null) must outlive the stream.
  InProcessKvStream(KvTransfers& transfers, KvLinks* links = nullptr)
      : receiver_(transfers, links) {}

  void Open() override {}
  bool Write(const v1::KvChunk& chunk) override;
  void WriteLast(const v1::KvChunk& end) override { Write(end); }
  absl::StatusOr<v1::PushKvResponse> Finish() override;
  void Cancel() override;

 private:
  Mutex mu_;
  KvReceiver receiver_ ABSL_GUARDED_BY(mu_);
  PushProgress last_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tripod
