// libFuzzer target for the HTTP server's request handling as a client meets it: the server runs in
// this process (ASan and UBSan see its code) on loopback with small limits, and each input is
// cut into up to four pieces sent on a fresh connection one after another (so that the parser is
// fed incrementally, as TCP delivers), then the client half-closes and reads to the end.
// Promises checked: no crash or sanitizer report; the server answers or closes within seconds
// (never hangs on any byte sequence); whatever it sends back is a run of well-formed HTTP/1.1
// responses, each with a status line and a body of the length it announces; and after every
// input the server still answers a plain request.
//
// Handler: GET /stream streams two pieces; anything else is echoed (method, target and body
// size), so that requests that parse reach a handler and their answers are checked too.
#include <arpa/inet.h>
#include <fuzzer/FuzzedDataProvider.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/http/http_server.h"
#include "tests/unit/common/http/loopback_socket.h"

namespace {

using tripod::http::HttpExchange;
using tripod::http::HttpResponse;
using tripod::http::HttpServer;
using tripod::http::HttpServerOptions;

void Check(bool ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "http_fuzz: %s\n", what);
    std::abort();
  }
}

HttpServer* Server() {
  static HttpServer* server = [] {
    HttpServerOptions o;
    o.max_header_bytes = 2048;
    o.max_body_bytes = 4096;
    o.read_timeout = std::chrono::milliseconds(3000);
    o.keepalive_timeout = std::chrono::milliseconds(3000);
    auto s = HttpServer::Start(
        "127.0.0.1", 0,
        [](std::shared_ptr<HttpExchange> e) {
          if (e->request().path == "/stream") {
            e->StartStream();
            e->Send("data: one\n\n");
            e->Send("data: two\n\n");
            e->End();
            return;
          }
          HttpResponse r;
          r.content_type = "text/plain";
          r.body = absl::StrCat(e->request().method, " ", e->request().target, " ",
                                e->request().body.size());
          e->Respond(std::move(r));
        },
        o);
    Check(s.ok(), "the server does not start");
    return s->release();
  }();
  return server;
}

int Connect(int port) {
  // A read this long (past the server's own timeouts) is a hang.
  const int fd = tripod::testing::ConnectLoopback(port, 10);
  Check(fd >= 0, "connect");
  return fd;
}

// Everything the server sends until it closes; aborts when nothing ends within the timeout.
std::string ReadAll(int fd) {
  std::string out;
  char buf[4096];
  while (true) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) return out;
    Check(errno == ECONNRESET || errno == EPIPE, "the server neither answered nor closed");
    return out;
  }
}

// Checks that `bytes` is a run of HTTP/1.1 responses (the last may be cut by a reset).
void CheckResponses(const std::string& bytes) {
  size_t at = 0;
  while (at < bytes.size()) {
    const size_t head_end = bytes.find("\r\n\r\n", at);
    if (head_end == std::string::npos) return;  // cut short (the connection was reset)
    const std::string head = bytes.substr(at, head_end - at);
    Check(head.rfind("HTTP/1.1 ", 0) == 0 && head.size() >= 12, "not an HTTP/1.1 status line");
    int status = 0;
    Check(absl::SimpleAtoi(head.substr(9, 3), &status) && status >= 100 && status <= 599,
          "a bad status code");
    size_t body = 0;
    bool chunked = false;
    for (size_t line = head.find("\r\n"); line != std::string::npos;
         line = head.find("\r\n", line + 2)) {
      const size_t end = head.find("\r\n", line + 2);
      std::string h = head.substr(line + 2, end == std::string::npos ? end : end - line - 2);
      for (char& c : h) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (h.rfind("content-length:", 0) == 0) {
        Check(absl::SimpleAtoi(h.substr(15), &body), "a bad Content-Length");
      }
      if (h == "transfer-encoding: chunked") chunked = true;
    }
    at = head_end + 4;
    if (chunked) {
      while (true) {
        const size_t eol = bytes.find("\r\n", at);
        if (eol == std::string::npos) return;
        size_t size = 0;
        Check(absl::SimpleHexAtoi(bytes.substr(at, eol - at), &size), "a bad chunk size");
        at = eol + 2 + size + 2;
        if (size == 0 || at > bytes.size()) break;
      }
    } else {
      at += body;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  HttpServer* server = Server();
  FuzzedDataProvider in(data, size);
  const int pieces = in.ConsumeIntegralInRange<int>(1, 4);
  const int fd = Connect(server->port());
  for (int i = 0; i < pieces && in.remaining_bytes() > 0; ++i) {
    const std::string piece =
        i + 1 == pieces ? in.ConsumeRemainingBytesAsString() : in.ConsumeRandomLengthString(2048);
    if (send(fd, piece.data(), piece.size(), MSG_NOSIGNAL) < 0) break;  // closed on us: fine
  }
  shutdown(fd, SHUT_WR);
  CheckResponses(ReadAll(fd));
  close(fd);

  // The server still serves.
  const int ok = Connect(server->port());
  const std::string get = "GET /alive HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  Check(send(ok, get.data(), get.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(get.size()),
        "send to a live server");
  const std::string answer = ReadAll(ok);
  Check(answer.rfind("HTTP/1.1 200 ", 0) == 0, "the server stopped answering plain requests");
  close(ok);
  return 0;
}
