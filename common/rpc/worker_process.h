// The skeleton every Tripod process (tripod-prefill, -decode, -draft, -scheduler) stands on, so
// that its main keeps only its own options and services:
//  - the flags they share: --listen (gRPC), --http_listen, --port_file, --grace_ms, --model,
//    --log_level, and the TLS flags (tls_flags.h); names may be spelled with dashes;
//  - the stop signals blocked before any thread starts, the logger set up, and the exit status;
//  - the gRPC server with the process's services, the /health and /metrics endpoint, the port
//    file ({"grpc_port":N,"http_port":M}, written once both listen);
//  - SIGTERM/SIGINT: one drain (drain.h), then the server stops.
#pragma once

#include <signal.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/metrics/http_endpoint.h"
#include "common/metrics/metrics.h"
#include "common/rpc/drain.h"
#include "common/rpc/worker_server.h"
#include "grpcpp/grpcpp.h"

namespace tripod {

struct ProcessInfo {
  const char* name;   // "tripod-prefill": the default logger's name
  const char* usage;  // --help's first line
  // The exit status of an INVALID_ARGUMENT error (a flag's value); any other error exits 1.
  int invalid_argument_exit = 1;
  // The defaults of --listen and --http_listen.
  const char* default_listen = "127.0.0.1:0";
  const char* default_http_listen = "127.0.0.1:0";
};

struct GrpcServerOptions {
  // The workers' channel limits and keepalive policy (ConfigureWorkerServer).
  bool worker_limits = true;
  // Anything else the process sets on the builder (a resource quota, say).
  std::function<void(grpc::ServerBuilder&)> configure;
};

struct ServeOptions {
  // While no stop signal has come, `tick` runs every `tick_every`.
  absl::Duration tick_every = absl::InfiniteDuration();
  std::function<void()> tick;
  // After the drain, calls still open this long are cancelled with the server's shutdown.
  absl::Duration server_shutdown = absl::Seconds(2);
};

// What a process's serve function gets from the skeleton: the shared flags, checked.
class WorkerProcess {
 public:
  WorkerProcess(const ProcessInfo& info, const sigset_t& signals)
      : info_(info), signals_(signals) {}

  const ProcessInfo& info() const { return info_; }
  const sigset_t& signals() const { return signals_; }
  absl::Duration grace() const;
  std::string model_flag() const;                 // --model as given
  absl::StatusOr<std::string> ModelPath() const;  // --model resolved (model_resolver.h)
  std::string listen() const;                     // --listen
  HostPort http_listen() const;                   // --http_listen, checked

  // Checks the shared flags and sets up TLS; the serve function runs only when this is OK.
  absl::Status SetUp();

  // The gRPC server on --listen with `services` (which must outlive it).
  absl::StatusOr<std::unique_ptr<grpc::Server>> StartGrpcServer(
      const std::vector<grpc::Service*>& services, const GrpcServerOptions& options = {});
  // GET /health and /metrics on --http_listen.
  absl::StatusOr<std::unique_ptr<metrics::HttpEndpoint>> StartHealthEndpoint(
      const metrics::Registry* registry, metrics::HttpEndpoint::HealthFn health);

  // A worker's whole serving life: `service` on gRPC, GET /health (ready unless `health` says
  // draining; its JSON the body) and /metrics of `registry` on HTTP, then ServeUntilStopped. The
  // endpoint stops before this returns.
  absl::Status ServeWorker(grpc::Service& service, const metrics::Registry* registry,
                           std::function<v1::HealthResponse()> health, Drainable& work,
                           const GrpcServerOptions& grpc_options = {},
                           const ServeOptions& serve_options = {});

  // Writes the port file, waits for a stop signal, drains `work`, and shuts `server` down.
  absl::Status ServeUntilStopped(grpc::Server& server, int http_port, Drainable& work,
                                 const ServeOptions& options = {});

 private:
  const ProcessInfo info_;
  const sigset_t signals_;
  std::shared_ptr<grpc::ServerCredentials> credentials_;
  int grpc_port_ = 0;
};

// The whole of a main: blocks the stop signals, parses the flags (refusing positional
// arguments: exit 2), sets up logging and the shared flags, and runs `serve`; an error status is
// logged and gives the exit status.
int RunProcess(const ProcessInfo& info, int argc, char** argv,
               const std::function<absl::Status(WorkerProcess&)>& serve);

// Each process binary links common/rpc/process_main.cc, whose main runs these two through
// RunProcess; the binary's own main.cc defines them (what it is, and how it serves), so the four
// mains hold only what differs between them.
extern const ProcessInfo kThisProcess;
absl::Status ServeThisProcess(WorkerProcess& process);

}  // namespace tripod
