// The /health and /metrics HTTP endpoint, served by the project's HTTP server
// (common/http/http_server.h); see http_endpoint.h.
#include "common/metrics/http_endpoint.h"

#include <string_view>
#include <utility>

#include "common/http/http_server.h"

namespace tripod::metrics {
namespace {

constexpr size_t kMaxHeaderBytes = 8 * 1024;
constexpr size_t kMaxBodyBytes = 1024;  // these endpoints take no body
constexpr char kMetricsContentType[] = "text/plain; version=0.0.4; charset=utf-8";

http::HttpResponse Text(int status, std::string body) {
  http::HttpResponse r;
  r.status = status;
  r.content_type = "text/plain";
  r.body = std::move(body);
  return r;
}

}  // namespace

struct HttpEndpoint::Impl {
  const Registry* registry = nullptr;
  HealthFn health;
  std::unique_ptr<http::HttpServer> server;

  // On the server's I/O thread; answers at once.
  void Handle(const std::shared_ptr<http::HttpExchange>& exchange) const {
    const http::HttpRequest& req = exchange->request();
    if (req.method != "GET") {
      http::HttpResponse r = Text(405, "only GET is served here\n");
      r.headers.emplace_back("Allow", "GET");
      exchange->Respond(std::move(r));
    } else if (req.path == "/metrics") {
      http::HttpResponse r = Text(200, registry->Exposition());
      r.content_type = kMetricsContentType;
      exchange->Respond(std::move(r));
    } else if (req.path == "/health") {
      HealthReport report = health ? health() : HealthReport{true, "{}"};
      http::HttpResponse r;
      r.status = report.ready ? 200 : 503;
      r.body = std::move(report.json);
      exchange->Respond(std::move(r));
    } else {
      exchange->Respond(Text(404, "not found; try /health or /metrics\n"));
    }
  }
};

absl::StatusOr<std::unique_ptr<HttpEndpoint>> HttpEndpoint::Start(const std::string& address,
                                                                  int port,
                                                                  const Registry* registry,
                                                                  HealthFn health,
                                                                  HttpEndpointOptions options) {
  if (registry == nullptr) return absl::InvalidArgumentError("http endpoint: no registry");
  auto impl = std::make_unique<Impl>();
  impl->registry = registry;
  impl->health = std::move(health);
  http::HttpServerOptions server_options;
  server_options.io_threads = 1;  // scrapes and probes are few
  server_options.max_header_bytes = kMaxHeaderBytes;
  server_options.max_body_bytes = kMaxBodyBytes;
  server_options.read_timeout = options.idle_timeout;
  server_options.keepalive_timeout = options.idle_timeout;
  server_options.write_timeout = options.idle_timeout;
  server_options.max_connections = options.max_connections;
  const Impl* raw = impl.get();
  absl::StatusOr<std::unique_ptr<http::HttpServer>> server = http::HttpServer::Start(
      address, port, [raw](std::shared_ptr<http::HttpExchange> exchange) { raw->Handle(exchange); },
      server_options);
  if (!server.ok()) return server.status();
  impl->server = std::move(*server);
  return std::unique_ptr<HttpEndpoint>(new HttpEndpoint(std::move(impl)));
}

HttpEndpoint::HttpEndpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpEndpoint::~HttpEndpoint() { Stop(); }

int HttpEndpoint::port() const { return impl_->server->port(); }

void HttpEndpoint::Stop() { impl_->server->Stop(); }

}  // namespace tripod::metrics
