// FaultInjectingStream: a KvChunkStream around another that drops, corrupts or delays data chunks
// as a TransferFaultInjector draws (transfer_faults.h). It acts after the sender numbered a chunk
// and on the sender's thread, as a faulty network would: a dropped chunk leaves a gap in the
// numbers, a delay holds the stream and not the engine. The end message passes untouched.
#pragma once

#include <memory>
#include <utility>

#include "common/kv_transfer/kv_chunk_stream.h"
#include "common/kv_transfer/transfer_faults.h"

namespace tripod {

class FaultInjectingStream final : public KvChunkStream {
 public:
  // `faults` must outlive the stream.
  FaultInjectingStream(std::unique_ptr<KvChunkStream> inner, TransferFaultInjector& faults)
      : inner_(std::move(inner)), faults_(faults) {}

  void Open() override { inner_->Open(); }
  bool Write(const v1::KvChunk& chunk) override;
  void WriteLast(const v1::KvChunk& end) override { inner_->WriteLast(end); }
  absl::StatusOr<v1::PushKvResponse> Finish() override { return inner_->Finish(); }
  void Cancel() override { inner_->Cancel(); }

 private:
  const std::unique_ptr<KvChunkStream> inner_;
  TransferFaultInjector& faults_;
};

}  // namespace tripod
