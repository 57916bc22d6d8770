// The /health and /metrics HTTP endpoint over Boost.Beast; see http_endpoint.h.
#include "common/metrics/http_endpoint.h"

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <optional>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/util/mutex.h"

namespace tripod::metrics {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

constexpr size_t kMaxHeaderBytes = 8 * 1024;
constexpr size_t kMaxBodyBytes = 1024;
// Room for a whole request and some of the next one a client pipelines.
constexpr size_t kMaxBufferBytes = 16 * 1024;
// After an answer that ends a connection, what the client may still send is read and dropped for
// this long (and up to this much), so that closing with unread bytes does not reset the
// connection before the client has read the answer.
constexpr std::chrono::milliseconds kLinger{2000};
constexpr size_t kMaxLingerBytes = 64 * 1024;
constexpr char kMetricsContentType[] = "text/plain; version=0.0.4; charset=utf-8";

// What every connection needs from its endpoint; owned by the endpoint, read-only.
struct Context {
  const Registry* registry = nullptr;
  HttpEndpoint::HealthFn health;
  HttpEndpointOptions options;
};

// One connection: read a request, answer it, and again while the client keeps it alive. Owned by
// the handlers of its pending operation (shared_from_this); the endpoint keeps a weak reference
// to close it on Stop().
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, const Context* ctx) : stream_(std::move(socket)), ctx_(ctx) {}

  void Start() { ReadRequest(); }

  // Closing the socket ends the pending operation (its handler then never runs: Stop() stops the
  // I/O context right after).
  void Close() { stream_.close(); }

 private:
  void ReadRequest() {
    parser_.emplace();
    parser_->header_limit(kMaxHeaderBytes);
    parser_->body_limit(kMaxBodyBytes);
    // One deadline for the whole request, not per read: a client that trickles bytes is cut off.
    stream_.expires_after(ctx_->options.idle_timeout);
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
  }

  void OnRead(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == http::error::partial_message) {
      CloseGracefully();  // the client is done (or gave up mid-request)
      return;
    }
    if (ec == http::error::header_limit || ec == http::error::buffer_overflow) {
      Respond(http::status::request_header_fields_too_large, "text/plain",
              "request header too large\n", /*keep_alive=*/false, 11);
      return;
    }
    if (ec == http::error::body_limit) {
      Respond(http::status::payload_too_large, "text/plain", "request body too large\n", false, 11);
      return;
    }
    if (ec && ec.category() == http::make_error_code(http::error::bad_method).category()) {
      Respond(http::status::bad_request, "text/plain", "malformed request\n", false, 11);
      return;
    }
    if (ec) return;  // timeout (the stream is closed), reset, or Stop()

    const http::request<http::string_body>& req = parser_->get();
    const bool keep_alive = req.keep_alive();
    std::string_view target(req.target().data(), req.target().size());
    target = target.substr(0, target.find('?'));
    if (req.method() != http::verb::get) {
      Respond(http::status::method_not_allowed, "text/plain", "only GET is served here\n",
              keep_alive, req.version(), /*allow_get=*/true);
    } else if (target == "/metrics") {
      Respond(http::status::ok, kMetricsContentType, ctx_->registry->Exposition(), keep_alive,
              req.version());
    } else if (target == "/health") {
      HealthReport report = ctx_->health ? ctx_->health() : HealthReport{true, "{}"};
      Respond(report.ready ? http::status::ok : http::status::service_unavailable,
              "application/json", std::move(report.json), keep_alive, req.version());
    } else {
      Respond(http::status::not_found, "text/plain", "not found; try /health or /metrics\n",
              keep_alive, req.version());
    }
  }

  void Respond(http::status status, std::string_view content_type, std::string body,
               bool keep_alive, unsigned version, bool allow_get = false) {
    response_ = {};
    response_.version(version);
    response_.result(status);
    response_.set(http::field::server, "tripod");
    response_.set(http::field::content_type,
                  beast::string_view(content_type.data(), content_type.size()));
    if (allow_get) response_.set(http::field::allow, "GET");
    response_.keep_alive(keep_alive);
    response_.body() = std::move(body);
    response_.prepare_payload();
    stream_.expires_after(ctx_->options.idle_timeout);
    http::async_write(stream_, response_,
                      [self = shared_from_this(), keep_alive](beast::error_code ec, size_t) {
                        if (ec) return;
                        if (keep_alive) {
                          self->ReadRequest();
                        } else {
                          self->CloseGracefully();
                        }
                      });
  }

  void CloseGracefully() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    if (ec) {
      stream_.close();
      return;
    }
    stream_.expires_after(std::min<std::chrono::milliseconds>(kLinger, ctx_->options.idle_timeout));
    Drain();
  }

  void Drain() {
    stream_.async_read_some(asio::buffer(drain_),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              self->drained_ += n;
                              if (ec || self->drained_ > kMaxLingerBytes) {
                                self->stream_.close();
                                return;
                              }
                              self->Drain();
                            });
  }

  beast::tcp_stream stream_;
  const Context* ctx_;
  beast::flat_buffer buffer_{kMaxBufferBytes};
  std::optional<http::request_parser<http::string_body>> parser_;
  http::response<http::string_body> response_;
  char drain_[4096];
  size_t drained_ = 0;
};

}  // namespace

struct HttpEndpoint::Impl {
  // Declared first so that it is destroyed last: its destructor destroys the handlers still
  // queued, and with them the sessions they own.
  asio::io_context ioc{1};
  tcp::acceptor acceptor{ioc};
  asio::steady_timer retry{ioc};
  Context ctx;
  int port = 0;
  std::vector<std::weak_ptr<Session>> sessions;  // touched on the I/O thread only
  std::thread thread;
  Mutex stop_mu;
  bool stopped ABSL_GUARDED_BY(stop_mu) = false;

  void Accept() {
    acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
      if (!acceptor.is_open()) return;  // Stop()
      if (ec) {
        // Out of descriptors, say: retry a little later rather than spin.
        retry.expires_after(std::chrono::milliseconds(100));
        retry.async_wait([this](beast::error_code wait_ec) {
          if (!wait_ec) Accept();
        });
        return;
      }
      std::erase_if(sessions, [](const std::weak_ptr<Session>& s) { return s.expired(); });
      if (static_cast<int>(sessions.size()) >= ctx.options.max_connections) {
        beast::error_code close_ec;
        socket.close(close_ec);
      } else {
        auto session = std::make_shared<Session>(std::move(socket), &ctx);
        sessions.push_back(session);
        session->Start();
      }
      Accept();
    });
  }

  void CloseAll() {
    beast::error_code ec;
    acceptor.close(ec);
    retry.cancel();
    for (const std::weak_ptr<Session>& weak : sessions) {
      if (std::shared_ptr<Session> s = weak.lock()) s->Close();
    }
    sessions.clear();
  }
};

absl::StatusOr<std::unique_ptr<HttpEndpoint>> HttpEndpoint::Start(const std::string& address,
                                                                  int port,
                                                                  const Registry* registry,
                                                                  HealthFn health,
                                                                  HttpEndpointOptions options) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("http endpoint: port ", port, " out of range"));
  }
  if (registry == nullptr) return absl::InvalidArgumentError("http endpoint: no registry");
  auto impl = std::make_unique<Impl>();
  impl->ctx.registry = registry;
  impl->ctx.health = std::move(health);
  impl->ctx.options = options;

  beast::error_code ec;
  tcp::endpoint endpoint;
  const asio::ip::address ip = asio::ip::make_address(address, ec);
  if (!ec) {
    endpoint = tcp::endpoint(ip, static_cast<uint16_t>(port));
  } else {
    tcp::resolver resolver(impl->ioc);
    const tcp::resolver::results_type results = resolver.resolve(address, std::to_string(port), ec);
    if (ec || results.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("http endpoint: cannot resolve \"", address,
                                                     "\": ", ec ? ec.message() : "no address"));
    }
    endpoint = results.begin()->endpoint();
  }
  const std::string where = absl::StrCat(address, ":", port);
  auto fail = [&where](const char* step, const beast::error_code& e) {
    return absl::UnavailableError(
        absl::StrCat("http endpoint: cannot ", step, " ", where, ": ", e.message()));
  };
  if (impl->acceptor.open(endpoint.protocol(), ec); ec) return fail("open a socket for", ec);
  // Lets a restarted worker bind while its old connections sit in TIME_WAIT; on Linux it does not
  // let two listeners share the port.
  if (impl->acceptor.set_option(asio::socket_base::reuse_address(true), ec); ec) {
    return fail("set SO_REUSEADDR for", ec);
  }
  if (impl->acceptor.bind(endpoint, ec); ec) return fail("bind", ec);
  if (impl->acceptor.listen(asio::socket_base::max_listen_connections, ec); ec) {
    return fail("listen on", ec);
  }
  impl->port = impl->acceptor.local_endpoint().port();
  impl->Accept();
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->ioc.run(); });
  return std::unique_ptr<HttpEndpoint>(new HttpEndpoint(std::move(impl)));
}

HttpEndpoint::HttpEndpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpEndpoint::~HttpEndpoint() { Stop(); }

int HttpEndpoint::port() const { return impl_->port; }

void HttpEndpoint::Stop() {
  MutexLock lock(&impl_->stop_mu);
  if (impl_->stopped) return;
  impl_->stopped = true;
  Impl* impl = impl_.get();
  asio::post(impl->ioc, [impl] {
    impl->CloseAll();
    impl->ioc.stop();
  });
  if (impl->thread.joinable()) impl->thread.join();
}

}  // namespace tripod::metrics
