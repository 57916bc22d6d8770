// The HTTP server's TLS path (OpenSSL over memory BIOs on each connection's strand) driven by real
// OpenSSL clients on loopback, with a certificate made here: whole answers and streams on several
// connections at once, keep-alive over one TLS session, a plaintext client refused, and a client
// that quits in the middle of the handshake. It is one of the concurrency tests that the test
// command also runs under ThreadSanitizer (tests/CMakeLists.txt), which is the point: the
// Python tests of HTTPS run the release build.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/http/http_server.h"
#include "gtest/gtest.h"
#include "tests/unit/common/http/loopback_socket.h"

namespace tripod::http {
namespace {

// A self-signed P-256 certificate and its key, as PEM files in a fresh directory.
struct CertFiles {
  std::string dir, cert, key;
  ~CertFiles() {
    if (!dir.empty()) std::filesystem::remove_all(dir);
  }
};

bool MakeCert(CertFiles* f) {
  char tmpl[] = "/tmp/tripod_https_test_XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return false;
  f->dir = tmpl;
  f->cert = f->dir + "/cert.pem";
  f->key = f->dir + "/key.pem";
  EVP_PKEY* pkey = EVP_EC_gen("P-256");
  X509* x = X509_new();
  bool ok = pkey != nullptr && x != nullptr;
  if (ok) {
    X509_set_version(x, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
    X509_gmtime_adj(X509_getm_notBefore(x), -60);
    X509_gmtime_adj(X509_getm_notAfter(x), 3600);
    X509_set_pubkey(x, pkey);
    X509_NAME* name = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>("localhost"), -1, -1, 0);
    X509_set_issuer_name(x, name);
    ok = X509_sign(x, pkey, EVP_sha256()) > 0;
  }
  FILE* c = ok ? fopen(f->cert.c_str(), "w") : nullptr;
  FILE* k = ok ? fopen(f->key.c_str(), "w") : nullptr;
  ok = ok && c != nullptr && k != nullptr && PEM_write_X509(c, x) == 1 &&
       PEM_write_PrivateKey(k, pkey, nullptr, nullptr, 0, nullptr, nullptr) == 1;
  if (c != nullptr) fclose(c);
  if (k != nullptr) fclose(k);
  X509_free(x);
  EVP_PKEY_free(pkey);
  return ok;
}

// A blocking TLS client (no certificate check: what is tested is the server's side of TLS; the
// integration tests check verification with a CA).
class TlsClient {
 public:
  explicit TlsClient(int port) {
    ctx_ = SSL_CTX_new(TLS_client_method());
    fd_ = tripod::testing::ConnectLoopback(port, 10);
    if (ctx_ == nullptr || fd_ < 0) return;
    SSL_CTX_set_verify(ctx_, SSL_VERIFY_NONE, nullptr);
    ssl_ = SSL_new(ctx_);
    SSL_set_fd(ssl_, fd_);
    connected_ = SSL_connect(ssl_) == 1;
  }
  ~TlsClient() {
    if (ssl_ != nullptr) {
      if (connected_) SSL_shutdown(ssl_);
      SSL_free(ssl_);
    }
    if (fd_ >= 0) close(fd_);
    SSL_CTX_free(ctx_);
    ERR_clear_error();
  }
  TlsClient(const TlsClient&) = delete;
  TlsClient& operator=(const TlsClient&) = delete;

  bool connected() const { return connected_; }
  bool Send(const std::string& s) {
    return connected_ &&
           SSL_write(ssl_, s.data(), static_cast<int>(s.size())) == static_cast<int>(s.size());
  }
  // Reads until `until` appears in what came (returned whole), or the connection ends.
  std::string ReadUntil(const std::string& until) {
    while (buf_.find(until) == std::string::npos) {
      char b[4096];
      const int n = SSL_read(ssl_, b, sizeof(b));
      if (n <= 0) break;
      buf_.append(b, static_cast<size_t>(n));
    }
    const size_t at = buf_.find(until);
    if (at == std::string::npos) return std::exchange(buf_, std::string());
    std::string out = buf_.substr(0, at + until.size());
    buf_.erase(0, at + until.size());
    return out;
  }

 private:
  SSL_CTX* ctx_ = nullptr;
  SSL* ssl_ = nullptr;
  int fd_ = -1;
  bool connected_ = false;
  std::string buf_;
};

void Handle(std::shared_ptr<HttpExchange> e) {
  if (e->request().path == "/stream") {
    e->StartStream();
    for (int i = 0; i < 5; ++i) e->Send("data: piece " + std::to_string(i) + "\n\n");
    e->Send("data: [DONE]\n\n");
    e->End();
    return;
  }
  HttpResponse r;
  r.content_type = "text/plain";
  r.body = "hello " + e->request().path;
  e->Respond(std::move(r));
}

class HttpsServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(MakeCert(&certs_));
    HttpServerOptions o;
    o.io_threads = 2;  // connections on different threads, as with --io_threads
    o.tls = HttpTlsFiles{certs_.cert, certs_.key};
    absl::StatusOr<std::unique_ptr<HttpServer>> s = HttpServer::Start("127.0.0.1", 0, Handle, o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
  }

  CertFiles certs_;
  std::unique_ptr<HttpServer> server_;
};

TEST_F(HttpsServerTest, AnswersAndStreamsOnConcurrentConnections) {
  constexpr int kClients = 8;
  std::vector<std::thread> threads;
  std::vector<int> good(kClients, 0);
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([this, c, &good] {
      TlsClient client(server_->port());
      if (!client.connected()) return;
      // Keep-alive: three requests on one TLS session, a stream between two answers.
      if (!client.Send("GET /a" + std::to_string(c) + " HTTP/1.1\r\nHost: x\r\n\r\n")) return;
      const std::string first = client.ReadUntil("hello /a" + std::to_string(c));
      if (first.rfind("HTTP/1.1 200 ", 0) == 0) ++good[c];
      if (!client.Send("GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")) return;
      const std::string stream = client.ReadUntil("0\r\n\r\n");
      if (stream.rfind("HTTP/1.1 200 ", 0) == 0 &&
          stream.find("data: piece 4") != std::string::npos &&
          stream.find("data: [DONE]") != std::string::npos) {
        ++good[c];
      }
      if (!client.Send("GET /b HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")) return;
      const std::string last = client.ReadUntil("hello /b");
      if (last.rfind("HTTP/1.1 200 ", 0) == 0) ++good[c];
    });
  }
  for (std::thread& t : threads) t.join();
  for (int c = 0; c < kClients; ++c) EXPECT_EQ(good[c], 3) << "client " << c;
}

TEST_F(HttpsServerTest, PlaintextAndHalfHandshakesAreDroppedAndTheServerServesOn) {
  {
    // Plain HTTP to the TLS port: no HTTP answer comes back.
    const int fd = tripod::testing::ConnectLoopback(server_->port(), 10);
    ASSERT_GE(fd, 0);
    const std::string get = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    ASSERT_EQ(send(fd, get.data(), get.size(), MSG_NOSIGNAL), static_cast<ssize_t>(get.size()));
    char b[256];
    const ssize_t n = recv(fd, b, sizeof(b), 0);
    EXPECT_TRUE(n <= 0 || std::string(b, static_cast<size_t>(n)).rfind("HTTP/", 0) != 0);
    close(fd);
  }
  {
    // A client that sends half a ClientHello and leaves.
    const int fd = tripod::testing::ConnectLoopback(server_->port(), 10);
    ASSERT_GE(fd, 0);
    const unsigned char hello_start[] = {0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc};
    ASSERT_EQ(send(fd, hello_start, sizeof(hello_start), MSG_NOSIGNAL),
              static_cast<ssize_t>(sizeof(hello_start)));
    close(fd);
  }
  TlsClient client(server_->port());
  ASSERT_TRUE(client.connected());
  ASSERT_TRUE(client.Send("GET /after HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_EQ(client.ReadUntil("hello /after").rfind("HTTP/1.1 200 ", 0), 0u);
}

}  // namespace
}  // namespace tripod::http
