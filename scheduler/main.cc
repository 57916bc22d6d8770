// tripod-scheduler: the front door. The OpenAI-compatible HTTP API (and /health, /metrics) on
// --http_listen, tripod.v1.Completion on the gRPC port --listen, the worker registry (static
// --prefill/--decode/--draft addresses and --prefill_dns/--decode_dns/--draft_dns names) and the
// dispatcher that routes each request through the workers. It reads only the model's metadata
// (tokenizer, chat template, context length, identity digest), never its weights.
// SIGTERM / SIGINT drain it: new requests get 503, those accepted get --grace_ms to finish, the
// rest are cancelled on their workers, then it stops (exit 0). A second signal cuts it short.
#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/http/http_server.h"
#include "common/metrics/metrics.h"
#include "common/model/model_resolver.h"
#include "common/rpc/stop_signals.h"
#include "common/rpc/tls_flags.h"
#include "common/rpc/worker_server.h"
#include "grpcpp/grpcpp.h"
#include "scheduler/api_keys.h"
#include "scheduler/completion_service.h"
#include "scheduler/dispatcher.h"
#include "scheduler/http_api.h"
#include "scheduler/openai_request.h"
#include "scheduler/scheduler_metrics.h"
#include "scheduler/served_model.h"
#include "scheduler/worker_registry.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, http_listen, "0.0.0.0:8000",
          "HTTP address host:port of the OpenAI-compatible API, /health and /metrics (port 0: any "
          "free port)");
ABSL_FLAG(std::string, listen, "0.0.0.0:50051",
          "gRPC address host:port of tripod.v1.Completion (port 0: any free port)");
ABSL_FLAG(std::string, port_file, "",
          "once both ports listen, write {\"grpc_port\":N,\"http_port\":M} here (atomically)");
ABSL_FLAG(std::string, model, "",
          "a GGUF file or a model catalogue name (default: the bundled model); only its metadata "
          "is read");
ABSL_FLAG(std::string, served_model_name, "",
          "the name clients use in `model` (default: --model's catalogue name, else the GGUF "
          "file name without .gguf, which stays accepted under another name)");
ABSL_FLAG(int64_t, max_model_len, 0,
          "prompt plus completion tokens a request may use, at most (0: the model's context "
          "length; more than it is an error); longer requests get a 400");
ABSL_FLAG(std::string, chat_template, "", "chatml | llama3 (default: the model's own)");
ABSL_FLAG(std::string, prefill, "", "prefill workers' gRPC addresses, host:port,...");
ABSL_FLAG(std::string, decode, "", "decode workers' gRPC addresses, host:port,...");
ABSL_FLAG(std::string, prefill_dns, "",
          "name:port,... resolved every health interval; every address is a prefill worker (a "
          "Kubernetes headless Service)");
ABSL_FLAG(std::string, decode_dns, "", "the same for decode workers");
ABSL_FLAG(std::string, draft, "",
          "draft workers' gRPC addresses, host:port,... (for tripod.method speckv, specpc, "
          "draftmap)");
ABSL_FLAG(std::string, draft_dns, "", "the same as --prefill_dns for draft workers");
ABSL_FLAG(int64_t, draft_timeout_ms, 30000,
          "a draft worker's Score deadline; past it the request runs without its method");
ABSL_FLAG(int, speckv_lookahead, 64,
          "SpecKV's draft lookahead tokens at most (also at most the request's max_tokens)");
ABSL_FLAG(
    std::string, pop, "",
    "POP ratio for requests that name none (\"1/3\", \"0\"); empty: the prefill workers' own");
ABSL_FLAG(std::string, api_key, "", "API key clients must send (Authorization: Bearer KEY)");
ABSL_FLAG(std::string, api_key_file, "", "a file of API keys, one per line");
ABSL_FLAG(int, migration_limit, 1,
          "times a request streaming from a decode worker that dies moves to another one, which "
          "continues it from the prompt and the tokens already streamed (0: the stream ends with "
          "an error)");
ABSL_FLAG(int, max_inflight, 256, "requests at the workers at once");
ABSL_FLAG(int, max_queue, 1024, "requests waiting beyond --max_inflight; past this: 429");
ABSL_FLAG(int, direct_prefill_tokens, 32,
          "prompts shorter than this go straight to a decode worker, which prefills them itself");
ABSL_FLAG(int64_t, health_interval_ms, 2000, "how often every worker's Health is called");
ABSL_FLAG(int64_t, health_timeout_ms, 1000, "one Health call's deadline");
ABSL_FLAG(int, unhealthy_after, 2, "failed checks in a row that take a worker out of routing");
ABSL_FLAG(int, io_threads, 1, "HTTP I/O threads");
ABSL_FLAG(int, api_threads, 2,
          "threads that parse, tokenize and submit API requests, off the HTTP I/O threads");
ABSL_FLAG(int, max_connections_per_client, 0,
          "open HTTP connections from one client address, at most (0: no limit; behind a proxy "
          "every client shares its address); beyond: 429");
ABSL_FLAG(std::string, http_tls_cert, "",
          "HTTPS on the API: the server's certificate chain (PEM); with --http_tls_key");
ABSL_FLAG(std::string, http_tls_key, "", "HTTPS on the API: --http_tls_cert's private key (PEM)");
ABSL_FLAG(int64_t, grace_ms, 10000,
          "on SIGTERM/SIGINT, how long accepted requests may take to finish before they are "
          "cancelled");

namespace tripod::scheduler {
namespace {

std::vector<std::string> SplitList(const std::string& s) {
  std::vector<std::string> out;
  for (absl::string_view part : absl::StrSplit(s, ',', absl::SkipWhitespace())) {
    out.emplace_back(absl::StripAsciiWhitespace(part));
  }
  return out;
}

absl::Status CheckFlags(const WorkerRegistryOptions& ro) {
  for (const auto* list :
       {&ro.prefill, &ro.decode, &ro.draft, &ro.prefill_dns, &ro.decode_dns, &ro.draft_dns}) {
    for (const std::string& a : *list) {
      absl::StatusOr<HostPort> hp = ParseHostPort("worker address", a);
      if (!hp.ok()) return hp.status();
      if (hp->port == 0) return absl::InvalidArgumentError("a worker address needs a port: " + a);
    }
  }
  if (ro.decode.empty() && ro.decode_dns.empty()) {
    return absl::InvalidArgumentError("no decode worker: give --decode or --decode_dns");
  }
  if (absl::GetFlag(FLAGS_max_inflight) < 1) {
    return absl::InvalidArgumentError("--max_inflight must be >= 1");
  }
  if (absl::GetFlag(FLAGS_max_queue) < 0) {
    return absl::InvalidArgumentError("--max_queue must be >= 0");
  }
  if (absl::GetFlag(FLAGS_health_interval_ms) <= 0 || absl::GetFlag(FLAGS_health_timeout_ms) <= 0) {
    return absl::InvalidArgumentError("--health_interval_ms and --health_timeout_ms must be > 0");
  }
  if (absl::GetFlag(FLAGS_unhealthy_after) < 1) {
    return absl::InvalidArgumentError("--unhealthy_after must be >= 1");
  }
  if (absl::GetFlag(FLAGS_max_connections_per_client) < 0) {
    return absl::InvalidArgumentError("--max_connections_per_client must not be negative");
  }
  if (absl::GetFlag(FLAGS_io_threads) < 1) {
    return absl::InvalidArgumentError("--io_threads must be >= 1");
  }
  if (absl::GetFlag(FLAGS_api_threads) < 1) {
    return absl::InvalidArgumentError("--api_threads must be >= 1");
  }
  if (absl::GetFlag(FLAGS_draft_timeout_ms) <= 0) {
    return absl::InvalidArgumentError("--draft_timeout_ms must be > 0");
  }
  if (absl::GetFlag(FLAGS_migration_limit) < 0) {
    return absl::InvalidArgumentError("--migration_limit must be >= 0");
  }
  if (absl::GetFlag(FLAGS_speckv_lookahead) < 0) {
    return absl::InvalidArgumentError("--speckv_lookahead must be >= 0");
  }
  if (absl::GetFlag(FLAGS_grace_ms) < 0)
    return absl::InvalidArgumentError("--grace_ms must be >= 0");
  if (const std::string pop = absl::GetFlag(FLAGS_pop); !pop.empty()) {
    ApiResult<PopChoice> p = ParsePopChoice(pop);
    const PopChoice* choice = std::get_if<PopChoice>(&p);
    if (choice == nullptr || choice->kind != PopChoice::Kind::kRatio) {
      return absl::InvalidArgumentError("--pop must be a ratio in [0, 1) such as 1/3 or 0.25");
    }
  }
  return absl::OkStatus();
}

int Fail(const absl::Status& st) {
  std::fprintf(stderr, "tripod-scheduler: %s\n", std::string(st.message()).c_str());
  return st.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

int Run(const sigset_t& signals) {
  WorkerRegistryOptions ro;
  ro.prefill = SplitList(absl::GetFlag(FLAGS_prefill));
  ro.decode = SplitList(absl::GetFlag(FLAGS_decode));
  ro.prefill_dns = SplitList(absl::GetFlag(FLAGS_prefill_dns));
  ro.decode_dns = SplitList(absl::GetFlag(FLAGS_decode_dns));
  ro.draft = SplitList(absl::GetFlag(FLAGS_draft));
  ro.draft_dns = SplitList(absl::GetFlag(FLAGS_draft_dns));
  ro.interval = std::chrono::milliseconds(absl::GetFlag(FLAGS_health_interval_ms));
  ro.timeout = std::chrono::milliseconds(absl::GetFlag(FLAGS_health_timeout_ms));
  ro.unhealthy_after = absl::GetFlag(FLAGS_unhealthy_after);
  if (absl::Status st = CheckFlags(ro); !st.ok()) return Fail(st);
  absl::StatusOr<HostPort> http_at = ParseHostPort("http_listen", absl::GetFlag(FLAGS_http_listen));
  if (!http_at.ok()) return Fail(http_at.status());
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials = SetUpGrpcTlsFromFlags();
  if (!credentials.ok()) return Fail(credentials.status());
  absl::StatusOr<ApiKeys> keys =
      ApiKeys::Load(absl::GetFlag(FLAGS_api_key), absl::GetFlag(FLAGS_api_key_file));
  if (!keys.ok()) return Fail(keys.status());

  absl::StatusOr<std::string> model_path = ResolveModel(absl::GetFlag(FLAGS_model));
  if (!model_path.ok()) return Fail(model_path.status());
  absl::StatusOr<std::unique_ptr<ServedModel>> model = LoadServedModel(
      *model_path,
      ServedModelName(absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_served_model_name)),
      absl::GetFlag(FLAGS_chat_template));
  if (!model.ok()) return Fail(absl::InternalError(model.status().ToString()));
  ro.model_sha256 = (*model)->identity.sha256;
  if (const int64_t len = absl::GetFlag(FLAGS_max_model_len); len != 0) {
    const int64_t context = (*model)->identity.context_length;
    if (len < 2 || (context > 0 && len > context)) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("--max_model_len must be between 2 and the model's context length (",
                       context, "), not ", len)));
    }
    (*model)->max_model_len = len;
  }

  metrics::Registry registry;
  SchedulerMetrics scheduler_metrics(registry);
  WorkerRegistry workers(ro);
  DispatcherOptions dopt;
  dopt.max_inflight = absl::GetFlag(FLAGS_max_inflight);
  dopt.max_queue = absl::GetFlag(FLAGS_max_queue);
  dopt.direct_prefill_tokens = absl::GetFlag(FLAGS_direct_prefill_tokens);
  dopt.default_pop = absl::GetFlag(FLAGS_pop);
  dopt.draft_timeout = std::chrono::milliseconds(absl::GetFlag(FLAGS_draft_timeout_ms));
  dopt.methods.speckv_lookahead = absl::GetFlag(FLAGS_speckv_lookahead);
  dopt.migration_limit = absl::GetFlag(FLAGS_migration_limit);
  Dispatcher dispatcher(workers, &scheduler_metrics, dopt);
  scheduler_metrics.AddGauges(
      [&] { return dispatcher.running(); }, [&] { return dispatcher.waiting(); },
      [&](int role) {
        return static_cast<double>(workers.Healthy(static_cast<v1::Role>(role)).size());
      });
  workers.Start();

  HttpApi api(HttpApiConfig{model->get(), &dispatcher, &registry, &*keys,
                            absl::GetFlag(FLAGS_api_threads)});
  registry.AddCallbackGauge("tripod:http_requests_preparing",
                            "API requests being parsed, tokenized and submitted, or waiting for a "
                            "thread to do so",
                            {{"role", "scheduler"}}, [&api] { return api.preparing(); });
  http::HttpServerOptions hopt;
  hopt.io_threads = absl::GetFlag(FLAGS_io_threads);
  hopt.max_connections_per_client = absl::GetFlag(FLAGS_max_connections_per_client);
  const std::string tls_cert = absl::GetFlag(FLAGS_http_tls_cert);
  const std::string tls_key = absl::GetFlag(FLAGS_http_tls_key);
  if (tls_cert.empty() != tls_key.empty()) {
    return Fail(absl::InvalidArgumentError("HTTPS needs both --http_tls_cert and --http_tls_key"));
  }
  if (!tls_cert.empty()) hopt.tls = http::HttpTlsFiles{tls_cert, tls_key};
  absl::StatusOr<std::unique_ptr<http::HttpServer>> http = http::HttpServer::Start(
      http_at->host, http_at->port,
      [&api](std::shared_ptr<http::HttpExchange> ex) { api.Handle(std::move(ex)); }, hopt);
  if (!http.ok()) return Fail(http.status());
  registry.AddCallbackGauge("tripod:http_open_connections", "Open HTTP connections",
                            {{"role", "scheduler"}},
                            [h = http->get()] { return h->open_connections(); });

  CompletionService completion(model->get(), &dispatcher, &*keys);
  grpc::ServerBuilder builder;
  int grpc_port = 0;
  builder.AddListeningPort(absl::GetFlag(FLAGS_listen), *credentials, &grpc_port);
  builder.RegisterService(&completion);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || grpc_port == 0) {
    return Fail(absl::UnavailableError("cannot listen on " + absl::GetFlag(FLAGS_listen)));
  }
  const int http_port = (*http)->port();
  if (const std::string pf = absl::GetFlag(FLAGS_port_file); !pf.empty()) {
    if (absl::Status st = WritePortFile(pf, grpc_port, http_port); !st.ok()) {
      server->Shutdown();
      return Fail(st);
    }
  }
  spdlog::info(
      "tripod-scheduler: HTTP on port {}, gRPC on port {}; model '{}' (context {}); {} prefill "
      "and {} decode workers in routing",
      http_port, grpc_port, (*model)->name, (*model)->max_model_len,
      workers.Healthy(v1::ROLE_PREFILL).size(), workers.Healthy(v1::ROLE_DECODE).size());

  while (!WaitStopSignal(signals, absl::Hours(1))) {
  }
  spdlog::info("tripod-scheduler: draining ({} running, {} waiting, grace {} ms)",
               dispatcher.running(), dispatcher.waiting(), absl::GetFlag(FLAGS_grace_ms));
  dispatcher.StartDraining();
  const absl::Time until = absl::Now() + absl::Milliseconds(absl::GetFlag(FLAGS_grace_ms));
  while (!dispatcher.WaitIdle(std::chrono::milliseconds(20)) && absl::Now() < until) {
    if (WaitStopSignal(signals, absl::ZeroDuration())) {
      spdlog::info("tripod-scheduler: second signal, cutting the grace period short");
      break;
    }
  }
  dispatcher.Shutdown(std::chrono::milliseconds(5000));
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server->Wait();
  (*http)->Stop();
  workers.Stop();
  spdlog::info("tripod-scheduler: stopped");
  return 0;
}

}  // namespace
}  // namespace tripod::scheduler

int main(int argc, char** argv) {
  const sigset_t signals = tripod::BlockStopSignals();  // before any thread starts
  absl::SetProgramUsageMessage(
      "tripod-scheduler --decode host:port[,...] [--prefill host:port[,...]] [flags]: the "
      "OpenAI-compatible API and tripod.v1.Completion, routing requests through the workers");
  std::vector<std::string> normalized(argv, argv + argc);
  std::vector<char*> args(argc);
  for (int i = 0; i < argc; ++i) {
    std::string& a = normalized[i];
    if (i > 0 && a.size() > 2 && a[0] == '-' && a[1] == '-') {
      const size_t end = std::min(a.find('='), a.size());
      for (size_t j = 2; j < end; ++j) {
        if (a[j] == '-') a[j] = '_';
      }
    }
    args[i] = a.data();
  }
  std::vector<char*> rest = absl::ParseCommandLine(argc, args.data());
  if (rest.size() > 1) {
    std::fprintf(stderr, "tripod-scheduler: unexpected argument '%s' (flags only; see --help)\n",
                 rest[1]);
    return 2;
  }
  return tripod::scheduler::Run(signals);
}
