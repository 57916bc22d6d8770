// PushKvStream: a KvChunkStream on the Decode.PushKv client-streaming call.
#pragma once

#include <chrono>
#include <memory>

#include "common/kv_transfer/kv_chunk_stream.h"
#include "grpcpp/grpcpp.h"
#include "tripod/v1/decode.grpc.pb.h"

namespace tripod {

class PushKvStream final : public KvChunkStream {
 public:
  // The call goes on `channel`, with `deadline` for the whole of it (max(): none).
  explicit PushKvStream(std::shared_ptr<grpc::Channel> channel,
                        std::chrono::system_clock::time_point deadline =
                            std::chrono::system_clock::time_point::max());

  void Open() override;
  bool Write(const v1::KvChunk& chunk) override;
  void WriteLast(const v1::KvChunk& end) override;
  absl::StatusOr<v1::PushKvResponse> Finish() override;
  void Cancel() override;

 private:
  const std::shared_ptr<grpc::Channel> channel_;
  // Made here and kept to the end, so that Cancel may TryCancel it at any time (gRPC cancels a
  // call that starts after TryCancel).
  const std::unique_ptr<grpc::ClientContext> ctx_;
  std::unique_ptr<v1::Decode::Stub> stub_;
  std::unique_ptr<grpc::ClientWriter<v1::KvChunk>> writer_;
  v1::PushKvResponse response_;
};

}  // namespace tripod
