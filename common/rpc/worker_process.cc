// The process skeleton; see worker_process.h.
#include "common/rpc/worker_process.h"

#include <chrono>
#include <cstdint>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "common/model/model_resolver.h"
#include "common/rpc/stop_signals.h"
#include "common/rpc/tls_flags.h"
#include "common/util/flag_args.h"
#include "common/util/log.h"
#include "common/util/status_macros.h"
#include "spdlog/spdlog.h"

namespace tripod {
namespace {

// The running process's, set before the flags are first read: --listen's and --http_listen's
// defaults are its own (abseil makes a flag's default when the flag is first used).
const ProcessInfo* g_process = nullptr;

std::string DefaultListen() { return g_process ? g_process->default_listen : "127.0.0.1:0"; }
std::string DefaultHttpListen() {
  return g_process ? g_process->default_http_listen : "127.0.0.1:0";
}

}  // namespace
}  // namespace tripod

ABSL_FLAG(std::string, listen, tripod::DefaultListen(),
          "gRPC address host:port (port 0: any free port)");
ABSL_FLAG(std::string, http_listen, tripod::DefaultHttpListen(),
          "HTTP address host:port (port 0: any free port): GET /health and /metrics, and the "
          "scheduler's OpenAI-compatible API");
ABSL_FLAG(std::string, port_file, "",
          "once both ports listen, write {\"grpc_port\":N,\"http_port\":M} here (atomically)");
ABSL_FLAG(std::string, model, "",
          "a GGUF file or a model catalogue name (scripts/fetch_model --list); default: the "
          "bundled model");
ABSL_FLAG(int64_t, grace_ms, 10000,
          "on SIGTERM/SIGINT, how long work in flight may take to finish before it is cancelled "
          "(a second signal cuts it short)");
ABSL_FLAG(std::string, log_level, "info", "trace | debug | info | warn | error");

namespace tripod {

absl::Duration WorkerProcess::grace() const {
  return absl::Milliseconds(absl::GetFlag(FLAGS_grace_ms));
}

std::string WorkerProcess::model_flag() const { return absl::GetFlag(FLAGS_model); }

absl::StatusOr<std::string> WorkerProcess::ModelPath() const { return ResolveModel(model_flag()); }

std::string WorkerProcess::listen() const { return absl::GetFlag(FLAGS_listen); }

HostPort WorkerProcess::http_listen() const {
  return *ParseHostPort("http_listen", absl::GetFlag(FLAGS_http_listen));  // checked by SetUp
}

absl::Status WorkerProcess::SetUp() {
  if (absl::GetFlag(FLAGS_grace_ms) < 0) {
    return absl::InvalidArgumentError("--grace_ms must not be negative");
  }
  RETURN_IF_ERROR(ParseHostPort("listen", listen()).status());  // gRPC takes the text itself
  RETURN_IF_ERROR(ParseHostPort("http_listen", absl::GetFlag(FLAGS_http_listen)).status());
  ASSIGN_OR_RETURN(credentials_, SetUpGrpcTlsFromFlags());
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<grpc::Server>> WorkerProcess::StartGrpcServer(
    const std::vector<grpc::Service*>& services, const GrpcServerOptions& options) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen(), credentials_, &grpc_port_);
  for (grpc::Service* s : services) builder.RegisterService(s);
  if (options.worker_limits) ConfigureWorkerServer(builder);
  if (options.configure) options.configure(builder);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || grpc_port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen for gRPC on ", listen()));
  }
  return server;
}

absl::StatusOr<std::unique_ptr<metrics::HttpEndpoint>> WorkerProcess::StartHealthEndpoint(
    const metrics::Registry* registry, metrics::HttpEndpoint::HealthFn health) {
  const HostPort at = http_listen();
  return metrics::HttpEndpoint::Start(at.host, at.port, registry, std::move(health));
}

absl::Status WorkerProcess::ServeWorker(grpc::Service& service, const metrics::Registry* registry,
                                        std::function<v1::HealthResponse()> health, Drainable& work,
                                        const GrpcServerOptions& grpc_options,
                                        const ServeOptions& serve_options) {
  ASSIGN_OR_RETURN(std::unique_ptr<grpc::Server> server, StartGrpcServer({&service}, grpc_options));
  ASSIGN_OR_RETURN(std::unique_ptr<metrics::HttpEndpoint> http,
                   StartHealthEndpoint(registry, [health = std::move(health)] {
                     const v1::HealthResponse h = health();
                     return metrics::HealthReport{!h.draining(), HealthJson(h)};
                   }));
  RETURN_IF_ERROR(ServeUntilStopped(*server, http->port(), work, serve_options));
  http->Stop();
  return absl::OkStatus();
}

absl::Status WorkerProcess::ServeUntilStopped(grpc::Server& server, int http_port, Drainable& work,
                                              const ServeOptions& options) {
  if (const std::string path = absl::GetFlag(FLAGS_port_file); !path.empty()) {
    RETURN_IF_ERROR(WritePortFile(path, grpc_port_, http_port));
  }
  spdlog::info("gRPC on port {}, HTTP on port {}", grpc_port_, http_port);
  while (!WaitStopSignal(signals_, options.tick_every)) {
    if (options.tick) options.tick();
  }
  Drain(work, grace(), signals_);
  // Calls still open after the deadline are cancelled.
  server.Shutdown(std::chrono::system_clock::now() +
                  absl::ToChronoNanoseconds(options.server_shutdown));
  server.Wait();
  return absl::OkStatus();
}

int RunProcess(const ProcessInfo& info, int argc, char** argv,
               const std::function<absl::Status(WorkerProcess&)>& serve) {
  const sigset_t signals = BlockStopSignals();  // before any thread starts
  g_process = &info;
  SetUpLogging(info.name, spdlog::level::info);  // errors from here on go to stderr
  absl::SetProgramUsageMessage(info.usage);
  UnderscoredArgs args(argc, argv);
  const std::vector<char*> rest = absl::ParseCommandLine(args.argc(), args.argv());
  if (rest.size() > 1) {
    spdlog::error("unexpected argument '{}' (flags only; see --help)", rest[1]);
    return 2;
  }
  const absl::StatusOr<spdlog::level::level_enum> level =
      ParseLogLevel(absl::GetFlag(FLAGS_log_level));
  if (!level.ok()) {
    spdlog::error("{}", level.status().ToString());
    return 2;
  }
  SetUpLogging(info.name, *level);
  WorkerProcess process(info, signals);
  absl::Status status = process.SetUp();
  if (status.ok()) status = serve(process);
  if (!status.ok()) {
    spdlog::error("{}", status.ToString());
    return status.code() == absl::StatusCode::kInvalidArgument ? info.invalid_argument_exit : 1;
  }
  spdlog::info("stopped");
  return 0;
}

}  // namespace tripod
