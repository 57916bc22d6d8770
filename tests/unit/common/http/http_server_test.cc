// Tests for common/http/http_server over real loopback sockets: whole responses and keep-alive,
// pipelining with late answers, server-sent-event streams fed from other threads, clients that
// hang up or stop reading, the request limits (431, 413, 400), Expect: 100-continue, timeouts,
// handlers that throw or drop the exchange, Stop() with streams open, and many streams on one I/O
// thread. Every wait is bounded (socket timeouts, deadlines), so a broken server fails a test
// rather than hanging it.
#include "common/http/http_server.h"

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

#include "absl/time/time.h"
#include "common/util/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/common/http/loopback_socket.h"

namespace tripod::http {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr absl::Duration kWait = absl::Seconds(10);

struct Response {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
};

// A blocking client whose every receive and send gives up after 5 s.
class Client {
 public:
  explicit Client(int port, int rcvbuf = 0) {
    fd_ = tripod::testing::ConnectLoopback(port, 5, rcvbuf);
    connected_ = fd_ >= 0;
  }
  ~Client() { Close(); }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  bool connected() const { return connected_; }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

  bool Send(std::string_view data) {
    while (!data.empty()) {
      const ssize_t n = send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      data.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  // The status line and headers of a response; nullopt on close, timeout or garbage.
  std::optional<Response> ReadHead() {
    size_t end;
    while ((end = buf_.find("\r\n\r\n")) == std::string::npos) {
      if (!Fill()) return std::nullopt;
    }
    Response r;
    const std::string head = buf_.substr(0, end);
    buf_.erase(0, end + 4);
    size_t line_end = head.find("\r\n");
    const std::string status_line = head.substr(0, line_end);
    if (status_line.rfind("HTTP/1.1 ", 0) != 0 || status_line.size() < 12) return std::nullopt;
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
    return r;
  }

  // One chunk of a chunked body: its data, "" for the last chunk, nullopt on close or garbage.
  std::optional<std::string> ReadChunk() {
    size_t eol;
    while ((eol = buf_.find("\r\n")) == std::string::npos) {
      if (!Fill()) return std::nullopt;
    }
    size_t size = 0;
    try {
      size = std::stoul(buf_.substr(0, eol), nullptr, 16);
    } catch (...) {
      return std::nullopt;
    }
    while (buf_.size() < eol + 2 + size + 2) {
      if (!Fill()) return std::nullopt;
    }
    if (buf_.compare(eol + 2 + size, 2, "\r\n") != 0) return std::nullopt;
    std::string data = buf_.substr(eol + 2, size);
    buf_.erase(0, eol + 2 + size + 2);
    return data;
  }

  // A whole response: Content-Length or chunked. Bytes after it stay for the next call.
  std::optional<Response> Read() {
    std::optional<Response> r = ReadHead();
    if (!r.has_value()) return std::nullopt;
    if (r->headers["transfer-encoding"] == "chunked") {
      for (;;) {
        std::optional<std::string> chunk = ReadChunk();
        if (!chunk.has_value()) return std::nullopt;
        if (chunk->empty()) return r;
        r->body += *chunk;
      }
    }
    const size_t length =
        r->headers.count("content-length") ? std::stoul(r->headers["content-length"]) : 0;
    while (buf_.size() < length) {
      if (!Fill()) return std::nullopt;
    }
    r->body = buf_.substr(0, length);
    buf_.erase(0, length);
    return r;
  }

  // Exactly n more bytes (the 100 Continue line, say).
  std::optional<std::string> ReadBytes(size_t n) {
    while (buf_.size() < n) {
      if (!Fill()) return std::nullopt;
    }
    std::string out = buf_.substr(0, n);
    buf_.erase(0, n);
    return out;
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

std::string Post(const std::string& path, const std::string& body) {
  return "POST " + path + " HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n" +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

// A count that threads raise and a test waits on, with a deadline.
class Counter {
 public:
  void Add(int n = 1) {
    MutexLock lock(&mu_);
    value_ += n;
    cv_.SignalAll();
  }
  int value() {
    MutexLock lock(&mu_);
    return value_;
  }
  // True once the count is at least n; false if that takes longer than `timeout`.
  bool WaitAtLeast(int n, absl::Duration timeout = kWait) {
    const absl::Time deadline = absl::Now() + timeout;
    MutexLock lock(&mu_);
    while (value_ < n) {
      if (cv_.WaitWithDeadline(&mu_, deadline) && value_ < n) return false;
    }
    return true;
  }

 private:
  Mutex mu_;
  CondVar cv_;
  int value_ = 0;
};

// Exchanges a handler kept, for the test to answer from its own thread.
class ExchangeBox {
 public:
  void Put(std::shared_ptr<HttpExchange> e) {
    {
      MutexLock lock(&mu_);
      exchanges_.push_back(std::move(e));
    }
    count_.Add();
  }
  bool WaitFor(int n) { return count_.WaitAtLeast(n); }
  std::shared_ptr<HttpExchange> at(size_t i) {
    MutexLock lock(&mu_);
    return exchanges_.at(i);
  }
  std::vector<std::shared_ptr<HttpExchange>> TakeAll() {
    MutexLock lock(&mu_);
    return std::move(exchanges_);
  }

 private:
  Mutex mu_;
  std::vector<std::shared_ptr<HttpExchange>> exchanges_;
  Counter count_;
};

std::unique_ptr<HttpServer> StartServer(Handler handler, HttpServerOptions options = {}) {
  absl::StatusOr<std::unique_ptr<HttpServer>> server =
      HttpServer::Start("127.0.0.1", 0, std::move(handler), options);
  EXPECT_TRUE(server.ok()) << server.status();
  if (!server.ok()) return nullptr;
  EXPECT_GT((*server)->port(), 0);
  return std::move(*server);
}

// Answers every request with its method, path and body.
void Echo(const std::shared_ptr<HttpExchange>& e) {
  HttpResponse r;
  r.content_type = "text/plain";
  r.body = e->request().method + " " + e->request().path + " " + e->request().body;
  e->Respond(std::move(r));
}

TEST(HttpServerTest, WholeResponseCarriesTheRequestAndHeaders) {
  Mutex mu;
  HttpRequest seen;
  std::unique_ptr<HttpServer> server = StartServer([&](std::shared_ptr<HttpExchange> e) {
    {
      MutexLock lock(&mu);
      seen = e->request();
    }
    HttpResponse r;
    r.status = 201;
    r.body = R"({"ok":true})";
    r.headers = {{"Retry-After", "3"}, {"X-Bad", "a\r\nInjected: 1"}, {"Content-Length", "99"}};
    e->Respond(std::move(r));
  });
  ASSERT_NE(server, nullptr);
  Client c(server->port());
  ASSERT_TRUE(
      c.Send("POST /v1/completions?stream=false HTTP/1.1\r\nHost: x\r\n"
             "X-Request-ID: AbC\r\nContent-Length: 7\r\n\r\n{\"a\":1}"));
  std::optional<Response> r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 201);
  EXPECT_EQ(r->body, R"({"ok":true})");
  EXPECT_EQ(r->headers["content-length"], "11");
  EXPECT_EQ(r->headers["content-type"], "application/json");
  EXPECT_EQ(r->headers["server"], "tripod");
  EXPECT_EQ(r->headers["retry-after"], "3");
  EXPECT_EQ(r->headers.count("x-bad"), 0u);
  EXPECT_EQ(r->headers.count("injected"), 0u);
  EXPECT_EQ(r->headers.count("connection"), 0u);  // kept alive

  MutexLock lock(&mu);
  EXPECT_EQ(seen.method, "POST");
  EXPECT_EQ(seen.target, "/v1/completions?stream=false");
  EXPECT_EQ(seen.path, "/v1/completions");
  EXPECT_EQ(seen.body, "{\"a\":1}");
  EXPECT_EQ(seen.version, 11);
  ASSERT_NE(seen.Header("x-request-id"), nullptr);
  EXPECT_EQ(*seen.Header("x-request-id"), "AbC");
  EXPECT_EQ(seen.Header("X-Request-ID"), nullptr);  // names are lower-cased
  EXPECT_EQ(seen.Header("absent"), nullptr);
  EXPECT_THAT(seen.peer, ::testing::StartsWith("127.0.0.1:"));
}

TEST(HttpServerTest, KeepAliveReusesOneConnection) {
  Mutex mu;
  std::vector<std::string> peers;
  std::unique_ptr<HttpServer> server = StartServer([&](std::shared_ptr<HttpExchange> e) {
    {
      MutexLock lock(&mu);
      peers.push_back(e->request().peer);
    }
    Echo(e);
  });
  ASSERT_NE(server, nullptr);
  Client c(server->port());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(c.Send(Post("/a", "body" + std::to_string(i))));
    std::optional<Response> r = c.Read();
    ASSERT_TRUE(r.has_value()) << i;
    EXPECT_EQ(r->body, "POST /a body" + std::to_string(i));
  }
  EXPECT_EQ(server->open_connections(), 1);
  MutexLock lock(&mu);
  ASSERT_EQ(peers.size(), 3u);
  EXPECT_EQ(peers[0], peers[1]);
  EXPECT_EQ(peers[1], peers[2]);
}

TEST(HttpServerTest, ConnectionCloseAndHttp10CloseAfterTheAnswer) {
  std::unique_ptr<HttpServer> server = StartServer(Echo);
  ASSERT_NE(server, nullptr);
  {
    Client c(server->port());
    ASSERT_TRUE(c.Send(Get("/x", "Connection: close\r\n")));
    std::optional<Response> r = c.Read();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->headers["connection"], "close");
    EXPECT_TRUE(c.WaitClosed());
  }
  {
    Client c(server->port());
    ASSERT_TRUE(c.Send("GET /y HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
    std::optional<Response> r = c.Read();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->body, "GET /y ");
    EXPECT_TRUE(c.WaitClosed());
  }
  {
    // A handler can ask for the close itself.
    std::unique_ptr<HttpServer> closing = StartServer([](std::shared_ptr<HttpExchange> e) {
      HttpResponse r;
      r.headers = {{"Connection", "close"}};
      e->Respond(std::move(r));
    });
    ASSERT_NE(closing, nullptr);
    Client c(closing->port());
    ASSERT_TRUE(c.Send(Get("/z")));
    std::optional<Response> r = c.Read();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->headers["connection"], "close");
    EXPECT_TRUE(c.WaitClosed());
  }
}

TEST(HttpServerTest, PipelinedRequestsAnsweredLaterComeBackInOrder) {
  ExchangeBox box;
  std::unique_ptr<HttpServer> server =
      StartServer([&](std::shared_ptr<HttpExchange> e) { box.Put(std::move(e)); });
  ASSERT_NE(server, nullptr);
  Client c(server->port());
  ASSERT_TRUE(c.Send(Get("/one") + Post("/two", "2") + Get("/three")));
  for (int i = 0; i < 3; ++i) {
    // The next request reaches the handler only once the one before is answered.
    ASSERT_TRUE(box.WaitFor(i + 1)) << i;
    std::shared_ptr<HttpExchange> e = box.at(static_cast<size_t>(i));
    std::thread answer([e] { Echo(e); });
    answer.join();
    std::optional<Response> r = c.Read();
    ASSERT_TRUE(r.has_value()) << i;
    EXPECT_EQ(r->body, std::vector<std::string>({"GET /one ", "POST /two 2", "GET /three "})[i]);
  }
}

TEST(HttpServerTest, StreamFedFromAnotherThreadThenKeepAlive) {
  ExchangeBox box;
  std::unique_ptr<HttpServer> server = StartServer([&](std::shared_ptr<HttpExchange> e) {
    if (e->request().path == "/plain") {
      Echo(e);
      return;
    }
    e->StartStream({{"X-Request-ID", "r1"}});
    box.Put(std::move(e));
  });
  ASSERT_NE(server, nullptr);
  Client c(server->port());
  ASSERT_TRUE(c.Send(Post("/v1/completions", R"({"stream":true})")));
  ASSERT_TRUE(box.WaitFor(1));
  std::shared_ptr<HttpExchange> e = box.at(0);
  std::atomic<int> accepted{0};
  std::thread producer([&] {
    for (int i = 0; i < 5; ++i) accepted += e->Send("data: {\"i\":" + std::to_string(i) + "}\n\n");
    EXPECT_TRUE(e->Send(""));  // empty: nothing sent, not the end
    e->End();
    EXPECT_FALSE(e->Send("data: late\n\n"));
  });
  std::optional<Response> head = c.ReadHead();
  ASSERT_TRUE(head.has_value());
  EXPECT_EQ(head->status, 200);
  EXPECT_EQ(head->headers["content-type"], "text/event-stream");
  EXPECT_EQ(head->headers["cache-control"], "no-cache");
  EXPECT_EQ(head->headers["transfer-encoding"], "chunked");
  EXPECT_EQ(head->headers["x-request-id"], "r1");
  EXPECT_EQ(head->headers.count("content-length"), 0u);
  std::string events;
  for (;;) {
    std::optional<std::string> chunk = c.ReadChunk();
    ASSERT_TRUE(chunk.has_value());
    if (chunk->empty()) break;
    events += *chunk;
  }
  producer.join();
  EXPECT_EQ(accepted.load(), 5);
  EXPECT_EQ(events,
            "data: {\"i\":0}\n\ndata: {\"i\":1}\n\ndata: {\"i\":2}\n\ndata: {\"i\":3}\n\n"
            "data: {\"i\":4}\n\n");
  EXPECT_FALSE(e->closed());
  // The connection serves the next request.
  ASSERT_TRUE(c.Send(Get("/plain")));
  std::optional<Response> r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->body, "GET /plain ");
}

TEST(HttpServerTest, ClientClosingMidStreamFiresOnCloseAndSendFails) {
  ExchangeBox box;
  Counter closes;
  std::unique_ptr<HttpServer> server = StartServer([&](std::shared_ptr<HttpExchange> e) {
    e->OnClose([&closes] { closes.Add(); });
    e->StartStream();
    box.Put(std::move(e));
  });
  ASSERT_NE(server, nullptr);
  auto c = std::make_unique<Client>(server->port());
  ASSERT_TRUE(c->Send(Get("/stream")));
  ASSERT_TRUE(box.WaitFor(1));
  std::shared_ptr<HttpExchange> e = box.at(0);
  ASSERT_TRUE(e->Send("data: 1\n\n"));
  ASSERT_TRUE(c->ReadHead().has_value());
  std::optional<std::string> chunk = c->ReadChunk();
  ASSERT_TRUE(chunk.has_value());
  EXPECT_EQ(*chunk, "data: 1\n\n");
  EXPECT_FALSE(e->closed());
  EXPECT_EQ(closes.value(), 0);

  c.reset();  // the client hangs up
  ASSERT_TRUE(closes.WaitAtLeast(1));
  EXPECT_TRUE(e->closed());
  EXPECT_FALSE(e->Send("data: 2\n\n"));
  e->End();  // harmless
  // A callback set after the close is called at once (on an I/O thread).
  Counter late;
  e->OnClose([&late] { late.Add(); });
  EXPECT_TRUE(late.WaitAtLeast(1));
  EXPECT_EQ(closes.value(), 1);  // once
  e.reset();
  box.TakeAll();
  // The connection is gone from the count.
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (server->open_connections() != 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(5));  // polled: nothing to wait on
  }
  EXPECT_EQ(server->open_connections(), 0);
}

TEST(HttpServerTest, ClientClosingWhileTheAnswerIsPendingFiresOnClose) {
  ExchangeBox box;
  Counter closes;
  std::unique_ptr<HttpServer> server = StartServer([&](std::shared_ptr<HttpExchange> e) {
    e->OnClose([&closes] { closes.Add(); });
    box.Put(std::move(e));
  });
  ASSERT_NE(server, nullptr);
  {
    Client c(server->port());
    ASSERT_TRUE(c.Send(Post("/v1/chat/completions", "{}")));
    ASSERT_TRUE(box.WaitFor(1));
  }
  ASSERT_TRUE(closes.WaitAtLeast(1));
  std::shared_ptr<HttpExchange> e = box.at(0);
  EXPECT_TRUE(e->closed());
  e->Respond(HttpResponse());  // too late: dropped without harm
}

TEST(HttpServerTest, ClientThatNeverReadsIsCutAtTheBufferLimit) {
  constexpr size_t kLimit = 256 * 1024;
  ExchangeBox box;
  Counter closes;
  HttpServerOptions options;
  options.max_stream_buffer_bytes = kLimit;
  std::unique_ptr<HttpServer> server = StartServer(
      [&](std::shared_ptr<HttpExchange> e) {
        e->OnClose([&closes] { closes.Add(); });
        e->StartStream();
        box.Put(std::move(e));
      },
      options);
  ASSERT_NE(server, nullptr);
  Client c(server->port(), /*rcvbuf=*/4096);
  ASSERT_TRUE(c.Send(Get("/stream")));
  ASSERT_TRUE(box.WaitFor(1));
  std::shared_ptr<HttpExchange> e = box.at(0);
  // The kernel's socket buffers take some megabytes; beyond them the queue must hit the limit.
  const std::string piece = "data: " + std::string(4090, 'x') + "\n\n";
  constexpr size_t kMaxBytes = 64 << 20;
  size_t accepted = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (accepted < kMaxBytes && Clock::now() < deadline && e->Send(piece)) {
    accepted += piece.size();
  }
  EXPECT_LT(accepted, kMaxBytes / 4) << "Send never refused";
  EXPECT_GE(accepted, kLimit / 2);
  EXPECT_TRUE(e->closed());
  ASSERT_TRUE(closes.WaitAtLeast(1));
  EXPECT_FALSE(e->Send(piece));
  EXPECT_TRUE(c.WaitClosed());
}

TEST(HttpServerTest, OversizedHeaderIs431AndCloses) {
  HttpServerOptions options;
  options.max_header_bytes = 4096;
  Counter calls;
  std::unique_ptr<HttpServer> server = StartServer(
      [&](std::shared_ptr<HttpExchange> e) {
        calls.Add();
        Echo(e);
      },
      options);
  ASSERT_NE(server, nullptr);
  Client c(server->port());
  ASSERT_TRUE(c.Send(Get("/x", "X-Big: " + std::string(8192, 'a') + "\r\n")));
  std::optional<Response> r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 431);
  EXPECT_EQ(r->headers["content-type"], "application/json");
  EXPECT_THAT(r->body, HasSubstr(R"("type":"invalid_request_error")"));
  EXPECT_EQ(r->headers["connection"], "close");
  EXPECT_TRUE(c.WaitClosed());
  EXPECT_EQ(calls.value(), 0);
}

TEST(HttpServerTest, OversizedBodyIs413AndCloses) {
  HttpServerOptions options;
  options.max_body_bytes = 1000;
  Counter calls;
  std::unique_ptr<HttpServer> server = StartServer(
      [&](std::shared_ptr<HttpExchange> e) {
        calls.Add();
        Echo(e);
      },
      options);
  ASSERT_NE(server, nullptr);
  {
    // Declared: refused from the header, before any body (and no allocation of its size).
    Client c(server->port());
    ASSERT_TRUE(c.Send("POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999\r\n\r\n"));
    std::optional<Response> r = c.Read();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->status, 413);
    EXPECT_THAT(r->body, HasSubstr(R"({"error":{"message":)"));
    EXPECT_TRUE(c.WaitClosed());
  }
  {
    // Chunked: refused once the chunks pass the limit.
    Client c(server->port());
    std::string req = "POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
    for (int i = 0; i < 3; ++i) req += "1f4\r\n" + std::string(500, 'b') + "\r\n";
    ASSERT_TRUE(c.Send(req));
    std::optional<Response> r = c.Read();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->status, 413);
    EXPECT_TRUE(c.WaitClosed());
  }
  {
    // Within the limit, chunked is fine.
    Client c(server->port());
    ASSERT_TRUE(
        c.Send("POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
               "3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"));
    std::optional<Response> r = c.Read();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body, "POST /x abcde");
  }
  EXPECT_EQ(calls.value(), 1);
}

TEST(HttpServerTest, MalformedRequestsAre400AndClose) {
  Counter calls;
  std::unique_ptr<HttpServer> server = StartServer([&](std::shared_ptr<HttpExchange> e) {
    calls.Add();
    Echo(e);
  });
  ASSERT_NE(server, nullptr);
  for (const char* bad : {"GET /x HTTP/9\r\n\r\n", "NOT A REQUEST\r\n\r\n",
                          "POST /x HTTP/1.1\r\nContent-Length: abc\r\n\r\n",
                          "GET /x HTTP/1.1\r\nBad Header\r\n\r\n"}) {
    Client c(server->port());
    ASSERT_TRUE(c.Send(bad));
    std::optional<Response> r = c.Read();
    ASSERT_TRUE(r.has_value()) << bad;
    EXPECT_EQ(r->status, 400) << bad;
    EXPECT_TRUE(c.WaitClosed()) << bad;
  }
  EXPECT_EQ(calls.value(), 0);
}

TEST(HttpServerTest, ExpectContinueGetsA100BeforeTheBody) {
  std::unique_ptr<HttpServer> server = StartServer(Echo);
  ASSERT_NE(server, nullptr);
  Client c(server->port());
  const std::string body(2000, 'z');
  ASSERT_TRUE(c.Send("POST /up HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: " +
                     std::to_string(body.size()) + "\r\n\r\n"));
  const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
  std::optional<std::string> interim = c.ReadBytes(kContinue.size());
  ASSERT_TRUE(interim.has_value());
  EXPECT_EQ(*interim, kContinue);
  ASSERT_TRUE(c.Send(body));
  std::optional<Response> r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "POST /up " + body);
}

TEST(HttpServerTest, SlowAndIdleClientsAreClosed) {
  HttpServerOptions options;
  options.read_timeout = milliseconds(300);
  options.keepalive_timeout = milliseconds(300);
  Counter calls;
  std::unique_ptr<HttpServer> server = StartServer(
      [&](std::shared_ptr<HttpExchange> e) {
        calls.Add();
        Echo(e);
      },
      options);
  ASSERT_NE(server, nullptr);
  // A client that trickles a header line every 100 ms: the request's deadline holds anyway.
  Client slow(server->port());
  ASSERT_TRUE(slow.Send("GET /x HTTP/1.1\r\n"));
  const auto start = Clock::now();
  bool refused = false;
  for (int i = 0; i < 30 && !refused; ++i) {
    std::this_thread::sleep_for(milliseconds(100));  // the client's pace, not synchronisation
    refused = !slow.Send("X-Slow: 1\r\n");
  }
  EXPECT_TRUE(refused || slow.WaitClosed());
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
  // A keep-alive connection left idle after an answer.
  Client idle(server->port());
  ASSERT_TRUE(idle.Send(Get("/y")));
  ASSERT_TRUE(idle.Read().has_value());
  EXPECT_TRUE(idle.WaitClosed());
  EXPECT_EQ(calls.value(), 1);
}

TEST(HttpServerTest, HandlerThatThrowsGives500) {
  std::unique_ptr<HttpServer> server = StartServer([](std::shared_ptr<HttpExchange> e) {
    if (e->request().path == "/throw") throw std::runtime_error("boom");
    Echo(e);
  });
  ASSERT_NE(server, nullptr);
  Client c(server->port());
  ASSERT_TRUE(c.Send(Get("/throw")));
  std::optional<Response> r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 500);
  EXPECT_THAT(r->body, HasSubstr(R"("type":"server_error")"));
  // The server and even the connection live on.
  ASSERT_TRUE(c.Send(Get("/ok")));
  r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
}

TEST(HttpServerTest, DroppedExchangeGives500OrEndsItsStream) {
  ExchangeBox box;
  std::unique_ptr<HttpServer> server = StartServer([&](std::shared_ptr<HttpExchange> e) {
    if (e->request().path == "/drop") return;  // never answered
    e->StartStream();
    box.Put(std::move(e));
  });
  ASSERT_NE(server, nullptr);
  Client c(server->port());
  ASSERT_TRUE(c.Send(Get("/drop")));
  std::optional<Response> r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 500);

  ASSERT_TRUE(c.Send(Get("/stream")));
  ASSERT_TRUE(box.WaitFor(1));
  std::vector<std::shared_ptr<HttpExchange>> kept = box.TakeAll();
  ASSERT_TRUE(kept[0]->Send("data: x\n\n"));
  kept.clear();  // dropped mid-stream: the stream ends
  r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "data: x\n\n");
}

TEST(HttpServerTest, StopWithOpenStreamsFiresOnCloseAndReturns) {
  constexpr int kStreams = 3;
  ExchangeBox box;
  Counter closes;
  HttpServerOptions options;
  options.io_threads = 2;
  std::unique_ptr<HttpServer> server = StartServer(
      [&](std::shared_ptr<HttpExchange> e) {
        e->OnClose([&closes] { closes.Add(); });
        e->StartStream();
        box.Put(std::move(e));
      },
      options);
  ASSERT_NE(server, nullptr);
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < kStreams; ++i) {
    clients.push_back(std::make_unique<Client>(server->port()));
    ASSERT_TRUE(clients.back()->Send(Get("/s")));
  }
  ASSERT_TRUE(box.WaitFor(kStreams));
  Client idle(server->port());  // and one that never sent anything
  ASSERT_TRUE(idle.connected());
  for (auto& c : clients) ASSERT_TRUE(c->ReadHead().has_value());

  const auto start = Clock::now();
  server->Stop();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
  EXPECT_EQ(closes.value(), kStreams);  // before Stop() returned
  for (auto& c : clients) EXPECT_TRUE(c->WaitClosed());
  EXPECT_TRUE(idle.WaitClosed());
  std::vector<std::shared_ptr<HttpExchange>> kept = box.TakeAll();
  for (auto& e : kept) {
    EXPECT_TRUE(e->closed());
    EXPECT_FALSE(e->Send("data: after\n\n"));
  }
  server->Stop();  // idempotent
  EXPECT_EQ(server->open_connections(), 0);
  Client late(server->port());
  EXPECT_FALSE(late.connected());
  // Exchanges may outlive the server.
  server.reset();
  Counter after;
  kept[0]->OnClose([&after] { after.Add(); });  // closed: called on this thread now
  EXPECT_EQ(after.value(), 1);
  EXPECT_FALSE(kept[1]->Send("x"));
  kept[2]->End();
  kept.clear();
}

TEST(HttpServerTest, ConnectionsBeyondTheLimitAreClosed) {
  HttpServerOptions options;
  options.max_connections = 2;
  std::unique_ptr<HttpServer> server = StartServer(Echo, options);
  ASSERT_NE(server, nullptr);
  Client a(server->port()), b(server->port());
  for (Client* c : {&a, &b}) {
    ASSERT_TRUE(c->Send(Get("/x")));
    ASSERT_TRUE(c->Read().has_value());
  }
  EXPECT_EQ(server->open_connections(), 2);
  Client third(server->port());
  EXPECT_TRUE(third.WaitClosed());
  ASSERT_TRUE(a.Send(Get("/x")));
  EXPECT_TRUE(a.Read().has_value());
}

TEST(HttpServerTest, ConnectionsBeyondTheClientLimitGet429ThenAreClosed) {
  HttpServerOptions options;
  options.max_connections_per_client = 2;
  std::unique_ptr<HttpServer> server = StartServer(Echo, options);
  ASSERT_NE(server, nullptr);
  auto wait_open = [&](int n) {
    const absl::Time deadline = absl::Now() + kWait;
    while (server->open_connections() != n && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    return server->open_connections() == n;
  };
  Client a(server->port()), b(server->port());
  for (Client* c : {&a, &b}) {
    ASSERT_TRUE(c->Send(Get("/x")));
    std::optional<Response> r = c->Read();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->status, 200);
  }
  {
    // The third: answered 429 with the reason, then closed.
    Client third(server->port());
    ASSERT_TRUE(third.Send(Get("/x")));
    std::optional<Response> r = third.Read();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->status, 429);
    EXPECT_NE(r->body.find("too many connections from this client"), std::string::npos) << r->body;
    EXPECT_TRUE(third.WaitClosed());
  }
  ASSERT_TRUE(wait_open(2));
  // Two that send nothing hold refused places; at twice the limit the next is closed at once.
  Client idle1(server->port()), idle2(server->port());
  ASSERT_TRUE(wait_open(4));
  Client fifth(server->port());
  EXPECT_TRUE(fifth.WaitClosed());
  // The first two still work; once the others are gone a new connection is served again.
  ASSERT_TRUE(a.Send(Get("/x")));
  EXPECT_EQ(a.Read()->status, 200);
  idle1.Close();
  idle2.Close();
  b.Close();
  ASSERT_TRUE(wait_open(1));
  Client again(server->port());
  ASSERT_TRUE(again.Send(Get("/x")));
  std::optional<Response> r = again.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
}

TEST(HttpServerTest, ManyConcurrentStreamsOnOneIoThread) {
  constexpr int kStreams = 500;
  ExchangeBox box;
  Counter closes;
  std::unique_ptr<HttpServer> server = StartServer([&](std::shared_ptr<HttpExchange> e) {
    e->OnClose([&closes] { closes.Add(); });
    e->StartStream();
    box.Put(std::move(e));
  });
  ASSERT_NE(server, nullptr);
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < kStreams; ++i) {
    clients.push_back(std::make_unique<Client>(server->port()));
    ASSERT_TRUE(clients.back()->connected()) << i;
    ASSERT_TRUE(clients.back()->Send(Get("/s/" + std::to_string(i))));
  }
  ASSERT_TRUE(box.WaitFor(kStreams));
  EXPECT_EQ(server->open_connections(), kStreams);
  std::vector<std::shared_ptr<HttpExchange>> exchanges = box.TakeAll();
  // Two producer threads feed all the streams at once.
  std::atomic<int> refused{0};
  std::vector<std::thread> producers;
  for (int t = 0; t < 2; ++t) {
    producers.emplace_back([&, t] {
      for (int i = t; i < kStreams; i += 2) {
        const std::shared_ptr<HttpExchange>& e = exchanges[static_cast<size_t>(i)];
        const std::string path = e->request().path;
        for (int k = 0; k < 3; ++k) {
          if (!e->Send("data: " + path + " " + std::to_string(k) + "\n\n")) ++refused;
        }
        e->End();
      }
    });
  }
  for (std::thread& p : producers) p.join();
  EXPECT_EQ(refused.load(), 0);
  int complete = 0;
  for (int i = 0; i < kStreams; ++i) {
    std::optional<Response> r = clients[static_cast<size_t>(i)]->Read();
    ASSERT_TRUE(r.has_value()) << i;
    const std::string p = "/s/" + std::to_string(i);
    if (r->body == "data: " + p + " 0\n\ndata: " + p + " 1\n\ndata: " + p + " 2\n\n") ++complete;
  }
  EXPECT_EQ(complete, kStreams);
  EXPECT_EQ(closes.value(), 0);  // every stream completed: no OnClose
  exchanges.clear();
}

TEST(HttpServerStartTest, ErrorsAreStatuses) {
  auto echo = [](std::shared_ptr<HttpExchange> e) { Echo(e); };
  EXPECT_FALSE(HttpServer::Start("127.0.0.1", 70000, echo).ok());
  EXPECT_FALSE(HttpServer::Start("127.0.0.1", -1, echo).ok());
  EXPECT_FALSE(HttpServer::Start("127.0.0.1", 0, nullptr).ok());
  auto first = HttpServer::Start("127.0.0.1", 0, echo);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = HttpServer::Start("127.0.0.1", (*first)->port(), echo);
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(second.status().message(), HasSubstr("bind"));
}

}  // namespace
}  // namespace tripod::http
