// Protocol version checks, status conversion and channels; see protocol.h.
#include "common/rpc/protocol.h"

#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/rpc/tls.h"

namespace tripod {

std::unique_ptr<grpc::ClientContext> NewClientContext(std::chrono::milliseconds timeout) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->AddMetadata(kProtocolMetadataKey, std::to_string(kProtocolVersion));
  if (timeout.count() > 0) ctx->set_deadline(std::chrono::system_clock::now() + timeout);
  return ctx;
}

grpc::Status CheckProtocol(const grpc::ServerContextBase& context) {
  const auto& md = context.client_metadata();
  auto it = md.find(kProtocolMetadataKey);
  if (it == md.end()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("tripod protocol: the caller sent no ", kProtocolMetadataKey,
                                     " metadata; this worker speaks version ", kProtocolVersion));
  }
  const std::string got(it->second.data(), it->second.size());
  uint32_t v = 0;
  if (!absl::SimpleAtoi(got, &v) || v != kProtocolVersion) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("tripod protocol version mismatch: the caller speaks \"", got,
                                     "\", this worker ", kProtocolVersion));
  }
  return grpc::Status::OK;
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl and gRPC share the canonical code numbers.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

grpc::ChannelArguments WorkerChannelArguments() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(8 << 20);
  args.SetMaxSendMessageSize(8 << 20);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kWorkerKeepaliveTimeMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kWorkerKeepaliveTimeoutMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  return args;
}

std::shared_ptr<grpc::Channel> NewWorkerChannel(const std::string& address,
                                                const std::string& tls_name) {
  grpc::ChannelArguments args = WorkerChannelArguments();
  if (!tls_name.empty()) args.SetSslTargetNameOverride(tls_name);
  return grpc::CreateCustomChannel(address, WorkerChannelCredentials(), args);
}

}  // namespace tripod
