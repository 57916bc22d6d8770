// The scheduler's view of its workers: which exist (static addresses from flags, and DNS names
// that resolve to many addresses, as a Kubernetes headless Service does), which answer their
// Health checks, and how loaded each is. A checker thread calls Health on every worker each
// interval; a worker that misses `unhealthy_after` checks in a row, reports draining, or serves
// another model leaves routing, and comes back at its next good answer. Addresses that vanish
// from DNS are dropped (requests still running on them keep their Worker alive).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/util/mutex.h"
#include "grpcpp/grpcpp.h"
#include "tripod/v1/common.pb.h"
#include "tripod/v1/decode.grpc.pb.h"
#include "tripod/v1/draft.grpc.pb.h"
#include "tripod/v1/prefill.grpc.pb.h"

namespace tripod::scheduler {

// One worker process. Its address, role, channel and stubs never change; its health and load
// are updated by the checker and by the requests routed to it.
class Worker {
 public:
  // tls_name: the name its certificate is checked against under mutual TLS (NewWorkerChannel);
  // empty: its address.
  Worker(std::string address, v1::Role role, std::string tls_name = "");

  const std::string& address() const { return address_; }
  const std::string& tls_name() const { return tls_name_; }
  v1::Role role() const { return role_; }
  v1::Prefill::Stub& prefill() { return *prefill_; }  // role == ROLE_PREFILL
  v1::Decode::Stub& decode() { return *decode_; }     // role == ROLE_DECODE
  v1::Draft::Stub& draft() { return *draft_; }        // role == ROLE_DRAFT

  bool healthy() const { return healthy_.load(std::memory_order_acquire); }
  v1::HealthResponse last_health() const;
  std::string last_error() const;

  // Requests this scheduler has routed here and not yet finished (the load between checks).
  int inflight() const { return inflight_.load(std::memory_order_relaxed); }
  void AddInflight(int d) { inflight_.fetch_add(d, std::memory_order_relaxed); }
  // Their prompt tokens (draft workers: the work queued ahead of the next request).
  int64_t inflight_tokens() const { return inflight_tokens_.load(std::memory_order_relaxed); }
  void AddInflightTokens(int64_t d) { inflight_tokens_.fetch_add(d, std::memory_order_relaxed); }

  // The checker's verdict on one Health call: ok with the answer, or the reason it failed.
  // Returns true when the worker's healthy state changed.
  bool RecordCheck(bool ok, const v1::HealthResponse& health, const std::string& error,
                   int unhealthy_after);
  // A request saw the worker fail (UNAVAILABLE): out of routing until its next good check.
  void MarkFailed(const std::string& error);

 private:
  const std::string address_;
  const v1::Role role_;
  const std::string tls_name_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Prefill::Stub> prefill_;
  std::unique_ptr<v1::Decode::Stub> decode_;
  std::unique_ptr<v1::Draft::Stub> draft_;
  std::atomic<bool> healthy_{false};
  std::atomic<int> inflight_{0};
  std::atomic<int64_t> inflight_tokens_{0};
  mutable Mutex mu_;
  v1::HealthResponse health_ ABSL_GUARDED_BY(mu_);
  std::string error_ ABSL_GUARDED_BY(mu_);
  int misses_ ABSL_GUARDED_BY(mu_) = 0;
};

struct WorkerRegistryOptions {
  std::vector<std::string> prefill;      // host:port
  std::vector<std::string> decode;       // host:port
  std::vector<std::string> draft;        // host:port
  std::vector<std::string> prefill_dns;  // name:port, resolved every check
  std::vector<std::string> decode_dns;
  std::vector<std::string> draft_dns;
  // Under mutual TLS, the name every worker's certificate is checked against (--tls_server_name).
  // Empty: a worker found through a DNS name is checked against that name (a pod IP holds its
  // Service's certificate), a listed one against its address.
  std::string tls_server_name;
  std::chrono::milliseconds interval{2000};
  std::chrono::milliseconds timeout{1000};  // one Health call
  int unhealthy_after = 2;                  // consecutive failed checks
  // The model's identity digest every worker must report (ModelIdentity.sha256; a draft worker's
  // target_model); empty: any.
  std::string model_sha256;
};

class WorkerRegistry {
 public:
  explicit WorkerRegistry(WorkerRegistryOptions options);
  ~WorkerRegistry();  // Stop()
  WorkerRegistry(const WorkerRegistry&) = delete;
  WorkerRegistry& operator=(const WorkerRegistry&) = delete;

  // Runs one round of checks (bounded by the timeout) so that routing works at once, then starts
  // the checker thread.
  void Start();
  void Stop();

  // Workers of `role` now in routing.
  std::vector<std::shared_ptr<Worker>> Healthy(v1::Role role) const;
  // Every known worker (for /health and metrics).
  std::vector<std::shared_ptr<Worker>> All() const;

  // One round of checks now (also what the thread runs each interval). Thread-safe.
  void CheckNow();

 private:
  void Resolve();  // DNS names -> workers (adds new addresses, drops vanished ones)
  void Loop();

  const WorkerRegistryOptions options_;
  mutable Mutex mu_;
  std::vector<std::shared_ptr<Worker>> workers_ ABSL_GUARDED_BY(mu_);
  Mutex check_mu_;  // one round at a time
  Mutex stop_mu_;
  CondVar stop_cv_;
  bool stopping_ ABSL_GUARDED_BY(stop_mu_) = false;
  std::thread thread_;
};

// "name:port" -> every "ip:port" the name resolves to now (IPv4 and IPv6), sorted, no
// duplicates; an unresolvable name gives none (the error in *error).
std::vector<std::string> ResolveAll(const std::string& name_port, std::string* error);

}  // namespace tripod::scheduler
