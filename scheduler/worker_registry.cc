#include "scheduler/worker_registry.h"

#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/rpc/protocol.h"
#include "common/rpc/worker_server.h"
#include "spdlog/spdlog.h"

namespace tripod::scheduler {

Worker::Worker(std::string address, v1::Role role, std::string tls_name)
    : address_(std::move(address)),
      role_(role),
      tls_name_(std::move(tls_name)),
      channel_(NewWorkerChannel(address_, tls_name_)) {
  if (role_ == v1::ROLE_PREFILL) prefill_ = v1::Prefill::NewStub(channel_);
  if (role_ == v1::ROLE_DECODE) decode_ = v1::Decode::NewStub(channel_);
  if (role_ == v1::ROLE_DRAFT) draft_ = v1::Draft::NewStub(channel_);
}

v1::HealthResponse Worker::last_health() const {
  MutexLock l(&mu_);
  return health_;
}

std::string Worker::last_error() const {
  MutexLock l(&mu_);
  return error_;
}

bool Worker::RecordCheck(bool ok, const v1::HealthResponse& health, const std::string& error,
                         int unhealthy_after) {
  MutexLock l(&mu_);
  bool healthy = healthy_.load(std::memory_order_relaxed);
  if (ok) {
    health_ = health;
    error_.clear();
    misses_ = 0;
    healthy = true;
  } else {
    error_ = error;
    // A worker never seen well stays out; one seen well leaves after several misses in a row, so
    // one slow answer does not drop it.
    if (++misses_ >= unhealthy_after) healthy = false;
  }
  const bool changed = healthy != healthy_.load(std::memory_order_relaxed);
  healthy_.store(healthy, std::memory_order_release);
  return changed;
}

void Worker::MarkFailed(const std::string& error) {
  MutexLock l(&mu_);
  error_ = error;
  healthy_.store(false, std::memory_order_release);
}

std::vector<std::string> ResolveAll(const std::string& name_port, std::string* error) {
  std::vector<std::string> out;
  absl::StatusOr<HostPort> hp = ParseHostPort("dns", name_port);
  if (!hp.ok()) {
    *error = std::string(hp.status().message());
    return out;
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(hp->host.c_str(), nullptr, &hints, &res);
  if (rc != 0) {
    *error = absl::StrCat("cannot resolve ", hp->host, ": ", gai_strerror(rc));
    return out;
  }
  std::set<std::string> seen;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    char host[NI_MAXHOST];
    if (getnameinfo(a->ai_addr, a->ai_addrlen, host, sizeof(host), nullptr, 0, NI_NUMERICHOST) !=
        0) {
      continue;
    }
    const bool v6 = a->ai_family == AF_INET6;
    seen.insert(v6 ? absl::StrCat("[", host, "]:", hp->port) : absl::StrCat(host, ":", hp->port));
  }
  freeaddrinfo(res);
  out.assign(seen.begin(), seen.end());
  return out;
}

WorkerRegistry::WorkerRegistry(WorkerRegistryOptions options) : options_(std::move(options)) {
  MutexLock l(&mu_);
  const std::string& name = options_.tls_server_name;
  for (const std::string& a : options_.prefill) {
    workers_.push_back(std::make_shared<Worker>(a, v1::ROLE_PREFILL, name));
  }
  for (const std::string& a : options_.decode) {
    workers_.push_back(std::make_shared<Worker>(a, v1::ROLE_DECODE, name));
  }
  for (const std::string& a : options_.draft) {
    workers_.push_back(std::make_shared<Worker>(a, v1::ROLE_DRAFT, name));
  }
}

WorkerRegistry::~WorkerRegistry() { Stop(); }

void WorkerRegistry::Start() {
  CheckNow();
  thread_ = std::thread([this] { Loop(); });
}

void WorkerRegistry::Stop() {
  {
    MutexLock l(&stop_mu_);
    stopping_ = true;
    stop_cv_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
}

void WorkerRegistry::Loop() {
  MutexLock l(&stop_mu_);
  while (!stopping_) {
    stop_cv_.WaitWithTimeout(&stop_mu_, absl::FromChrono(options_.interval));
    if (stopping_) break;
    stop_mu_.Unlock();
    CheckNow();
    stop_mu_.Lock();
  }
}

std::vector<std::shared_ptr<Worker>> WorkerRegistry::Healthy(v1::Role role) const {
  std::vector<std::shared_ptr<Worker>> out;
  MutexLock l(&mu_);
  for (const auto& w : workers_) {
    if (w->role() == role && w->healthy()) out.push_back(w);
  }
  return out;
}

std::vector<std::shared_ptr<Worker>> WorkerRegistry::All() const {
  MutexLock l(&mu_);
  return workers_;
}

void WorkerRegistry::Resolve() {
  struct Source {
    const std::vector<std::string>* names;
    v1::Role role;
  };
  for (const Source& src : {Source{&options_.prefill_dns, v1::ROLE_PREFILL},
                            Source{&options_.decode_dns, v1::ROLE_DECODE},
                            Source{&options_.draft_dns, v1::ROLE_DRAFT}}) {
    for (const std::string& name : *src.names) {
      std::string error;
      std::vector<std::string> addresses = ResolveAll(name, &error);
      if (!error.empty()) {
        // A name that does not resolve now (a Service with no ready pods) keeps what it had:
        // their own checks decide whether they stay in routing.
        spdlog::warn("scheduler: {}", error);
        continue;
      }
      // The pods' certificates name the Service, not their addresses.
      std::string tls_name = options_.tls_server_name;
      if (tls_name.empty()) {
        absl::StatusOr<HostPort> hp = ParseHostPort("dns", name);
        if (hp.ok()) tls_name = hp->host;
      }
      MutexLock l(&mu_);
      for (const std::string& a : addresses) {
        const bool known = std::any_of(workers_.begin(), workers_.end(), [&](const auto& w) {
          return w->address() == a && w->role() == src.role;
        });
        if (!known) {
          spdlog::info("scheduler: {} worker {} found through {}", v1::Role_Name(src.role), a,
                       name);
          workers_.push_back(std::make_shared<Worker>(a, src.role, tls_name));
        }
      }
    }
  }
  // Addresses no name resolves to any more leave (static ones always stay).
  if (options_.prefill_dns.empty() && options_.decode_dns.empty() && options_.draft_dns.empty()) {
    return;
  }
  std::set<std::string> wanted(options_.prefill.begin(), options_.prefill.end());
  wanted.insert(options_.decode.begin(), options_.decode.end());
  wanted.insert(options_.draft.begin(), options_.draft.end());
  bool all_resolved = true;
  for (const auto* names : {&options_.prefill_dns, &options_.decode_dns, &options_.draft_dns}) {
    for (const std::string& name : *names) {
      std::string error;
      std::vector<std::string> addresses = ResolveAll(name, &error);
      if (!error.empty()) all_resolved = false;
      wanted.insert(addresses.begin(), addresses.end());
    }
  }
  if (!all_resolved) return;
  MutexLock l(&mu_);
  workers_.erase(std::remove_if(workers_.begin(), workers_.end(),
                                [&](const auto& w) {
                                  if (wanted.count(w->address())) return false;
                                  spdlog::info("scheduler: {} left DNS; out of routing",
                                               w->address());
                                  return true;
                                }),
                 workers_.end());
}

void WorkerRegistry::CheckNow() {
  MutexLock round(&check_mu_);
  Resolve();
  std::vector<std::shared_ptr<Worker>> workers = All();
  // Every worker's Health at once (callback API), then wait for all of them: a round takes one
  // timeout at most, however many workers there are.
  struct Call {
    std::shared_ptr<Worker> worker;
    std::unique_ptr<grpc::ClientContext> context;
    v1::HealthRequest request;
    v1::HealthResponse response;
    grpc::Status status;
  };
  std::vector<Call> calls(workers.size());
  Mutex mu;
  CondVar cv;
  size_t done = 0;
  for (size_t i = 0; i < workers.size(); ++i) {
    Call& c = calls[i];
    c.worker = workers[i];
    c.context = NewClientContext(options_.timeout);
    auto on_done = [&, i](grpc::Status s) {
      MutexLock l(&mu);
      calls[i].status = std::move(s);
      ++done;
      cv.SignalAll();
    };
    switch (c.worker->role()) {
      case v1::ROLE_PREFILL:
        c.worker->prefill().async()->Health(c.context.get(), &c.request, &c.response, on_done);
        break;
      case v1::ROLE_DRAFT:
        c.worker->draft().async()->Health(c.context.get(), &c.request, &c.response, on_done);
        break;
      default:
        c.worker->decode().async()->Health(c.context.get(), &c.request, &c.response, on_done);
        break;
    }
  }
  {
    MutexLock l(&mu);
    while (done < calls.size()) cv.Wait(&mu);  // each call has the deadline above
  }
  for (Call& c : calls) {
    std::string error;
    if (!c.status.ok()) {
      error = absl::StrCat("Health: ", c.status.error_message());
      // gRPC's words for a certificate that does not name what was dialled: say what to do.
      if (absl::StrContains(error, "not in peer certificate")) {
        absl::StrAppend(&error, " (checked against ",
                        c.worker->tls_name().empty() ? "its address" : c.worker->tls_name(),
                        ": give --tls_server_name, or a *_dns name its certificate holds)");
      }
    } else if (c.response.role() != c.worker->role()) {
      error = absl::StrCat("is a ", v1::Role_Name(c.response.role()), " worker, listed as ",
                           v1::Role_Name(c.worker->role()));
    } else if (c.worker->role() == v1::ROLE_DRAFT && !options_.model_sha256.empty() &&
               c.response.target_model().sha256() != options_.model_sha256) {
      // A draft may be another, smaller model: what must match is the model whose token ids it
      // reads and writes.
      const v1::ModelIdentity& t = c.response.target_model();
      error = t.sha256().empty()
                  ? std::string("names no target model (start it with --target_model)")
                  : absl::StrCat("drafts for another model (", t.file_name(), ", sha256 ",
                                 t.sha256().substr(0, 12), "...)");
    } else if (c.worker->role() != v1::ROLE_DRAFT && !options_.model_sha256.empty() &&
               c.response.model().sha256() != options_.model_sha256) {
      error = absl::StrCat("serves another model (", c.response.model().file_name(), ", sha256 ",
                           c.response.model().sha256().substr(0, 12), "...)");
    } else if (c.response.draining()) {
      error = "draining";
    }
    const bool ok = error.empty();
    // A wrong model or role is not a transient miss: out at once.
    const int after = (ok || !c.status.ok()) ? options_.unhealthy_after : 1;
    if (c.worker->RecordCheck(ok, c.response, error, after)) {
      if (ok) {
        spdlog::info("scheduler: {} worker {} in routing", v1::Role_Name(c.worker->role()),
                     c.worker->address());
      } else {
        spdlog::warn("scheduler: {} worker {} out of routing: {}", v1::Role_Name(c.worker->role()),
                     c.worker->address(), error);
      }
    }
  }
}

}  // namespace tripod::scheduler
