// The TCP KvLink; see tcp_kv_link.h. Plain POSIX sockets with poll() for every wait (Boost.Asio
// would bring an event loop this one blocking connection does not need).
#include "common/kv_transfer/tcp_kv_link.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/kv_transfer/kv_link_auth.h"
#include "common/util/mutex.h"
#include "spdlog/spdlog.h"

namespace tripod {
namespace {

absl::Status Errno(const char* what) {
  return absl::UnavailableError(absl::StrCat("TCP KV link: ", what, ": ", std::strerror(errno)));
}

// Waits for `events` on fd until the deadline.
absl::Status Await(int fd, short events, absl::Time deadline, const char* what) {
  while (true) {
    const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (ms <= 0) {
      return absl::DeadlineExceededError(absl::StrCat("TCP KV link: ", what, " timed out"));
    }
    pollfd p{fd, events, 0};
    const int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(ms, 1000)));
    if (r > 0) return absl::OkStatus();
    if (r < 0 && errno != EINTR) return Errno(what);
  }
}

absl::Status WriteAll(int fd, const uint8_t* p, size_t n, absl::Time deadline) {
  while (n > 0) {
    const ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      p += w;
      n -= static_cast<size_t>(w);
    } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (absl::Status st = Await(fd, POLLOUT, deadline, "send"); !st.ok()) return st;
    } else {
      return Errno("send");
    }
  }
  return absl::OkStatus();
}

absl::Status ReadAll(int fd, uint8_t* p, size_t n, absl::Time deadline) {
  while (n > 0) {
    const ssize_t r = recv(fd, p, n, MSG_DONTWAIT);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
    } else if (r == 0) {
      return absl::UnavailableError("TCP KV link: the other end closed the connection");
    } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      if (absl::Status st = Await(fd, POLLIN, deadline, "receive"); !st.ok()) return st;
    } else {
      return Errno("receive");
    }
  }
  return absl::OkStatus();
}

class TcpKvLink final : public KvLink {
 public:
  TcpKvLink(int fd, const KvMemory& memory, KvLinkSharedBuffer shared)
      : fd_(fd), memory_(memory), shared_(std::move(shared)) {}
  ~TcpKvLink() override {
    close(fd_);
    if (shared_.p != nullptr && shared_.release) shared_.release(shared_.p);
  }
  const char* kind() const override { return shared_.p != nullptr ? "ipc" : "tcp"; }

  absl::Status Send(const uint8_t* device, size_t bytes, absl::Duration timeout) override {
    MutexLock lock(&mu_);
    if (!broken_.ok()) return broken_;
    const absl::Time deadline = absl::Now() + timeout;
    if (shared_.p == nullptr) {
      host_.resize(bytes);
      memory_.to_host(host_.data(), device, bytes);
      return Check(WriteAll(fd_, host_.data(), bytes, deadline));
    }
    // Into the buffer piece by piece, each once the other end took the one before.
    for (size_t off = 0; off < bytes; off += shared_.bytes) {
      const uint64_t n = std::min(shared_.bytes, bytes - off);
      if (awaiting_ack_) {
        uint8_t ack = 0;
        if (absl::Status st = Check(ReadAll(fd_, &ack, 1, deadline)); !st.ok()) return st;
        awaiting_ack_ = false;
      }
      memory_.copy(shared_.p, device + off, n);
      const absl::Status st =
          Check(WriteAll(fd_, reinterpret_cast<const uint8_t*>(&n), sizeof(n), deadline));
      if (!st.ok()) return st;
      awaiting_ack_ = true;
    }
    return absl::OkStatus();
  }
  absl::Status Recv(uint8_t* device, size_t bytes, absl::Duration timeout) override {
    MutexLock lock(&mu_);
    if (!broken_.ok()) return broken_;
    const absl::Time deadline = absl::Now() + timeout;
    if (shared_.p == nullptr) {
      host_.resize(bytes);
      if (absl::Status st = Check(ReadAll(fd_, host_.data(), bytes, deadline)); !st.ok()) {
        return st;
      }
      memory_.from_host(device, host_.data(), bytes);
      return absl::OkStatus();
    }
    for (size_t off = 0; off < bytes; off += shared_.bytes) {
      const uint64_t want = std::min(shared_.bytes, bytes - off);
      uint64_t n = 0;
      if (absl::Status st =
              Check(ReadAll(fd_, reinterpret_cast<uint8_t*>(&n), sizeof(n), deadline));
          !st.ok()) {
        return st;
      }
      if (n != want) {
        return Check(absl::DataLossError(absl::StrCat(
            "IPC KV link: a piece of ", n, " bytes where ", want, " were due: out of step")));
      }
      memory_.copy(device + off, shared_.p, n);
      const uint8_t ack = 1;
      if (absl::Status st = Check(WriteAll(fd_, &ack, 1, deadline)); !st.ok()) return st;
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Check(absl::Status st) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!st.ok()) {
      broken_ = st;
      shutdown(fd_, SHUT_RDWR);  // the other end's waits end too
    }
    return st;
  }
  Mutex mu_;
  const int fd_;
  const KvMemory& memory_;
  const KvLinkSharedBuffer shared_;
  // The last piece sent is not known to be taken yet.
  bool awaiting_ack_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<uint8_t> host_ ABSL_GUARDED_BY(mu_);
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
};

void NoDelay(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

}  // namespace

absl::StatusOr<std::unique_ptr<TcpKvLinkListener>> TcpKvLinkListener::Listen(
    const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  if (const int e = getaddrinfo(host.empty() ? nullptr : host.c_str(), "0", &hints, &res); e != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("TCP KV link: cannot resolve ", host, ": ", gai_strerror(e)));
  }
  const int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    freeaddrinfo(res);
    return Errno("socket");
  }
  const bool ok = bind(fd, res->ai_addr, res->ai_addrlen) == 0 && listen(fd, 4) == 0;
  freeaddrinfo(res);
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (!ok || getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    absl::Status st = Errno("listen");
    close(fd);
    return st;
  }
  const int port = addr.ss_family == AF_INET6
                       ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                       : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  return std::unique_ptr<TcpKvLinkListener>(new TcpKvLinkListener(fd, port));
}

TcpKvLinkListener::~TcpKvLinkListener() { close(fd_); }

absl::StatusOr<std::unique_ptr<KvLink>> TcpKvLinkListener::Accept(uint64_t link_id,
                                                                  const std::string& key,
                                                                  const KvMemory& memory,
                                                                  absl::Duration timeout,
                                                                  KvLinkSharedBuffer shared) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    if (absl::Status st = Await(fd_, POLLIN, deadline, "accept"); !st.ok()) {
      if (shared.p != nullptr && shared.release) shared.release(shared.p);
      return st;
    }
    const int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0) {
      if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) continue;
      if (shared.p != nullptr && shared.release) shared.release(shared.p);
      return Errno("accept");
    }
    // A challenge the joiner answers with the key: a fresh one per connection, so that an answer
    // seen once opens nothing. A silent connection holds the port for a second at most.
    const absl::Time answer_by = std::min(deadline, absl::Now() + absl::Seconds(1));
    absl::StatusOr<std::string> nonce = KvLinkRandomBytes(kKvLinkNonceBytes);
    if (!nonce.ok()) {
      close(c);
      if (shared.p != nullptr && shared.release) shared.release(shared.p);
      return nonce.status();
    }
    uint64_t named = 0;
    std::string proof(kKvLinkMacBytes, '\0');
    if (WriteAll(c, reinterpret_cast<const uint8_t*>(nonce->data()), nonce->size(), answer_by)
            .ok() &&
        ReadAll(c, reinterpret_cast<uint8_t*>(&named), sizeof(named), answer_by).ok() &&
        ReadAll(c, reinterpret_cast<uint8_t*>(proof.data()), proof.size(), answer_by).ok() &&
        named == link_id && KvLinkMacEqual(proof, KvLinkJoinProof(key, link_id, *nonce))) {
      NoDelay(c);
      return std::unique_ptr<KvLink>(std::make_unique<TcpKvLink>(c, memory, std::move(shared)));
    }
    // Not this link's peer (another link's, or one without the key): wait for the right one.
    spdlog::warn("KV link {}: refused a connection that did not prove the link's key", link_id);
    close(c);
  }
}

absl::StatusOr<std::unique_ptr<KvLink>> ConnectTcpKvLink(const std::string& host, int port,
                                                         uint64_t link_id, const std::string& key,
                                                         const KvMemory& memory,
                                                         absl::Duration timeout,
                                                         KvLinkSharedBuffer shared) {
  // The buffer is released here on every failure, by the link after.
  auto release = [&shared] {
    if (shared.p != nullptr && shared.release) shared.release(shared.p);
  };
  const absl::Time deadline = absl::Now() + timeout;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (const int e = getaddrinfo(host.c_str(), service.c_str(), &hints, &res); e != 0) {
    release();
    return absl::UnavailableError(
        absl::StrCat("TCP KV link: cannot resolve ", host, ": ", gai_strerror(e)));
  }
  const int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    freeaddrinfo(res);
    release();
    return Errno("socket");
  }
  int r = connect(fd, res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  absl::Status st;
  if (r != 0 && errno == EINPROGRESS) {
    st = Await(fd, POLLOUT, deadline, "connect");
    int err = 0;
    socklen_t len = sizeof(err);
    if (st.ok() && (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0)) {
      errno = err;
      st = Errno("connect");
    }
  } else if (r != 0) {
    st = Errno("connect");
  }
  std::string nonce(kKvLinkNonceBytes, '\0');
  if (st.ok()) {
    st = ReadAll(fd, reinterpret_cast<uint8_t*>(nonce.data()), nonce.size(), deadline);
  }
  if (st.ok()) {
    std::string join(reinterpret_cast<const char*>(&link_id), sizeof(link_id));
    join += KvLinkJoinProof(key, link_id, nonce);
    st = WriteAll(fd, reinterpret_cast<const uint8_t*>(join.data()), join.size(), deadline);
  }
  if (!st.ok()) {
    close(fd);
    release();
    return st;
  }
  NoDelay(fd);
  return std::unique_ptr<KvLink>(std::make_unique<TcpKvLink>(fd, memory, std::move(shared)));
}

}  // namespace tripod
