// An asynchronous HTTP/1.1 server (Boost.Asio, Beast's request parser) for APIs that hold many
// slow responses open, such as the scheduler's OpenAI-compatible streams: a connection costs no
// thread, only a socket, a small state and its queued bytes, so a few I/O threads serve thousands
// of open text/event-stream responses.
//
// Each request goes to the handler as an HttpExchange on an I/O thread; the handler answers at
// once or keeps the exchange and answers later from any thread (Respond, or StartStream, Send...,
// End). Per connection:
//  * Keep-alive: HTTP/1.1 keeps the connection unless the request says "Connection: close";
//    HTTP/1.0 closes after the response. A stream ends the connection's use for anything else
//    until End; after End (chunked) it is kept alive too.
//  * While a response is pending or streaming the socket is still read, so that a client that
//    hangs up (end of stream or error; a half-close counts as hanging up) is noticed at once:
//    the exchange is closed and its OnClose callback fires. Bytes the client pipelines meanwhile
//    are kept (up to max_header_bytes) and answered in order afterwards; beyond that the
//    connection closes after the current response.
//  * Limits: a header over max_header_bytes gets 431, a body over max_body_bytes 413, a malformed
//    request 400 (each with a small OpenAI-shaped JSON error body, then the connection closes);
//    a request not complete within read_timeout of its first byte (or of the accept), or an idle
//    keep-alive connection after keepalive_timeout, is closed without an answer; a response
//    write that does not complete within write_timeout, or a stream whose unwritten bytes would
//    pass max_stream_buffer_bytes, cuts the connection. Connections beyond max_connections are
//    closed as soon as they are accepted.
//  * A handler that throws, or drops the exchange without answering, gets the client a 500.
//    An exchange dropped mid-stream ends the stream (terminating chunk).
//  * After an answer that closes the connection, the server half-closes and drops what the
//    client still sends for a moment (bounded), so that the client reads the answer before the
//    socket closes instead of losing it to a reset.
//  * TLS (HttpServerOptions::tls): OpenSSL runs over memory buffers between the socket and the
//    parser, so that the connection keeps its shape (readiness waits, non-blocking reads, one
//    gathered write at a time): received bytes are decrypted before parsing, handshake records
//    and encrypted responses go out through the same write queue, and the limits above count
//    the plaintext (the handshake falls under read_timeout). A client that does not speak TLS
//    is closed without an answer.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/http/http_message.h"

namespace tripod::http {

namespace internal {
struct ExchangeState;
struct ServerCore;
class Connection;
}  // namespace internal

// One request being answered. The handler gets it as a shared_ptr and may keep it, and answer from
// any thread, later; every method is thread-safe.
class HttpExchange {
 public:
  ~HttpExchange();  // unanswered: 500; streaming without End: End()
  HttpExchange(const HttpExchange&) = delete;
  HttpExchange& operator=(const HttpExchange&) = delete;

  const HttpRequest& request() const { return request_; }
  // When the whole request had arrived (Unix seconds): an answer's `created`.
  int64_t received_unix_s() const { return received_unix_s_; }

  // A whole response (with Content-Length). At most one of Respond and StartStream takes effect;
  // later calls are ignored.
  void Respond(HttpResponse response);

  // Starts a text/event-stream response: status 200, Cache-Control: no-cache, chunked (HTTP/1.0:
  // delimited by closing the connection), with the extra headers given. Then Send() pieces such
  // as "data: {...}\n\n", and End() once.
  void StartStream(std::vector<std::pair<std::string, std::string>> headers = {});
  // Queues a piece (an empty one is a no-op). False, and nothing queued, when the stream was not
  // started, has ended, the client is gone or the connection was cut; false as well when this
  // piece would take the connection's unwritten bytes past max_stream_buffer_bytes: that cuts the
  // connection (OnClose fires).
  bool Send(std::string piece);
  void End();  // ends the stream once its pieces are written; later Sends return false

  // `fn` is called once, on an I/O thread, if the client goes away or the connection is cut
  // (buffer limit, timeout, Stop) before the response was completely written; never after that.
  // Set it right away in the handler. If the exchange is already closed, fn is posted to an I/O
  // thread at once (after Stop() has returned: called on this thread). A second call replaces
  // the first callback if it has not fired yet.
  void OnClose(std::function<void()> fn);
  // True once the client is gone or the connection was cut before the response was complete.
  bool closed() const;

 private:
  friend class internal::Connection;
  HttpExchange(HttpRequest request, std::shared_ptr<internal::ExchangeState> state);
  void Post(int kind, std::string bytes, size_t counted);

  const HttpRequest request_;
  const std::shared_ptr<internal::ExchangeState> state_;
  const int64_t received_unix_s_;
};

using Handler = std::function<void(std::shared_ptr<HttpExchange>)>;  // called on an I/O thread

// The server's certificate chain and private key, PEM files (TLS 1.2 and later).
struct HttpTlsFiles {
  std::string cert_file;
  std::string key_file;
};

struct HttpServerOptions {
  int io_threads = 1;
  std::optional<HttpTlsFiles> tls;          // HTTPS; Start refuses files that do not load
  size_t max_header_bytes = 16 * 1024;      // over: 431 and close
  size_t max_body_bytes = 8 * 1024 * 1024;  // over: 413 and close
  // The whole request must arrive within this, from its first byte (a new connection: from the
  // accept), so that a client trickling bytes (slowloris) cannot hold a connection.
  std::chrono::milliseconds read_timeout{30000};
  std::chrono::milliseconds keepalive_timeout{60000};  // an idle keep-alive connection: closed
  // A write of response bytes that has not completed within this cuts the connection (a client
  // that stopped reading). Streams idle between pieces are not affected.
  std::chrono::milliseconds write_timeout{30000};
  int max_connections = 10000;  // beyond: closed as soon as accepted
  // Open connections from one client address, at most (0: no limit). Beyond it a connection's
  // first request is answered 429 and the connection closed; at twice the limit new connections
  // are closed as soon as accepted.
  int max_connections_per_client = 0;
  // A stream's bytes queued and not yet written; a Send beyond it cuts the connection.
  size_t max_stream_buffer_bytes = 4 * 1024 * 1024;
};

class HttpServer {
 public:
  // Listens on address:port (an IP address or a host name; port 0: any free port, see port()).
  // An address that does not resolve, a port that cannot be bound, or TLS files that do not load
  // (or a key that is not the certificate's) is an error status.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const std::string& address, int port,
                                                           Handler handler,
                                                           HttpServerOptions options = {});
  ~HttpServer();  // Stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }
  int open_connections() const;  // accepted and not yet closed (for metrics)

  // Closes the listener and every connection (OnClose callbacks of open exchanges fire, on the I/O
  // threads, before it returns) and joins the I/O threads. Idempotent; safe from any thread but
  // an I/O thread (a handler or an OnClose callback). Exchanges may outlive the server: their
  // calls then do nothing (Send returns false).
  void Stop();

 private:
  struct Impl;
  explicit HttpServer(std::unique_ptr<Impl> impl, int port);
  std::unique_ptr<Impl> impl_;
  const int port_;
};

}  // namespace tripod::http
