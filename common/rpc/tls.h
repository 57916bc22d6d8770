// Mutual TLS for the gRPC channels between the scheduler and the workers: every process of a
// deployment holds the deployment's CA certificate and a certificate of its own signed by it,
// serves only peers that present such a certificate, and presents its own when it calls one (the
// scheduler calling workers, a prefill worker pushing KV to a decode worker). gRPC does the TLS;
// OpenSSL (Debian's libssl) checks the files at start-up, so that a wrong file is a clear error
// then, not a handshake that fails on every call later.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace tripod {

struct TlsFiles {
  std::string ca;    // PEM: the deployment's CA certificate (peers must chain to it)
  std::string cert;  // PEM: this process's certificate (its chain), signed by the CA
  std::string key;   // PEM: the certificate's private key
};

struct TlsPem {
  std::string ca, cert, key;
};

// All three paths empty: plaintext (nullopt). Otherwise all three must be given and readable,
// the certificates and the key must parse, the key must match the certificate and the
// certificate must be signed by the CA; each failure names the file and what is wrong.
absl::StatusOr<std::optional<TlsPem>> LoadTls(const TlsFiles& files);

// A server that requires and verifies a client certificate signed by the CA.
std::shared_ptr<grpc::ServerCredentials> MutualTlsServerCredentials(const TlsPem& pem);
// A client that verifies the server against the CA and presents its own certificate.
std::shared_ptr<grpc::ChannelCredentials> MutualTlsChannelCredentials(const TlsPem& pem);

// The credentials NewWorkerChannel (protocol.h) uses from now on; plaintext until set. Set once
// at start-up, before any channel is made.
void SetWorkerChannelCredentials(std::shared_ptr<grpc::ChannelCredentials> credentials);
std::shared_ptr<grpc::ChannelCredentials> WorkerChannelCredentials();

}  // namespace tripod
