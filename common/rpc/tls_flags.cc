// The TLS flags; see tls_flags.h.
#include "common/rpc/tls_flags.h"

#include <string>

#include "absl/flags/flag.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, tls_ca, "",
          "mutual TLS on gRPC: the deployment's CA certificate (PEM); peers must present a "
          "certificate it signed. With --tls_cert and --tls_key; none of the three: plaintext");
ABSL_FLAG(std::string, tls_cert, "",
          "mutual TLS on gRPC: this process's certificate (PEM), signed by --tls_ca");
ABSL_FLAG(std::string, tls_key, "", "mutual TLS on gRPC: --tls_cert's private key (PEM)");

namespace tripod {

TlsFiles TlsFilesFromFlags() {
  return TlsFiles{absl::GetFlag(FLAGS_tls_ca), absl::GetFlag(FLAGS_tls_cert),
                  absl::GetFlag(FLAGS_tls_key)};
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> SetUpGrpcTlsFromFlags() {
  const TlsFiles files = TlsFilesFromFlags();
  absl::StatusOr<std::optional<TlsPem>> pem = LoadTls(files);
  if (!pem.ok()) return pem.status();
  if (!pem->has_value()) return grpc::InsecureServerCredentials();
  SetWorkerChannelCredentials(MutualTlsChannelCredentials(**pem));
  spdlog::info("gRPC: mutual TLS (CA {}, certificate {})", files.ca, files.cert);
  return MutualTlsServerCredentials(**pem);
}

}  // namespace tripod
