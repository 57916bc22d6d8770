// The TLS flags every gRPC process of a deployment takes (--tls_ca, --tls_cert, --tls_key; see
// tls.h) and the one call each main makes with them.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "common/rpc/tls.h"
#include "grpcpp/grpcpp.h"

namespace tripod {

TlsFiles TlsFilesFromFlags();

// Loads and checks the files the flags name, makes NewWorkerChannel present this process's
// certificate, and returns the credentials its gRPC server listens with: mutual TLS, or
// plaintext when no TLS flag is given.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> SetUpGrpcTlsFromFlags();

}  // namespace tripod
