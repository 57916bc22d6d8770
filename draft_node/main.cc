// tripod-draft: the draft worker. Serves tripod.v1.Draft on gRPC (--listen) and GET /health and
// /metrics on HTTP (--http_listen): each Score runs the draft over the prompt and answers with
// its importance map. Writes {"grpc_port":N,"http_port":M} to --port_file once both listen.
// SIGTERM/SIGINT: stop accepting, let requests finish within --grace_ms, exit 0.
#include <signal.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/metrics/http_endpoint.h"
#include "common/metrics/metrics.h"
#include "common/model/model_resolver.h"
#include "common/rpc/model_identity.h"
#include "common/rpc/protocol.h"
#include "common/rpc/stop_signals.h"
#include "common/rpc/tls_flags.h"
#include "common/rpc/worker_server.h"
#include "common/util/status_macros.h"
#include "common/util/thread_pool.h"
#include "draft_node/draft_engine.h"
#include "draft_node/draft_metrics.h"
#include "draft_node/draft_service.h"
#include "draft_node/draft_worker.h"
#include "grpcpp/grpcpp.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0", "gRPC address host:port (port 0: a free one)");
ABSL_FLAG(std::string, http_listen, "127.0.0.1:0",
          "HTTP address host:port for /health and /metrics (port 0: a free one)");
ABSL_FLAG(std::string, port_file, "",
          "write {\"grpc_port\":N,\"http_port\":M} here (atomically) once both listen");
ABSL_FLAG(std::string, model, "",
          "a GGUF file or a model catalogue name (scripts/fetch_model --list); default: the "
          "bundled model");
ABSL_FLAG(int, draft_layers, 8,
          "self-draft depth: the first N layers of --model with its norm and head (0: --model is a "
          "separate draft model, run in full)");
ABSL_FLAG(std::string, lookahead_layers, "all",
          "a self-draft's depth for SpecKV's lookahead tokens: all (the target's own greedy "
          "tokens; on the bundled model only these keep SpecKV's accuracy) or N >= --draft_layers; "
          "the importance map still comes from the first --draft_layers");
ABSL_FLAG(std::string, target_model, "",
          "the target model (a GGUF file or a catalogue name), whose vocabulary a separate draft "
          "must share (checked at start)");
ABSL_FLAG(std::string, backend, "cpu",
          "cpu | cuda (the draft on the GPU: bf16 weights, f16 KV) | cpu-guarded-kv (tests: the "
          "CPU with its KV out of the host code's reach, as a GPU's)");
ABSL_FLAG(std::string, precision, "auto", "the CPU's: fp32 | bf16 | int8 | int16 | auto");
ABSL_FLAG(int, threads, 0, "compute threads (0: all cores)");
ABSL_FLAG(int, chunk, 512, "prompt tokens per forward pass");
ABSL_FLAG(int, context, 0, "prompt + lookahead tokens at most (0: the model's context length)");
ABSL_FLAG(int, max_queue, 64, "requests waiting at most; more are refused (RESOURCE_EXHAUSTED)");
ABSL_FLAG(int, grace_ms, 10000, "on SIGTERM/SIGINT, how long requests in flight may finish");

namespace tripod {
namespace {

absl::Status Serve(const sigset_t& signals) {
  const int max_queue = absl::GetFlag(FLAGS_max_queue);
  const int grace_ms = absl::GetFlag(FLAGS_grace_ms);
  const int threads = absl::GetFlag(FLAGS_threads);
  if (max_queue < 1) return absl::InvalidArgumentError("--max_queue must be at least 1");
  if (grace_ms < 0) return absl::InvalidArgumentError("--grace_ms must not be negative");
  if (threads < 0) return absl::InvalidArgumentError("--threads must not be negative");
  if (absl::GetFlag(FLAGS_context) < 0) {
    return absl::InvalidArgumentError("--context must not be negative");
  }
  const std::string listen = absl::GetFlag(FLAGS_listen);
  RETURN_IF_ERROR(ParseHostPort("listen", listen).status());
  ASSIGN_OR_RETURN(const std::shared_ptr<grpc::ServerCredentials> credentials,
                   SetUpGrpcTlsFromFlags());
  ASSIGN_OR_RETURN(HostPort http_addr,
                   ParseHostPort("http_listen", absl::GetFlag(FLAGS_http_listen)));
  if (threads > 0) SetComputeThreads(threads);

  DraftEngineOptions o;
  ASSIGN_OR_RETURN(o.model_path, ResolveModel(absl::GetFlag(FLAGS_model)));
  o.self_draft_layers = absl::GetFlag(FLAGS_draft_layers);
  ASSIGN_OR_RETURN(o.lookahead_layers, ParseLookaheadLayers(absl::GetFlag(FLAGS_lookahead_layers)));
  if (!absl::GetFlag(FLAGS_target_model).empty()) {
    ASSIGN_OR_RETURN(o.target_model_path, ResolveModel(absl::GetFlag(FLAGS_target_model)));
  }
  o.backend = absl::GetFlag(FLAGS_backend);
  o.precision = absl::GetFlag(FLAGS_precision);
  o.prefill_chunk = absl::GetFlag(FLAGS_chunk);
  o.context_tokens = absl::GetFlag(FLAGS_context);
  ASSIGN_OR_RETURN(ModelIdentityInfo identity, ComputeModelIdentity(o.model_path));
  v1::ModelIdentity model;
  ToWire(identity, &model);
  // The target: the model itself for a self-draft; a separate draft names it (its vocabulary is
  // checked by the engine), else Health reports none and schedulers keep it out of routing.
  v1::ModelIdentity target;
  if (o.self_draft_layers > 0 || o.target_model_path == o.model_path) {
    target = model;
  } else if (!o.target_model_path.empty()) {
    ASSIGN_OR_RETURN(ModelIdentityInfo t, ComputeModelIdentity(o.target_model_path));
    ToWire(t, &target);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<DraftEngine> engine, DraftEngine::Create(o));
  spdlog::info("tripod-draft: model {}, {} of {} layers ({} for lookahead), {} threads, chunk {}",
               identity.file_name, engine->depth(), engine->model().config.n_layers,
               engine->lookahead_depth(), ComputeThreads(), o.prefill_chunk);

  metrics::Registry registry;
  DraftMetrics metrics(registry);
  DraftWorker worker(*engine, &metrics, max_queue);
  metrics.AddQueueGauges([&] { return worker.queued(); }, [&] { return worker.running(); },
                         [&] { return worker.draining(); });
  DraftService service(worker, &metrics, model, target);

  grpc::ServerBuilder builder;
  int grpc_port = 0;
  builder.AddListeningPort(listen, credentials, &grpc_port);
  builder.RegisterService(&service);
  ConfigureWorkerServer(builder);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || grpc_port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen for gRPC on ", listen));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<metrics::HttpEndpoint> http,
                   metrics::HttpEndpoint::Start(http_addr.host, http_addr.port, &registry, [&] {
                     const v1::HealthResponse h = service.HealthNow();
                     return metrics::HealthReport{!h.draining(), HealthJson(h)};
                   }));
  const std::string port_file = absl::GetFlag(FLAGS_port_file);
  if (!port_file.empty()) RETURN_IF_ERROR(WritePortFile(port_file, grpc_port, http->port()));
  spdlog::info("tripod-draft: gRPC on port {}, HTTP on port {}", grpc_port, http->port());

  while (!WaitStopSignal(signals, absl::InfiniteDuration())) {
  }
  spdlog::info("tripod-draft: stop signal: draining ({} ms grace)", grace_ms);
  worker.Shutdown(absl::Milliseconds(grace_ms));
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  http->Stop();
  spdlog::info("tripod-draft: stopped");
  return absl::OkStatus();
}

}  // namespace
}  // namespace tripod

int main(int argc, char** argv) {
  const sigset_t signals = tripod::BlockStopSignals();  // before any thread starts

  absl::SetProgramUsageMessage(
      "tripod-draft: the draft worker (tripod.v1.Draft on gRPC, /health and /metrics on HTTP)");
  const std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    std::fprintf(stderr, "tripod-draft: unexpected argument '%s' (flags only; see --help)\n",
                 rest[1]);
    return 2;
  }
  spdlog::set_default_logger(spdlog::stderr_color_mt("tripod-draft"));
  const absl::Status s = tripod::Serve(signals);
  if (!s.ok()) {
    spdlog::error("tripod-draft: {}", s.ToString());
    return 1;
  }
  return 0;
}
