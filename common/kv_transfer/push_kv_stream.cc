// PushKvStream; see push_kv_stream.h.
#include "common/kv_transfer/push_kv_stream.h"

#include <utility>

#include "common/rpc/protocol.h"

namespace tripod {
namespace {

std::unique_ptr<grpc::ClientContext> MakeContext(std::chrono::system_clock::time_point deadline) {
  std::unique_ptr<grpc::ClientContext> ctx = NewClientContext();
  if (deadline != std::chrono::system_clock::time_point::max()) ctx->set_deadline(deadline);
  return ctx;
}

}  // namespace

PushKvStream::PushKvStream(std::shared_ptr<grpc::Channel> channel,
                           std::chrono::system_clock::time_point deadline)
    : channel_(std::move(channel)), ctx_(MakeContext(deadline)) {}

void PushKvStream::Open() {
  stub_ = v1::Decode::NewStub(channel_);
  writer_ = stub_->PushKv(ctx_.get(), &response_);
}

bool PushKvStream::Write(const v1::KvChunk& chunk) { return writer_->Write(chunk); }

void PushKvStream::WriteLast(const v1::KvChunk& end) {
  writer_->WriteLast(end, grpc::WriteOptions());  // with WritesDone
}

absl::StatusOr<v1::PushKvResponse> PushKvStream::Finish() {
  const grpc::Status s = writer_->Finish();
  if (!s.ok()) return FromGrpcStatus(s);
  return response_;
}

void PushKvStream::Cancel() { ctx_->TryCancel(); }

}  // namespace tripod
