// Tests for common/metrics/http_endpoint over real loopback sockets: /health and /metrics, 404
// and 405, keep-alive and pipelining, oversized and malformed requests, the idle timeout, the
// connection limit, and Stop() with connections open. Every wait is bounded (socket timeouts and
// deadlines), so a broken server fails a test rather than hanging it.
#include "common/metrics/http_endpoint.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/common/http/loopback_socket.h"

namespace tripod::metrics {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

struct Response {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lowercased
  std::string body;
};

// A blocking client whose every receive and send gives up after 5 s.
class Client {
 public:
  explicit Client(int port) {
    fd_ = tripod::testing::ConnectLoopback(port);
    connected_ = fd_ >= 0;
  }
  ~Client() {
    if (fd_ >= 0) close(fd_);
  }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  bool connected() const { return connected_; }

  bool Send(std::string_view data) {
    while (!data.empty()) {
      const ssize_t n = send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      data.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  // One response (headers, then Content-Length bytes of body); nullopt on close, timeout or a
  // response that does not parse. Bytes after it stay for the next call (pipelining).
  std::optional<Response> Read() {
    size_t end;
    while ((end = buf_.find("\r\n\r\n")) == std::string::npos) {
      if (!Fill()) return std::nullopt;
    }
    Response r;
    const std::string head = buf_.substr(0, end);
    size_t line_end = head.find("\r\n");
    const std::string status_line = head.substr(0, line_end);
    if (status_line.rfind("HTTP/1.", 0) != 0 || status_line.size() < 12) return std::nullopt;
    r.status = std::stoi(status_line.substr(9, 3));
    while (line_end != std::string::npos) {
      const size_t start = line_end + 2;
      line_end = head.find("\r\n", start);
      const std::string line =
          head.substr(start, line_end == std::string::npos ? std::string::npos : line_end - start);
      const size_t colon = line.find(':');
      if (colon == std::string::npos) return std::nullopt;
      std::string name = line.substr(0, colon);
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      const size_t value_start = line.find_first_not_of(' ', colon + 1);
      r.headers[name] = value_start == std::string::npos ? "" : line.substr(value_start);
    }
    const size_t length =
        r.headers.count("content-length") ? std::stoul(r.headers["content-length"]) : 0;
    buf_.erase(0, end + 4);
    while (buf_.size() < length) {
      if (!Fill()) return std::nullopt;
    }
    r.body = buf_.substr(0, length);
    buf_.erase(0, length);
    return r;
  }

  // True when the server closes the connection (end of stream or reset) within 5 s; anything it
  // still sends is dropped.
  bool WaitClosed() {
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    char tmp[4096];
    while (Clock::now() < deadline) {
      const ssize_t n = recv(fd_, tmp, sizeof(tmp), 0);
      if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
      if (n < 0 && errno != EINTR) return false;  // timed out
    }
    return false;
  }

 private:
  bool Fill() {
    char tmp[4096];
    const ssize_t n = recv(fd_, tmp, sizeof(tmp), 0);
    if (n <= 0) return false;
    buf_.append(tmp, static_cast<size_t>(n));
    return true;
  }

  int fd_ = -1;
  bool connected_ = false;
  std::string buf_;
};

std::string Get(const std::string& path, const std::string& extra_headers = "") {
  return "GET " + path + " HTTP/1.1\r\nHost: localhost\r\n" + extra_headers + "\r\n";
}

class HttpEndpointTest : public ::testing::Test {
 protected:
  void StartEndpoint(HttpEndpointOptions options = HttpEndpointOptions()) {
    requests_ =
        &registry_.AddCounter("tripod_requests_total", "Requests \"served\".", {{"path", "a\\b"}});
    requests_->Inc(3);
    auto endpoint = HttpEndpoint::Start(
        "127.0.0.1", 0, &registry_,
        [this] {
          ++health_calls_;
          return HealthReport{ready_.load(),
                              ready_.load() ? R"({"status":"ok"})" : R"({"status":"loading"})"};
        },
        options);
    ASSERT_TRUE(endpoint.ok()) << endpoint.status();
    endpoint_ = std::move(*endpoint);
    ASSERT_GT(endpoint_->port(), 0);
  }

  Registry registry_;
  Counter* requests_ = nullptr;
  std::atomic<bool> ready_{true};
  std::atomic<int> health_calls_{0};
  std::unique_ptr<HttpEndpoint> endpoint_;
};

TEST_F(HttpEndpointTest, HealthReadyIs200) {
  StartEndpoint();
  Client c(endpoint_->port());
  ASSERT_TRUE(c.connected());
  ASSERT_TRUE(c.Send(Get("/health")));
  std::optional<Response> r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->headers["content-type"], "application/json");
  EXPECT_EQ(r->body, R"({"status":"ok"})");
  EXPECT_EQ(health_calls_.load(), 1);
}

TEST_F(HttpEndpointTest, HealthNotReadyIs503) {
  StartEndpoint();
  ready_ = false;
  Client c(endpoint_->port());
  ASSERT_TRUE(c.Send(Get("/health")));
  std::optional<Response> r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(r->body, R"({"status":"loading"})");
}

TEST_F(HttpEndpointTest, MetricsServesTheExpositionAsItChanges) {
  StartEndpoint();
  Client c(endpoint_->port());
  ASSERT_TRUE(c.Send(Get("/metrics")));
  std::optional<Response> r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->headers["content-type"], "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(r->body, registry_.Exposition());
  EXPECT_THAT(r->body, HasSubstr("tripod_requests_total{path=\"a\\\\b\"} 3\n"));

  // The same connection (keep-alive), a query string, and the new value.
  requests_->Inc();
  ASSERT_TRUE(c.Send(Get("/metrics?format=text")));
  r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  EXPECT_THAT(r->body, HasSubstr("tripod_requests_total{path=\"a\\\\b\"} 4\n"));
}

TEST_F(HttpEndpointTest, UnknownPathIs404AndTheConnectionStaysUsable) {
  StartEndpoint();
  Client c(endpoint_->port());
  for (const char* path : {"/", "/metricsx", "/health/x"}) {
    ASSERT_TRUE(c.Send(Get(path)));
    std::optional<Response> r = c.Read();
    ASSERT_TRUE(r.has_value()) << path;
    EXPECT_EQ(r->status, 404) << path;
  }
  ASSERT_TRUE(c.Send(Get("/health")));
  std::optional<Response> r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
}

TEST_F(HttpEndpointTest, OtherMethodsAre405WithAllow) {
  StartEndpoint();
  Client c(endpoint_->port());
  ASSERT_TRUE(c.Send("POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"));
  std::optional<Response> r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(r->headers["allow"], "GET");
  ASSERT_TRUE(c.Send("DELETE /health HTTP/1.1\r\nHost: x\r\n\r\n"));
  r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(health_calls_.load(), 0);  // a refused method never reaches the health function
}

TEST_F(HttpEndpointTest, PipelinedRequestsAreAnsweredInOrder) {
  StartEndpoint();
  Client c(endpoint_->port());
  ASSERT_TRUE(c.Send(Get("/health") + Get("/nope") + Get("/metrics")));
  std::optional<Response> a = c.Read(), b = c.Read(), m = c.Read();
  ASSERT_TRUE(a.has_value() && b.has_value() && m.has_value());
  EXPECT_EQ(a->status, 200);
  EXPECT_EQ(b->status, 404);
  EXPECT_EQ(m->status, 200);
  EXPECT_EQ(m->body, registry_.Exposition());
}

TEST_F(HttpEndpointTest, ConnectionCloseAndHttp10CloseAfterTheAnswer) {
  StartEndpoint();
  {
    Client c(endpoint_->port());
    ASSERT_TRUE(c.Send(Get("/health", "Connection: close\r\n")));
    std::optional<Response> r = c.Read();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->headers["connection"], "close");
    EXPECT_TRUE(c.WaitClosed());
  }
  {
    Client c(endpoint_->port());
    ASSERT_TRUE(c.Send("GET /metrics HTTP/1.0\r\n\r\n"));
    std::optional<Response> r = c.Read();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->status, 200);
    EXPECT_TRUE(c.WaitClosed());
  }
}

TEST_F(HttpEndpointTest, OversizedHeaderIs431AndCloses) {
  StartEndpoint();
  Client c(endpoint_->port());
  ASSERT_TRUE(c.Send(Get("/metrics", "X-Big: " + std::string(16 * 1024, 'a') + "\r\n")));
  std::optional<Response> r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 431);
  EXPECT_TRUE(c.WaitClosed());
}

TEST_F(HttpEndpointTest, OversizedBodyIs413AndCloses) {
  StartEndpoint();
  Client c(endpoint_->port());
  ASSERT_TRUE(c.Send("POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n"));
  std::optional<Response> r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 413);
  EXPECT_TRUE(c.WaitClosed());
}

TEST_F(HttpEndpointTest, MalformedRequestIs400AndCloses) {
  StartEndpoint();
  Client c(endpoint_->port());
  ASSERT_TRUE(c.Send("GET /metrics HTTP/9\r\n\r\n"));
  std::optional<Response> r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 400);
  EXPECT_TRUE(c.WaitClosed());
}

TEST_F(HttpEndpointTest, IdleAndTricklingConnectionsTimeOut) {
  StartEndpoint({.idle_timeout = std::chrono::milliseconds(300)});
  Client idle(endpoint_->port());
  ASSERT_TRUE(idle.connected());
  // A slow client: a header line every 100 ms keeps sending, yet the request's deadline holds.
  Client slow(endpoint_->port());
  ASSERT_TRUE(slow.Send("GET /metrics HTTP/1.1\r\n"));
  const auto start = Clock::now();
  bool refused = false;
  for (int i = 0; i < 30 && !refused; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    refused = !slow.Send("X-Slow: 1\r\n");
  }
  EXPECT_TRUE(refused || slow.WaitClosed());
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
  EXPECT_TRUE(idle.WaitClosed());
  // The endpoint still serves.
  Client c(endpoint_->port());
  ASSERT_TRUE(c.Send(Get("/health")));
  std::optional<Response> r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
}

TEST_F(HttpEndpointTest, ConnectionsBeyondTheLimitAreClosed) {
  StartEndpoint({.max_connections = 2});
  Client a(endpoint_->port()), b(endpoint_->port());
  // Answered requests prove that both are accepted before the third comes.
  for (Client* c : {&a, &b}) {
    ASSERT_TRUE(c->Send(Get("/health")));
    ASSERT_TRUE(c->Read().has_value());
  }
  Client third(endpoint_->port());
  EXPECT_TRUE(third.WaitClosed());
  ASSERT_TRUE(a.Send(Get("/health")));
  EXPECT_TRUE(a.Read().has_value());
}

TEST_F(HttpEndpointTest, ConcurrentScrapes) {
  StartEndpoint();
  constexpr int kThreads = 4, kRequests = 25;
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      Client c(endpoint_->port());
      for (int i = 0; i < kRequests; ++i) {
        if (!c.Send(Get(i % 2 ? "/metrics" : "/health"))) return;
        std::optional<Response> r = c.Read();
        if (!r.has_value() || r->status != 200) return;
        ++ok;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(ok.load(), kThreads * kRequests);
}

TEST_F(HttpEndpointTest, StopWithConnectionsOpenIsPromptAndIdempotent) {
  StartEndpoint();  // the default 30 s idle timeout: Stop() must not wait for it
  Client idle(endpoint_->port());
  Client partial(endpoint_->port());
  ASSERT_TRUE(idle.connected());
  ASSERT_TRUE(partial.Send("GET /metrics HTTP/1.1\r\nHost: x\r\n"));
  Client served(endpoint_->port());
  ASSERT_TRUE(served.Send(Get("/health")));
  ASSERT_TRUE(served.Read().has_value());  // the endpoint is up and has accepted them

  const auto start = Clock::now();
  endpoint_->Stop();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(2));
  EXPECT_TRUE(idle.WaitClosed());
  EXPECT_TRUE(partial.WaitClosed());
  EXPECT_TRUE(served.WaitClosed());
  endpoint_->Stop();  // again: nothing happens
  // Nothing listens any more.
  Client late(endpoint_->port());
  EXPECT_FALSE(late.connected());
  endpoint_.reset();  // the destructor's Stop() after an explicit one
}

TEST(HttpEndpointStartTest, ErrorsAreStatuses) {
  Registry registry;
  EXPECT_FALSE(HttpEndpoint::Start("127.0.0.1", 70000, &registry, nullptr).ok());
  EXPECT_FALSE(HttpEndpoint::Start("127.0.0.1", -1, &registry, nullptr).ok());
  EXPECT_FALSE(HttpEndpoint::Start("127.0.0.1", 0, nullptr, nullptr).ok());
  auto first = HttpEndpoint::Start("127.0.0.1", 0, &registry, nullptr);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = HttpEndpoint::Start("127.0.0.1", (*first)->port(), &registry, nullptr);
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(second.status().message(), HasSubstr("bind"));
}

TEST(HttpEndpointStartTest, NoHealthFunctionMeansReady) {
  Registry registry;
  auto endpoint = HttpEndpoint::Start("127.0.0.1", 0, &registry, nullptr);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  Client c((*endpoint)->port());
  ASSERT_TRUE(c.Send(Get("/health")));
  std::optional<Response> r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "{}");
}

}  // namespace
}  // namespace tripod::metrics
