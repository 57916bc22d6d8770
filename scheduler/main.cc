// tripod-scheduler: the front door. The OpenAI-compatible HTTP API (and /health, /metrics) on
// --http_listen, tripod.v1.Completion on the gRPC port --listen, the worker registry (static
// --prefill/--decode/--draft addresses and --prefill_dns/--decode_dns/--draft_dns names) and the
// dispatcher that routes each request through the workers. It reads only the model's metadata
// (tokenizer, chat template, context length, identity digest), never its weights.
// SIGTERM / SIGINT drain it: new requests get 503, those accepted get --grace_ms to finish, the
// rest are cancelled on their workers, then it stops (exit 0). A second signal cuts it short.

#include <chrono>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/http/http_server.h"
#include "common/metrics/metrics.h"
#include "common/rpc/worker_process.h"
#include "common/rpc/worker_server.h"
#include "common/util/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "scheduler/api_keys.h"
#include "scheduler/completion_service.h"
#include "scheduler/dispatcher.h"
#include "scheduler/http_api.h"
#include "scheduler/scheduler_flags.h"
#include "scheduler/scheduler_metrics.h"
#include "scheduler/served_model.h"
#include "scheduler/worker_registry.h"
#include "spdlog/spdlog.h"

namespace tripod::scheduler {
namespace {

constexpr ProcessInfo kProcess{
    .name = "tripod-scheduler",
    .usage =
        "tripod-scheduler --decode host:port[,...] [--prefill host:port[,...]] [flags]: "
        "the OpenAI-compatible API and tripod.v1.Completion, routing requests through the "
        "workers",
    .invalid_argument_exit = 2,
    .default_listen = "0.0.0.0:50051",
    .default_http_listen = "0.0.0.0:8000"};

absl::Status Serve(WorkerProcess& process) {
  ASSIGN_OR_RETURN(SchedulerFlags flags, SchedulerFlagsFromCommandLine());
  ASSIGN_OR_RETURN(ApiKeys keys, ApiKeys::Load(flags.api_key, flags.api_key_file));
  ASSIGN_OR_RETURN(const std::string model_path, process.ModelPath());
  absl::StatusOr<std::unique_ptr<ServedModel>> model =
      LoadServedModel(model_path, ServedModelName(process.model_flag(), flags.served_model_name),
                      flags.chat_template);
  if (!model.ok()) return absl::InternalError(model.status().ToString());
  flags.registry.model_sha256 = (*model)->identity.sha256;
  if (const int64_t len = flags.max_model_len; len != 0) {
    const int64_t context = (*model)->identity.context_length;
    if (len < 2 || (context > 0 && len > context)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--max_model_len must be between 2 and the model's context length (",
                       context, "), not ", len));
    }
    (*model)->max_model_len = len;
  }

  metrics::Registry registry;
  SchedulerMetrics scheduler_metrics(registry);
  WorkerRegistry workers(flags.registry);
  Dispatcher dispatcher(workers, &scheduler_metrics, flags.dispatcher);
  scheduler_metrics.AddGauges(
      [&] { return dispatcher.running(); }, [&] { return dispatcher.waiting(); },
      [&](int role) {
        return static_cast<double>(workers.Healthy(static_cast<v1::Role>(role)).size());
      });
  workers.Start();

  HttpApi api(HttpApiConfig{model->get(), &dispatcher, &registry, &keys, flags.api_threads,
                            flags.admission, flags.dispatcher.retry_after_s});
  registry.AddCallbackGauge("tripod:http_requests_preparing",
                            "API requests being parsed, tokenized and submitted, or waiting for a "
                            "thread to do so",
                            {{"role", "scheduler"}}, [&api] { return api.preparing(); });
  registry.AddCallbackGauge(
      "tripod:http_requests_preparing_bytes", "The body bytes of those requests",
      {{"role", "scheduler"}}, [&api] {
        return static_cast<double>(api.admission().bytes.load(std::memory_order_relaxed));
      });
  for (const auto& [limit, refused] : {std::pair{"requests", &api.admission().refused_requests},
                                       std::pair{"bytes", &api.admission().refused_bytes}}) {
    registry.AddCallbackCounter(
        "tripod:http_requests_shed_total",
        "API requests answered 429 before parsing: the requests waiting for the API threads, or "
        "their bytes, were at --max_preparing or --max_preparing_bytes",
        {{"role", "scheduler"}, {"limit", limit}},
        [refused] { return static_cast<double>(refused->load(std::memory_order_relaxed)); });
  }
  const HostPort http_at = process.http_listen();
  ASSIGN_OR_RETURN(
      std::unique_ptr<http::HttpServer> http,
      http::HttpServer::Start(
          http_at.host, http_at.port,
          [&api](std::shared_ptr<http::HttpExchange> ex) { api.Handle(std::move(ex)); },
          flags.http));
  registry.AddCallbackGauge("tripod:http_open_connections", "Open HTTP connections",
                            {{"role", "scheduler"}},
                            [h = http.get()] { return h->open_connections(); });

  CompletionService completion(model->get(), &dispatcher, &keys);
  ASSIGN_OR_RETURN(std::unique_ptr<grpc::Server> server,
                   process.StartGrpcServer({&completion}, {.worker_limits = false}));
  spdlog::info("model '{}' (context {}); {} prefill and {} decode workers in routing",
               (*model)->name, (*model)->max_model_len, workers.Healthy(v1::ROLE_PREFILL).size(),
               workers.Healthy(v1::ROLE_DECODE).size());
  // Accepted requests get the grace period; then queued ones get 503 and running ones are
  // cancelled on their workers.
  DrainableFunctions work([&] { dispatcher.StartDraining(); },
                          [&] { return dispatcher.running() + dispatcher.waiting(); },
                          [&] { dispatcher.Shutdown(std::chrono::milliseconds(5000)); });
  RETURN_IF_ERROR(process.ServeUntilStopped(*server, http->port(), work));
  http->Stop();
  workers.Stop();
  return absl::OkStatus();
}

}  // namespace
}  // namespace tripod::scheduler

namespace tripod {
const ProcessInfo kThisProcess = scheduler::kProcess;
absl::Status ServeThisProcess(WorkerProcess& process) { return scheduler::Serve(process); }
}  // namespace tripod
