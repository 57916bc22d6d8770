// The HTTP port beside every worker's gRPC port: GET /health (JSON, 200 when ready, 503 when
// not) and GET /metrics (the registry's exposition). Served by common/http's HttpServer on one I/O
// thread: scrapes and probes are few, and nothing here may block a compute or gRPC thread. Anything
// else gets 404 (unknown path) or 405 (other methods, with Allow: GET). Requests are bounded: a
// header over 8 KiB gets 431, a body over 1 KiB (these endpoints take none) 413, a malformed
// request 400, and each closes the connection. Keep-alive is supported; a connection that has not
// sent a whole request within the idle timeout (30 s) is closed, so a slow client cannot hold it.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/metrics/metrics.h"

namespace tripod::metrics {

struct HealthReport {
  bool ready = true;
  std::string json;  // the body
};

struct HttpEndpointOptions {
  // From the start of reading a request to its last byte, and for writing a response.
  std::chrono::milliseconds idle_timeout{30000};
  // Connections beyond this are closed as soon as they are accepted.
  int max_connections = 64;
};

class HttpEndpoint {
 public:
  using HealthFn = std::function<HealthReport()>;  // called on the I/O thread; thread-safe

  // Listens on address:port (an IP address or a host name; port 0: any free port, see port()).
  // `registry` must outlive it. An address that does not resolve or a port that cannot be bound
  // is an error status.
  static absl::StatusOr<std::unique_ptr<HttpEndpoint>> Start(
      const std::string& address, int port, const Registry* registry, HealthFn health,
      HttpEndpointOptions options = HttpEndpointOptions());
  ~HttpEndpoint();  // Stop()
  HttpEndpoint(const HttpEndpoint&) = delete;
  HttpEndpoint& operator=(const HttpEndpoint&) = delete;

  int port() const;
  // Closes the listener and every connection, joins the I/O thread. Idempotent and safe from
  // any thread but the I/O thread itself (that is, not from the health function).
  void Stop();

 private:
  struct Impl;
  explicit HttpEndpoint(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tripod::metrics
