// The asynchronous HTTP/1.1 server; see http_server.h.
//
// Shape: one io_context run by io_threads threads; each connection lives on its own strand, and
// everything that touches a connection's state runs there (exchanges post onto it). A connection
// waits for readability (async_wait, then non-blocking reads into a stack buffer) rather than
// keeping a read buffer per socket, so that thousands of idle streams cost no buffers; the same
// read loop parses requests (Beast's parser fed by hand), notices a client hanging up while its
// response is pending, and drains the socket when lingering before a close. Responses are
// formatted here as bytes and written from a queue, one gathered write at a time.
#include "common/http/http_server.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/beast/http/string_body.hpp>
#include <cstdint>
#include <ctime>
#include <deque>
#include <exception>
#include <limits>
#include <optional>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/util/mutex.h"
#include "spdlog/spdlog.h"

namespace tripod::http {
namespace {

namespace asio = boost::asio;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;
using Strand = asio::strand<asio::io_context::executor_type>;
// A connection's socket: its completion handlers run on the connection's strand.
using Socket = tcp::socket::rebind_executor<Strand>::other;

// Bytes read from a socket per non-blocking read (on the stack).
constexpr size_t kReadChunk = 16 * 1024;
// After an answer that ends a connection: how long, and how much, of what the client still sends
// is read and dropped before the socket is closed (see StartLinger).
constexpr std::chrono::milliseconds kLinger{2000};
constexpr size_t kMaxLingerBytes = 64 * 1024;
// At most this many queued pieces go into one gathered write.
constexpr size_t kMaxWriteBuffers = 64;

std::string OpenSslErrors() {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "unknown error" : out;
}

// The server's TLS context: the certificate chain and key, TLS 1.2 at least.
absl::StatusOr<SSL_CTX*> NewTlsContext(const HttpTlsFiles& files) {
  ERR_clear_error();
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  if (ctx == nullptr) return absl::InternalError("http server: SSL_CTX_new: " + OpenSslErrors());
  auto fail = [ctx](std::string what) {
    std::string detail = OpenSslErrors();
    SSL_CTX_free(ctx);
    return absl::InvalidArgumentError(absl::StrCat("http server: ", what, " (", detail, ")"));
  };
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  // Idle connections (thousands of open streams) give their read and write buffers back.
  SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
  if (SSL_CTX_use_certificate_chain_file(ctx, files.cert_file.c_str()) != 1) {
    return fail(absl::StrCat("cannot load the certificate chain ", files.cert_file));
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, files.key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
    if (ERR_GET_REASON(ERR_peek_last_error()) == X509_R_KEY_VALUES_MISMATCH) {
      return fail(absl::StrCat(files.key_file, " is not the private key of ", files.cert_file));
    }
    return fail(absl::StrCat("cannot load the private key ", files.key_file));
  }
  if (SSL_CTX_check_private_key(ctx) != 1) {
    return fail(absl::StrCat(files.key_file, " is not the private key of ", files.cert_file));
  }
  return ctx;
}

// What an exchange asks of its connection.
enum Delivery : int { kWhole, kWholeThenClose, kStreamHead, kPiece, kEnd, kCut };

bool IsToken(absl::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u <= 32 || u >= 127 || c == ':' || c == '(' || c == ')' || c == ',' || c == ';' ||
        c == '<' || c == '>' || c == '@' || c == '[' || c == ']' || c == '\\' || c == '"' ||
        c == '/' || c == '?' || c == '=' || c == '{' || c == '}') {
      return false;
    }
  }
  return true;
}

bool IsSafeValue(absl::string_view s) {
  return s.find_first_of(absl::string_view("\r\n\0", 3)) == absl::string_view::npos;
}

bool HasHeader(const std::vector<std::pair<std::string, std::string>>& headers,
               absl::string_view name) {
  return std::any_of(headers.begin(), headers.end(),
                     [name](const auto& h) { return absl::EqualsIgnoreCase(h.first, name); });
}

// Appends the handler's extra headers, except those the server owns and unsafe ones.
void AppendExtraHeaders(const std::vector<std::pair<std::string, std::string>>& headers,
                        std::string* out) {
  for (const auto& [name, value] : headers) {
    if (!IsToken(name) || !IsSafeValue(value)) continue;
    if (absl::EqualsIgnoreCase(name, "content-length") ||
        absl::EqualsIgnoreCase(name, "transfer-encoding") ||
        absl::EqualsIgnoreCase(name, "connection") || absl::EqualsIgnoreCase(name, "server")) {
      continue;
    }
    absl::StrAppend(out, name, ": ", value, "\r\n");
  }
}

std::string StatusLine(int status) {
  const auto reason = bhttp::obsolete_reason(bhttp::int_to_status(static_cast<unsigned>(status)));
  return absl::StrCat("HTTP/1.1 ", status, " ", absl::string_view(reason.data(), reason.size()),
                      "\r\nServer: tripod\r\n");
}

// A whole response's bytes. `head`: a HEAD request, answered without the body.
std::string FormatResponse(const HttpResponse& r, bool keep_alive, bool head) {
  const int status = r.status >= 200 && r.status <= 999 ? r.status : 500;
  // These carry no body (RFC 9110 6.4.1), so no Content-Length either.
  const bool no_body = status == 204 || status == 304;
  std::string out = StatusLine(status);
  out.reserve(out.size() + 256 + (no_body || head ? 0 : r.body.size()));
  if (!r.content_type.empty() && IsSafeValue(r.content_type)) {
    absl::StrAppend(&out, "Content-Type: ", r.content_type, "\r\n");
  }
  AppendExtraHeaders(r.headers, &out);
  if (!no_body) absl::StrAppend(&out, "Content-Length: ", r.body.size(), "\r\n");
  if (!keep_alive) out += "Connection: close\r\n";
  out += "\r\n";
  if (!no_body && !head) out += r.body;
  return out;
}

// The server's own errors, in the shape of the OpenAI API's (the API served behind it).
HttpResponse ErrorResponse(int status, absl::string_view message) {
  HttpResponse r;
  r.status = status;
  r.body = absl::StrCat(R"({"error":{"message":")", message, R"(","type":")",
                        status >= 500 ? "server_error" : "invalid_request_error",
                        R"(","param":null,"code":null}})");
  return r;
}

bool AsksToClose(const std::vector<std::pair<std::string, std::string>>& headers) {
  for (const auto& [name, value] : headers) {
    if (absl::EqualsIgnoreCase(name, "connection") &&
        absl::StrContains(absl::AsciiStrToLower(value), "close")) {
      return true;
    }
  }
  return false;
}

std::string PeerString(const tcp::endpoint& ep) {
  if (ep.address().is_v6()) return absl::StrCat("[", ep.address().to_string(), "]:", ep.port());
  return absl::StrCat(ep.address().to_string(), ":", ep.port());
}

}  // namespace

namespace internal {

// What the server's connections and exchanges share. Exchanges hold it (so that the io_context
// outlives any exchange a handler keeps after the server is gone); connections point at it.
struct ServerCore : std::enable_shared_from_this<ServerCore> {
  explicit ServerCore(int threads) : ioc(threads) {}
  ~ServerCore() {
    if (tls != nullptr) SSL_CTX_free(tls);
  }

  void Register(uint64_t id, std::weak_ptr<Connection> c, const std::string& client) {
    MutexLock lock(&mu);
    connections.emplace(id, std::move(c));
    if (options.max_connections_per_client > 0) {
      ++per_client[client];
      client_of.emplace(id, client);
    }
  }
  void Unregister(uint64_t id) {
    MutexLock lock(&mu);
    connections.erase(id);
    if (auto it = client_of.find(id); it != client_of.end()) {
      auto pc = per_client.find(it->second);
      if (pc != per_client.end() && --pc->second <= 0) per_client.erase(pc);
      client_of.erase(it);
    }
    if (connections.empty()) cv.SignalAll();
  }
  // How many connections `client` (an address) has open.
  int ClientConnections(const std::string& client) {
    MutexLock lock(&mu);
    auto it = per_client.find(client);
    return it == per_client.end() ? 0 : it->second;
  }

  Handler handler;
  HttpServerOptions options;
  SSL_CTX* tls = nullptr;  // HTTPS; connections hold references of their own
  std::atomic<bool> stopped{false};
  Mutex mu;
  CondVar cv;  // signalled when the last connection closes
  absl::flat_hash_map<uint64_t, std::weak_ptr<Connection>> connections ABSL_GUARDED_BY(mu);
  // With max_connections_per_client: open connections per client address, and each one's.
  absl::flat_hash_map<std::string, int> per_client ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<uint64_t, std::string> client_of ABSL_GUARDED_BY(mu);
  // Set once Stop() has joined the I/O threads and run what was left queued: after that, a
  // posted function would never run.
  bool drained ABSL_GUARDED_BY(mu) = false;
  // Declared last, so destroyed first: its destructor destroys queued handlers and with them the
  // connections they own, whose destructors may still reach the members above.
  asio::io_context ioc;
};

// One request's answer as the exchange and its connection share it.
struct ExchangeState {
  explicit ExchangeState(Strand s) : strand(std::move(s)) {}

  std::shared_ptr<ServerCore> core;
  std::weak_ptr<Connection> conn;
  const Strand strand;
  uint64_t seq = 0;  // the connection's request number: stale deliveries are dropped
  bool keep_alive = true;
  bool head = false;    // a HEAD request
  bool chunked = true;  // HTTP/1.1; HTTP/1.0 streams are delimited by closing instead
  size_t max_buffer = 0;

  std::atomic<bool> answered{false};   // Respond or StartStream called
  std::atomic<bool> streaming{false};  // StartStream called
  std::atomic<bool> ended{false};      // End called
  std::atomic<bool> closed{false};     // the client went away or the connection was cut
  std::atomic<size_t> queued{0};       // stream bytes sent and not yet written

  Mutex mu;
  std::function<void()> on_close ABSL_GUARDED_BY(mu);
  bool gone ABSL_GUARDED_BY(mu) = false;      // closed before completion; on_close consumed
  bool complete ABSL_GUARDED_BY(mu) = false;  // the response was written whole

  // On the connection's strand.
  void Gone() {
    closed.store(true);
    std::function<void()> fn;
    {
      MutexLock lock(&mu);
      gone = true;
      fn = std::move(on_close);
      on_close = nullptr;
    }
    if (fn) CallOnClose(fn);
  }
  void Complete() {
    std::function<void()> drop;  // it may own the exchange: released outside the lock
    {
      MutexLock lock(&mu);
      complete = true;
      drop = std::move(on_close);
      on_close = nullptr;
    }
  }
  static void CallOnClose(const std::function<void()>& fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      spdlog::warn("http: OnClose callback threw: {}", e.what());
    } catch (...) {
      spdlog::warn("http: OnClose callback threw");
    }
  }
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(ServerCore* core, Strand strand, Socket socket, uint64_t id, std::string peer)
      : core_(core),
        opt_(core->options),
        strand_(std::move(strand)),
        socket_(std::move(socket)),
        timer_(strand_),
        id_(id),
        peer_(std::move(peer)) {}

  // Set before Start(): the connection answers its first request with 429 and closes.
  void set_refused(bool refused) { refused_ = refused; }

  ~Connection() {
    // Only a connection that never closed (its handlers destroyed unrun) is still registered.
    if (phase_ != Phase::kClosed) core_->Unregister(id_);
    if (ssl_ != nullptr) SSL_free(ssl_);  // and its memory BIOs
  }

  const Strand& strand() const { return strand_; }

  // The rest runs on the strand.
  void Start() {
    if (phase_ == Phase::kClosed) return;
    error_code ec;
    socket_.non_blocking(true, ec);
    if (ec) {
      Close();
      return;
    }
    socket_.set_option(tcp::no_delay(true), ec);  // SSE pieces are small and latency-bound
    if (core_->tls != nullptr) {
      ssl_ = SSL_new(core_->tls);
      BIO* in = BIO_new(BIO_s_mem());
      BIO* out = BIO_new(BIO_s_mem());
      if (ssl_ == nullptr || in == nullptr || out == nullptr) {
        BIO_free(in);
        BIO_free(out);
        ERR_clear_error();
        Close();
        return;
      }
      SSL_set_bio(ssl_, in, out);  // the SSL owns them now
      SSL_set_accept_state(ssl_);
    }
    NewParser();
    SetDeadline(opt_.read_timeout);
    WaitReadable();
  }

  void Deliver(uint64_t seq, int kind, std::string bytes, size_t counted) {
    if (phase_ == Phase::kClosed || current_ == nullptr || current_->seq != seq) return;
    switch (kind) {
      case kWhole:
      case kWholeThenClose:
        if (phase_ != Phase::kHandling) return;
        if (kind == kWholeThenClose) keep_alive_ = false;
        phase_ = Phase::kResponding;
        finish_when_flushed_ = true;
        Enqueue(std::move(bytes), 0);
        return;
      case kStreamHead:
        if (phase_ != Phase::kHandling) return;
        phase_ = Phase::kStreaming;
        Enqueue(std::move(bytes), 0);
        return;
      case kPiece:
        if (phase_ != Phase::kStreaming || finish_when_flushed_) {
          current_->queued.fetch_sub(counted);
          return;
        }
        Enqueue(std::move(bytes), counted);
        return;
      case kEnd:
        if (phase_ != Phase::kStreaming || finish_when_flushed_) return;
        finish_when_flushed_ = true;
        if (!current_->chunked) keep_alive_ = false;  // the close delimits the body
        if (!bytes.empty()) {
          Enqueue(std::move(bytes), 0);
        } else if (!writing_) {
          Finish();
        }
        return;
      case kCut:
        Close();
        return;
    }
  }

  // Ends the connection now; an exchange in progress is closed (its OnClose fires).
  void Close() {
    if (phase_ == Phase::kClosed) return;
    phase_ = Phase::kClosed;
    error_code ec;
    socket_.close(ec);  // ends the pending wait and write (their handlers see the phase)
    ClearDeadline();
    out_.clear();
    inbuf_.clear();
    parser_.reset();
    if (std::shared_ptr<ExchangeState> st = std::move(current_)) st->Gone();
    core_->Unregister(id_);
  }

 private:
  enum class Phase {
    kReading,     // a request is arriving (read_timeout)
    kIdle,        // between requests (keepalive_timeout)
    kHandling,    // the handler has the request, no answer yet
    kResponding,  // a whole response is queued or being written (write_timeout)
    kStreaming,   // a stream is open (write_timeout while a write is pending)
    kLingering,   // answered and half-closed, dropping what the client still sends
    kClosed,
  };

  void NewParser() {
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(
        std::min<size_t>(opt_.max_header_bytes, std::numeric_limits<uint32_t>::max())));
    parser_->body_limit(static_cast<uint64_t>(opt_.max_body_bytes));
    parser_->eager(true);
    continue_sent_ = false;
  }

  void WaitReadable() {
    if (waiting_read_ || phase_ == Phase::kClosed) return;
    waiting_read_ = true;
    socket_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](const error_code& ec) {
      self->waiting_read_ = false;
      self->OnReadable(ec);
    });
  }

  void OnReadable(const error_code& ec) {
    if (phase_ == Phase::kClosed) return;
    if (ec) {
      Close();
      return;
    }
    char buf[kReadChunk];
    // A few reads at most, then back to the queue, so that one fast client cannot starve others.
    for (int i = 0; i < 4; ++i) {
      error_code rec;
      const size_t n = socket_.read_some(asio::buffer(buf), rec);
      if (rec == asio::error::would_block || rec == asio::error::try_again) break;
      if (rec) {  // end of stream or reset: the client is gone (a half-close counts too)
        Close();
        return;
      }
      if (ssl_ != nullptr && phase_ != Phase::kLingering) {
        if (!Decrypt(buf, n)) return;
      } else {
        OnBytes(buf, n);
      }
      if (phase_ == Phase::kClosed) return;
      if (n < sizeof(buf)) break;
    }
    WaitReadable();
  }

  // TLS: ciphertext in, plaintext to OnBytes, and whatever the handshake has to say queued for
  // the socket. False when the connection closed (a TLS error, the client's close_notify).
  bool Decrypt(const char* data, size_t n) {
    if (BIO_write(SSL_get_rbio(ssl_), data, static_cast<int>(n)) != static_cast<int>(n)) {
      ERR_clear_error();
      Close();
      return false;
    }
    char plain[kReadChunk];
    for (;;) {
      const int got = SSL_read(ssl_, plain, sizeof(plain));
      if (got > 0) {
        OnBytes(plain, static_cast<size_t>(got));
        if (phase_ == Phase::kClosed) return false;
        continue;
      }
      const int err = SSL_get_error(ssl_, got);
      if (err == SSL_ERROR_WANT_READ) break;
      // A failed handshake (a plaintext client, an unknown CA on its side) or the client's
      // close_notify: it is gone.
      ERR_clear_error();
      Close();
      return false;
    }
    QueueTlsOutput(0);
    return phase_ != Phase::kClosed;
  }

  // Moves what OpenSSL has written to its memory BIO onto the write queue.
  void QueueTlsOutput(size_t counted) {
    BIO* out = SSL_get_wbio(ssl_);
    const size_t pending = BIO_ctrl_pending(out);
    if (pending == 0) {
      if (counted > 0 && current_ != nullptr) current_->queued.fetch_sub(counted);
      return;
    }
    std::string bytes(pending, '\0');
    const int got = BIO_read(out, bytes.data(), static_cast<int>(pending));
    bytes.resize(got > 0 ? static_cast<size_t>(got) : 0);
    out_.push_back({std::move(bytes), counted});
    if (!writing_) WriteNext();
  }

  void OnBytes(const char* data, size_t n) {
    switch (phase_) {
      case Phase::kIdle:
        phase_ = Phase::kReading;
        SetDeadline(opt_.read_timeout);
        [[fallthrough]];
      case Phase::kReading:
        inbuf_.append(data, n);
        Parse();
        // The parser bounds the header; this bounds what a chunked body's framing may pile up.
        if (phase_ == Phase::kReading && inbuf_.size() > opt_.max_header_bytes + kReadChunk) {
          Reject(400, "malformed request");
        }
        return;
      case Phase::kHandling:
      case Phase::kResponding:
      case Phase::kStreaming:
        // Pipelined: kept for after the response, within a bound; beyond it the connection
        // closes after the response instead.
        if (!pipeline_overflow_ && inbuf_.size() + n <= opt_.max_header_bytes) {
          inbuf_.append(data, n);
        } else {
          pipeline_overflow_ = true;
          std::string().swap(inbuf_);
        }
        return;
      case Phase::kLingering:
        lingered_ += n;
        if (lingered_ > kMaxLingerBytes) Close();
        return;
      case Phase::kClosed:
        return;
    }
  }

  void Parse() {
    size_t off = 0;
    while (phase_ == Phase::kReading && off < inbuf_.size()) {
      error_code ec;
      const size_t used =
          parser_->put(asio::const_buffer(inbuf_.data() + off, inbuf_.size() - off), ec);
      off += used;
      if (ec && ec != bhttp::error::need_more) {
        if (ec == bhttp::error::header_limit) {
          Reject(431, "request header too large");
        } else if (ec == bhttp::error::body_limit) {
          Reject(413, "request body too large");
        } else {
          Reject(400, "malformed request");
        }
        return;
      }
      if (refused_ && parser_->is_header_done()) {
        // Over the client's connection limit: a clear answer (over TLS too) rather than a reset.
        Reject(429, absl::StrCat("too many connections from this client (at most ",
                                 opt_.max_connections_per_client, " at once)"));
        return;
      }
      if (parser_->is_done()) {
        inbuf_.erase(0, off);
        Dispatch();
        return;
      }
      if (parser_->is_header_done() && !continue_sent_) MaybeContinue();
      if (ec || used == 0) break;  // need more
    }
    inbuf_.erase(0, off);
  }

  // Expect: 100-continue (curl sends it with bodies over 1 KiB): the client waits for this before
  // sending the body. Sent once the header has passed the limits.
  void MaybeContinue() {
    continue_sent_ = true;
    const auto& req = parser_->get();
    if (req.version() < 11) return;
    const auto it = req.find(bhttp::field::expect);
    if (it == req.end()) return;
    const absl::string_view value(it->value().data(), it->value().size());
    if (!absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(value), "100-continue")) return;
    Enqueue("HTTP/1.1 100 Continue\r\n\r\n", 0);
  }

  // A request the server refuses itself: answer and close.
  void Reject(int status, absl::string_view message) {
    std::string().swap(inbuf_);
    parser_.reset();
    phase_ = Phase::kResponding;
    keep_alive_ = false;
    finish_when_flushed_ = true;
    Enqueue(FormatResponse(ErrorResponse(status, message), /*keep_alive=*/false, false), 0);
  }

  void Dispatch() {
    bhttp::request<bhttp::string_body> msg = parser_->release();
    HttpRequest req;
    req.method.assign(msg.method_string().data(), msg.method_string().size());
    req.target.assign(msg.target().data(), msg.target().size());
    req.path = req.target.substr(0, req.target.find('?'));
    req.version = static_cast<int>(msg.version());
    req.headers.reserve(static_cast<size_t>(std::distance(msg.begin(), msg.end())));
    for (const auto& field : msg) {
      req.headers.emplace_back(absl::AsciiStrToLower(absl::string_view(field.name_string().data(),
                                                                       field.name_string().size())),
                               std::string(field.value().data(), field.value().size()));
    }
    req.body = std::move(msg.body());
    req.peer = peer_;

    auto st = std::make_shared<ExchangeState>(strand_);
    st->core = core_->shared_from_this();
    st->conn = weak_from_this();
    st->seq = ++seq_;
    // HTTP/1.0 closes after the response even when it asks for keep-alive: simpler, and rare.
    st->keep_alive = msg.keep_alive() && msg.version() >= 11;
    st->head = msg.method() == bhttp::verb::head;
    st->chunked = msg.version() >= 11;
    st->max_buffer = opt_.max_stream_buffer_bytes;

    keep_alive_ = st->keep_alive;
    finish_when_flushed_ = false;
    phase_ = Phase::kHandling;
    ClearDeadline();
    current_ = st;
    std::shared_ptr<HttpExchange> exchange(new HttpExchange(std::move(req), std::move(st)));
    try {
      core_->handler(exchange);
    } catch (const std::exception& e) {
      spdlog::warn("http: handler for {} {} threw: {}", exchange->request().method,
                   exchange->request().path, e.what());
      exchange->Respond(ErrorResponse(500, "internal server error"));
    } catch (...) {
      spdlog::warn("http: handler for {} {} threw", exchange->request().method,
                   exchange->request().path);
      exchange->Respond(ErrorResponse(500, "internal server error"));
    }
  }

  void Enqueue(std::string bytes, size_t counted) {
    if (ssl_ != nullptr) {
      // Encrypted as it is queued: the records keep the pieces' order with the handshake's.
      if (!bytes.empty() && SSL_write(ssl_, bytes.data(), static_cast<int>(bytes.size())) <= 0) {
        ERR_clear_error();
        if (counted > 0 && current_ != nullptr) current_->queued.fetch_sub(counted);
        Close();
        return;
      }
      QueueTlsOutput(counted);
      return;
    }
    out_.push_back({std::move(bytes), counted});
    if (!writing_) WriteNext();
  }

  void WriteNext() {
    writing_ = true;
    inflight_.clear();
    inflight_counted_ = 0;
    while (!out_.empty() && inflight_.size() < kMaxWriteBuffers) {
      inflight_.push_back(std::move(out_.front().bytes));
      inflight_counted_ += out_.front().counted;
      out_.pop_front();
    }
    // Built after the vector stops growing: moving short strings moves their bytes.
    std::vector<asio::const_buffer> buffers;
    buffers.reserve(inflight_.size());
    for (const std::string& s : inflight_) buffers.emplace_back(s.data(), s.size());
    if (phase_ == Phase::kResponding || phase_ == Phase::kStreaming) {
      SetDeadline(opt_.write_timeout);
    }
    asio::async_write(socket_, buffers, [self = shared_from_this()](const error_code& ec, size_t) {
      self->OnWritten(ec);
    });
  }

  void OnWritten(const error_code& ec) {
    writing_ = false;
    if (current_ != nullptr && inflight_counted_ > 0) current_->queued.fetch_sub(inflight_counted_);
    inflight_.clear();
    inflight_counted_ = 0;
    if (phase_ == Phase::kClosed) return;
    if (ec) {
      Close();
      return;
    }
    if (!out_.empty()) {
      WriteNext();
      return;
    }
    if (finish_when_flushed_) {
      Finish();
    } else if (phase_ == Phase::kStreaming) {
      ClearDeadline();  // a stream may idle between pieces
    }
  }

  // The response is written whole: the next request, or a graceful close.
  void Finish() {
    finish_when_flushed_ = false;
    if (std::shared_ptr<ExchangeState> st = std::move(current_)) st->Complete();
    if (!keep_alive_ || pipeline_overflow_) {
      StartLinger();
      return;
    }
    NewParser();
    if (inbuf_.empty()) {
      phase_ = Phase::kIdle;
      SetDeadline(opt_.keepalive_timeout);
    } else {
      phase_ = Phase::kReading;
      SetDeadline(opt_.read_timeout);
      Parse();
    }
  }

  // Closing a socket with unread input resets the connection, and a reset can destroy the
  // answer before the client reads it; so half-close, and read and drop for a moment first.
  void StartLinger() {
    phase_ = Phase::kLingering;
    std::string().swap(inbuf_);
    parser_.reset();
    error_code ec;
    if (ssl_ != nullptr) {
      // TLS says the end first (close_notify): one short record, written as it stands.
      SSL_shutdown(ssl_);
      ERR_clear_error();
      BIO* out = SSL_get_wbio(ssl_);
      std::string bytes(BIO_ctrl_pending(out), '\0');
      const int got = BIO_read(out, bytes.data(), static_cast<int>(bytes.size()));
      if (got > 0) asio::write(socket_, asio::buffer(bytes.data(), static_cast<size_t>(got)), ec);
      ec.clear();
    }
    socket_.shutdown(tcp::socket::shutdown_send, ec);
    if (ec) {
      Close();
      return;
    }
    SetDeadline(std::min<std::chrono::milliseconds>(kLinger, opt_.read_timeout));
  }

  // One deadline at a time, for the phase at hand; when it passes the connection closes.
  void SetDeadline(std::chrono::milliseconds d) {
    const uint64_t gen = ++deadline_gen_;
    timer_.expires_after(d);
    timer_.async_wait([self = shared_from_this(), gen](const error_code& ec) {
      if (ec || gen != self->deadline_gen_) return;
      self->Close();
    });
  }
  void ClearDeadline() {
    ++deadline_gen_;
    timer_.cancel();
  }

  struct Out {
    std::string bytes;
    size_t counted;  // stream bytes counted against the buffer limit
  };

  ServerCore* const core_;
  const HttpServerOptions& opt_;
  const Strand strand_;
  Socket socket_;
  asio::steady_timer timer_;
  const uint64_t id_;
  const std::string peer_;

  Phase phase_ = Phase::kReading;
  bool waiting_read_ = false;
  std::string inbuf_;  // received, not yet parsed
  bool pipeline_overflow_ = false;
  bool refused_ = false;  // over the client's connection limit (set_refused)
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  bool continue_sent_ = false;
  size_t lingered_ = 0;
  uint64_t deadline_gen_ = 0;

  uint64_t seq_ = 0;
  std::shared_ptr<ExchangeState> current_;
  bool keep_alive_ = false;
  bool finish_when_flushed_ = false;  // the response is complete once out_ is written

  std::deque<Out> out_;
  std::vector<std::string> inflight_;
  size_t inflight_counted_ = 0;
  bool writing_ = false;
  SSL* ssl_ = nullptr;  // TLS: the session over two memory BIOs (see Decrypt, Enqueue)
};

}  // namespace internal

using internal::Connection;
using internal::ExchangeState;
using internal::ServerCore;

// ---- HttpExchange ----

HttpExchange::HttpExchange(HttpRequest request, std::shared_ptr<ExchangeState> state)
    : request_(std::move(request)),
      state_(std::move(state)),
      received_unix_s_(static_cast<int64_t>(std::time(nullptr))) {}

HttpExchange::~HttpExchange() {
  if (state_->closed.load()) return;
  if (!state_->answered.load()) {
    Respond(ErrorResponse(500, "the request was not answered"));
  } else if (state_->streaming.load() && !state_->ended.load()) {
    End();
  }
}

void HttpExchange::Post(int kind, std::string bytes, size_t counted) {
  std::shared_ptr<Connection> conn = state_->conn.lock();
  if (conn == nullptr) return;  // closed and gone
  asio::post(state_->strand,
             [conn = std::move(conn), seq = state_->seq, kind, bytes = std::move(bytes),
              counted]() mutable { conn->Deliver(seq, kind, std::move(bytes), counted); });
}

void HttpExchange::Respond(HttpResponse response) {
  if (state_->answered.exchange(true)) return;
  const bool keep_alive = state_->keep_alive && !AsksToClose(response.headers);
  Post(keep_alive ? kWhole : kWholeThenClose, FormatResponse(response, keep_alive, state_->head),
       0);
}

void HttpExchange::StartStream(std::vector<std::pair<std::string, std::string>> headers) {
  if (state_->answered.exchange(true)) return;
  std::string out = StatusLine(200);
  if (!HasHeader(headers, "content-type")) out += "Content-Type: text/event-stream\r\n";
  if (!HasHeader(headers, "cache-control")) out += "Cache-Control: no-cache\r\n";
  AppendExtraHeaders(headers, &out);
  if (state_->chunked) out += "Transfer-Encoding: chunked\r\n";
  if (!state_->keep_alive || !state_->chunked) out += "Connection: close\r\n";
  out += "\r\n";
  Post(kStreamHead, std::move(out), 0);
  // After the post: whoever sees streaming (acquire) posts its pieces behind the head.
  state_->streaming.store(true, std::memory_order_release);
}

bool HttpExchange::Send(std::string piece) {
  ExchangeState& s = *state_;
  if (!s.streaming.load(std::memory_order_acquire) || s.ended.load() || s.closed.load()) {
    return false;
  }
  if (piece.empty()) return true;  // an empty chunk would end a chunked body
  std::string wire =
      s.chunked ? absl::StrCat(absl::Hex(piece.size()), "\r\n", piece, "\r\n") : std::move(piece);
  const size_t n = wire.size();
  if (s.queued.fetch_add(n) + n > s.max_buffer) {
    // The client is not reading: cut rather than buffer without bound.
    s.queued.fetch_sub(n);
    s.closed.store(true);
    Post(kCut, {}, 0);
    return false;
  }
  if (s.conn.expired()) return false;
  Post(kPiece, std::move(wire), n);
  return true;
}

void HttpExchange::End() {
  if (!state_->streaming.load(std::memory_order_acquire) || state_->ended.exchange(true)) return;
  Post(kEnd, state_->chunked ? "0\r\n\r\n" : "", 0);
}

void HttpExchange::OnClose(std::function<void()> fn) {
  ExchangeState& s = *state_;
  {
    MutexLock lock(&s.mu);
    if (s.complete) return;
    if (!s.gone) {
      s.on_close = std::move(fn);
      return;
    }
  }
  // Already closed: call it now, on an I/O thread if they still run.
  ServerCore& core = *s.core;
  {
    MutexLock lock(&core.mu);
    if (!core.drained) {
      asio::post(core.ioc, [fn = std::move(fn)] { ExchangeState::CallOnClose(fn); });
      return;
    }
  }
  ExchangeState::CallOnClose(fn);
}

bool HttpExchange::closed() const { return state_->closed.load(); }

// ---- HttpServer ----

struct HttpServer::Impl {
  explicit Impl(int threads)
      : core(std::make_shared<ServerCore>(threads)),
        accept_strand(asio::make_strand(core->ioc)),
        acceptor(accept_strand),
        retry(accept_strand) {}

  void Accept() {
    Strand strand = asio::make_strand(core->ioc);
    acceptor.async_accept(strand, [this, strand](const error_code& ec, Socket socket) {
      if (!acceptor.is_open()) return;  // Stop()
      if (ec) {
        // Out of descriptors, say: retry a little later rather than spin.
        retry.expires_after(std::chrono::milliseconds(100));
        retry.async_wait([this](const error_code& wait_ec) {
          if (!wait_ec && acceptor.is_open()) Accept();
        });
        return;
      }
      OnAccepted(strand, std::move(socket));
      Accept();
    });
  }

  void OnAccepted(const Strand& strand, Socket socket) {
    error_code ec;
    const tcp::endpoint peer = socket.remote_endpoint(ec);
    bool full;
    {
      MutexLock lock(&core->mu);
      full = static_cast<int64_t>(core->connections.size()) >= core->options.max_connections;
    }
    const std::string client = ec ? std::string() : peer.address().to_string();
    // A client at its limit gets a 429 on its next connections; one that keeps opening them
    // regardless (twice the limit) is closed at once, so that it cannot fill the server's own.
    const int limit = core->options.max_connections_per_client;
    const int open = limit > 0 && !ec ? core->ClientConnections(client) : 0;
    if (ec || full || (limit > 0 && open >= 2 * limit)) {
      socket.close(ec);
      return;
    }
    auto conn = std::make_shared<Connection>(core.get(), strand, std::move(socket), ++next_id,
                                             PeerString(peer));
    conn->set_refused(limit > 0 && open >= limit);
    core->Register(next_id, conn, client);
    asio::post(strand, [conn] { conn->Start(); });
  }

  std::shared_ptr<ServerCore> core;
  Strand accept_strand;
  tcp::acceptor acceptor;
  asio::steady_timer retry;
  uint64_t next_id = 0;  // on accept_strand
  std::vector<std::thread> threads;
  Mutex stop_mu;
  bool stopped ABSL_GUARDED_BY(stop_mu) = false;
};

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& address, int port,
                                                              Handler handler,
                                                              HttpServerOptions options) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("http server: port ", port, " out of range"));
  }
  if (!handler) return absl::InvalidArgumentError("http server: no handler");
  options.io_threads = std::max(1, options.io_threads);
  auto impl = std::make_unique<Impl>(options.io_threads);
  impl->core->handler = std::move(handler);
  impl->core->options = options;
  if (options.tls.has_value()) {
    absl::StatusOr<SSL_CTX*> ctx = NewTlsContext(*options.tls);
    if (!ctx.ok()) return ctx.status();
    impl->core->tls = *ctx;
  }

  error_code ec;
  tcp::endpoint endpoint;
  const asio::ip::address ip = asio::ip::make_address(address, ec);
  if (!ec) {
    endpoint = tcp::endpoint(ip, static_cast<uint16_t>(port));
  } else {
    tcp::resolver resolver(impl->core->ioc);
    const tcp::resolver::results_type results = resolver.resolve(address, std::to_string(port), ec);
    if (ec || results.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("http server: cannot resolve \"", address,
                                                     "\": ", ec ? ec.message() : "no address"));
    }
    endpoint = results.begin()->endpoint();
  }
  const std::string where = absl::StrCat(address, ":", port);
  auto fail = [&where](const char* step, const error_code& e) {
    return absl::UnavailableError(
        absl::StrCat("http server: cannot ", step, " ", where, ": ", e.message()));
  };
  tcp::acceptor& acceptor = impl->acceptor;
  if (acceptor.open(endpoint.protocol(), ec); ec) return fail("open a socket for", ec);
  // Lets a restarted process bind while its old connections sit in TIME_WAIT; on Linux it does
  // not let two listeners share the port.
  if (acceptor.set_option(asio::socket_base::reuse_address(true), ec); ec) {
    return fail("set SO_REUSEADDR for", ec);
  }
  if (acceptor.bind(endpoint, ec); ec) return fail("bind", ec);
  if (acceptor.listen(asio::socket_base::max_listen_connections, ec); ec) {
    return fail("listen on", ec);
  }
  const int bound_port = acceptor.local_endpoint().port();
  Impl* raw = impl.get();
  asio::post(impl->accept_strand, [raw] { raw->Accept(); });
  for (int i = 0; i < options.io_threads; ++i) {
    impl->threads.emplace_back([core = impl->core.get()] { core->ioc.run(); });
  }
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl), bound_port));
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl, int port)
    : impl_(std::move(impl)), port_(port) {}

HttpServer::~HttpServer() { Stop(); }

int HttpServer::open_connections() const {
  MutexLock lock(&impl_->core->mu);
  return static_cast<int>(impl_->core->connections.size());
}

void HttpServer::Stop() {
  Impl& impl = *impl_;
  MutexLock stop_lock(&impl.stop_mu);
  if (impl.stopped) return;
  impl.stopped = true;
  ServerCore& core = *impl.core;
  core.stopped.store(true);

  // The listener first, on its strand: after that nothing registers.
  Notification listener_closed;
  asio::post(impl.accept_strand, [&impl, &listener_closed] {
    error_code ec;
    impl.acceptor.close(ec);
    impl.retry.cancel();
    listener_closed.Notify();
  });
  listener_closed.WaitForNotification();

  std::vector<std::shared_ptr<Connection>> open;
  {
    MutexLock lock(&core.mu);
    for (const auto& [id, weak] : core.connections) {
      if (std::shared_ptr<Connection> c = weak.lock()) open.push_back(std::move(c));
    }
  }
  for (std::shared_ptr<Connection>& c : open) {
    asio::post(c->strand(), [c] { c->Close(); });
  }
  open.clear();
  {
    // Each Close fires its exchange's OnClose, then unregisters.
    MutexLock lock(&core.mu);
    while (!core.connections.empty()) core.cv.Wait(&core.mu);
  }
  core.ioc.stop();
  for (std::thread& t : impl.threads) t.join();
  impl.threads.clear();
  {
    MutexLock lock(&core.mu);
    core.drained = true;
  }
  // What is still queued (completions of the closed sockets' operations, late posts from
  // exchanges) runs here, as no-ops on closed connections, so that nothing queued keeps a
  // connection or an exchange alive.
  core.ioc.restart();
  core.ioc.poll();
}

}  // namespace tripod::http
