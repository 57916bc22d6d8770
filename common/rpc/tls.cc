// Loading and checking the TLS files, and the gRPC credentials made of them; see tls.h.
#include "common/rpc/tls.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <fstream>
#include <mutex>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/util/mutex.h"

namespace tripod {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(what, " ", path, ": cannot be read"));
  std::ostringstream s;
  s << in.rdbuf();
  if (s.str().empty()) return absl::InvalidArgumentError(absl::StrCat(what, " ", path, ": empty"));
  return s.str();
}

std::string OpenSslError() {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "not PEM";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  return buf;
}

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct StoreFree {
  void operator()(X509_STORE* s) const { X509_STORE_free(s); }
};
struct StoreCtxFree {
  void operator()(X509_STORE_CTX* c) const { X509_STORE_CTX_free(c); }
};

std::unique_ptr<BIO, BioFree> Bio(const std::string& pem) {
  return std::unique_ptr<BIO, BioFree>(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

absl::StatusOr<std::unique_ptr<X509, X509Free>> ParseCert(const std::string& pem,
                                                          const std::string& path,
                                                          const char* what) {
  auto bio = Bio(pem);
  std::unique_ptr<X509, X509Free> x(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (!x) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", path, ": not a PEM certificate (", OpenSslError(), ")"));
  }
  return x;
}

Mutex& CredentialsMutex() {
  static Mutex mu;
  return mu;
}
std::shared_ptr<grpc::ChannelCredentials>& CredentialsSlot() {
  static std::shared_ptr<grpc::ChannelCredentials> creds;
  return creds;
}

}  // namespace

absl::StatusOr<std::optional<TlsPem>> LoadTls(const TlsFiles& f) {
  const int given = !f.ca.empty() + !f.cert.empty() + !f.key.empty();
  if (given == 0) return std::nullopt;
  if (given != 3) {
    return absl::InvalidArgumentError(
        "TLS needs all three of --tls_ca, --tls_cert and --tls_key (or none of them)");
  }
  TlsPem pem;
  {
    absl::StatusOr<std::string> ca = ReadFile(f.ca, "--tls_ca");
    if (!ca.ok()) return ca.status();
    absl::StatusOr<std::string> cert = ReadFile(f.cert, "--tls_cert");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadFile(f.key, "--tls_key");
    if (!key.ok()) return key.status();
    pem = TlsPem{*std::move(ca), *std::move(cert), *std::move(key)};
  }
  absl::StatusOr<std::unique_ptr<X509, X509Free>> ca = ParseCert(pem.ca, f.ca, "--tls_ca");
  if (!ca.ok()) return ca.status();
  absl::StatusOr<std::unique_ptr<X509, X509Free>> cert = ParseCert(pem.cert, f.cert, "--tls_cert");
  if (!cert.ok()) return cert.status();
  auto key_bio = Bio(pem.key);
  std::unique_ptr<EVP_PKEY, KeyFree> key(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
  if (!key) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls_key ", f.key, ": not an unencrypted PEM private key (", OpenSslError(), ")"));
  }
  if (X509_check_private_key(cert->get(), key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_key ", f.key, " is not the private key of --tls_cert ", f.cert));
  }
  // The certificate must chain to the CA (intermediates may follow it in the cert file).
  std::unique_ptr<X509_STORE, StoreFree> store(X509_STORE_new());
  X509_STORE_add_cert(store.get(), ca->get());
  STACK_OF(X509)* chain = sk_X509_new_null();
  {
    auto bio = Bio(pem.cert);
    X509* first = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr);
    X509_free(first);
    while (X509* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
      sk_X509_push(chain, x);
    }
    ERR_clear_error();
  }
  std::unique_ptr<X509_STORE_CTX, StoreCtxFree> ctx(X509_STORE_CTX_new());
  X509_STORE_CTX_init(ctx.get(), store.get(), cert->get(), chain);
  const bool verified = X509_verify_cert(ctx.get()) == 1;
  const int err = X509_STORE_CTX_get_error(ctx.get());
  sk_X509_pop_free(chain, X509_free);
  ERR_clear_error();
  if (!verified) {
    return absl::InvalidArgumentError(absl::StrCat("--tls_cert ", f.cert,
                                                   " does not verify against --tls_ca ", f.ca, ": ",
                                                   X509_verify_cert_error_string(err)));
  }
  return pem;
}

std::shared_ptr<grpc::ServerCredentials> MutualTlsServerCredentials(const TlsPem& pem) {
  grpc::SslServerCredentialsOptions o(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  o.pem_root_certs = pem.ca;
  o.pem_key_cert_pairs.push_back({pem.key, pem.cert});
  return grpc::SslServerCredentials(o);
}

std::shared_ptr<grpc::ChannelCredentials> MutualTlsChannelCredentials(const TlsPem& pem) {
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = pem.ca;
  o.pem_private_key = pem.key;
  o.pem_cert_chain = pem.cert;
  return grpc::SslCredentials(o);
}

void SetWorkerChannelCredentials(std::shared_ptr<grpc::ChannelCredentials> credentials) {
  MutexLock lock(&CredentialsMutex());
  CredentialsSlot() = std::move(credentials);
}

std::shared_ptr<grpc::ChannelCredentials> WorkerChannelCredentials() {
  MutexLock lock(&CredentialsMutex());
  if (!CredentialsSlot()) return grpc::InsecureChannelCredentials();
  return CredentialsSlot();
}

}  // namespace tripod
