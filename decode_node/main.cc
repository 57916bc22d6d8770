// tripod-decode: the decode worker process. A DecodeEngine (its own compute thread), the
// tripod.v1.Decode service on gRPC, and GET /health and /metrics on an HTTP port beside it.
// SIGTERM / SIGINT drain it: new work is refused (health says draining), requests in flight get
// --grace_ms to finish, the rest are cancelled, then the server stops and everything is freed
// (exit 0). A second signal cuts the grace period short.
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/kv_transfer/nccl_kv_link.h"
#include "common/compute/session.h"
#include "common/metrics/http_endpoint.h"
#include "common/metrics/metrics.h"
#include "common/model/model_resolver.h"
#include "common/rpc/model_identity.h"
#include "common/rpc/stop_signals.h"
#include "common/rpc/tls_flags.h"
#include "common/rpc/worker_server.h"
#include "common/util/idle_memory_release.h"
#include "common/util/thread_pool.h"
#include "decode_node/decode_engine.h"
#include "decode_node/decode_metrics.h"
#include "decode_node/decode_service.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/resource_quota.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0", "gRPC address host:port (port 0: any free port)");
ABSL_FLAG(std::string, http_listen, "127.0.0.1:0",
          "HTTP address host:port for GET /health and /metrics (port 0: any free port)");
ABSL_FLAG(std::string, port_file, "",
          "once both ports listen, write {\"grpc_port\":N,\"http_port\":M} here (atomically)");
ABSL_FLAG(std::string, model, "",
          "a GGUF file or a model catalogue name (scripts/fetch_model --list); default: the "
          "bundled model");
ABSL_FLAG(std::string, precision, "auto", "fp32 | bf16 | int8 | int16 | auto");
ABSL_FLAG(std::string, backend, "cpu",
          "cpu | cuda (bf16 weights, the paged KV in device memory, f16 by default) | "
          "cpu-guarded-kv (tests: the CPU with its KV out of the host code's reach, as a GPU's)");
ABSL_FLAG(std::string, kv_cache_dtype, "auto", "KV element type: auto | f32 | f16 | bf16 | q8_0");
ABSL_FLAG(int64_t, kv_budget_mb, 512, "KV cache memory in MiB");
ABSL_FLAG(int, block_tokens, 16, "token slots per KV block");
ABSL_FLAG(int, max_running, 128, "sequences in the continuous batch at most");
ABSL_FLAG(int, max_tokens_per_step, 256, "forward rows per step (decode tokens + prompt chunks)");
ABSL_FLAG(int, threads, 0, "compute threads (0: all cores)");
ABSL_FLAG(std::string, kv_links, "nccl,ipc",
          "KV links (device-to-device payloads, Decode.OpenKvLink) this worker takes, "
          "comma-separated: nccl (with --backend cuda, in a build with NCCL) | ipc (a prefill "
          "worker on this worker's device: a shared buffer, in NCCL's place) | tcp (tests: the "
          "same protocol over TCP, for a KV out of the host's reach without a GPU) | none");
ABSL_FLAG(int64_t, lease_ms, 30000,
          "default lease of a KV reservation: freed unless adopted by then (Reserve may ask for "
          "another)");
ABSL_FLAG(int64_t, grace_ms, 10000,
          "on SIGTERM/SIGINT, how long requests in flight may take to finish before they are "
          "cancelled");

namespace tripod {
namespace {

absl::Status CheckFlags() {
  if (absl::GetFlag(FLAGS_kv_budget_mb) <= 0) {
    return absl::InvalidArgumentError("--kv_budget_mb must be > 0");
  }
  if (absl::GetFlag(FLAGS_lease_ms) <= 0) {
    return absl::InvalidArgumentError("--lease_ms must be > 0");
  }
  if (absl::GetFlag(FLAGS_grace_ms) < 0) {
    return absl::InvalidArgumentError("--grace_ms must be >= 0");
  }
  if (absl::GetFlag(FLAGS_threads) < 0) {
    return absl::InvalidArgumentError("--threads must be >= 0");
  }
  return absl::OkStatus();
}

int Run(const sigset_t& signals) {
  if (absl::Status st = CheckFlags(); !st.ok()) {
    std::fprintf(stderr, "tripod-decode: %s\n", std::string(st.message()).c_str());
    return 2;
  }
  absl::StatusOr<HostPort> http_at = ParseHostPort("http_listen", absl::GetFlag(FLAGS_http_listen));
  absl::StatusOr<HostPort> grpc_at = ParseHostPort("listen", absl::GetFlag(FLAGS_listen));
  for (const auto* hp : {&http_at, &grpc_at}) {
    if (!hp->ok()) {
      std::fprintf(stderr, "tripod-decode: %s\n", std::string(hp->status().message()).c_str());
      return 2;
    }
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials = SetUpGrpcTlsFromFlags();
  if (!credentials.ok()) {
    std::fprintf(stderr, "tripod-decode: %s\n",
                 std::string(credentials.status().message()).c_str());
    return 2;
  }
  if (absl::GetFlag(FLAGS_threads) > 0) SetComputeThreads(absl::GetFlag(FLAGS_threads));

  DecodeEngineOptions eo;
  if (absl::StatusOr<std::string> model = ResolveModel(absl::GetFlag(FLAGS_model)); model.ok()) {
    eo.model_path = *model;
  } else {
    std::fprintf(stderr, "tripod-decode: %s\n", model.status().ToString().c_str());
    return 1;
  }
  eo.precision = absl::GetFlag(FLAGS_precision);
  eo.backend = absl::GetFlag(FLAGS_backend);
  eo.kv_cache_dtype = absl::GetFlag(FLAGS_kv_cache_dtype);
  eo.kv_budget_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_kv_budget_mb)) << 20;
  eo.block_tokens = absl::GetFlag(FLAGS_block_tokens);
  eo.max_running = absl::GetFlag(FLAGS_max_running);
  eo.max_tokens_per_step = absl::GetFlag(FLAGS_max_tokens_per_step);
  absl::StatusOr<ModelIdentityInfo> identity = ComputeModelIdentity(eo.model_path);
  if (!identity.ok()) {
    std::fprintf(stderr, "tripod-decode: %s\n", identity.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<std::unique_ptr<DecodeEngine>> engine_or = DecodeEngine::Create(eo);
  if (!engine_or.ok()) {
    std::fprintf(stderr, "tripod-decode: %s\n", engine_or.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<DecodeEngine> engine = *std::move(engine_or);
  engine->Start();

  metrics::Registry registry;
  DecodeMetrics decode_metrics(registry);
  v1::ModelIdentity model;
  ToWire(*identity, &model);
  DecodeServiceOptions so;
  so.transfers.default_lease = absl::Milliseconds(absl::GetFlag(FLAGS_lease_ms));
  so.transfers.max_lease = std::max(so.transfers.max_lease, so.transfers.default_lease);
  for (absl::string_view kind : absl::StrSplit(absl::GetFlag(FLAGS_kv_links), ',')) {
    if (kind == "nccl") {
      so.links.nccl = eo.backend == "cuda" && NcclLinksBuilt();
    } else if (kind == "tcp") {
      so.links.tcp = true;
    } else if (kind == "ipc") {
      so.links.ipc = true;
    } else if (kind != "none" && !kind.empty()) {
      std::fprintf(stderr,
                   "tripod-decode: --kv_links: unknown kind '%s' (nccl | ipc | tcp | none)\n",
                   std::string(kind).c_str());
      return 2;
    }
  }
  // A TCP link listens where the gRPC server does.
  if (const std::string listen = absl::GetFlag(FLAGS_listen);
      listen.rfind(':') != std::string::npos) {
    so.links.tcp_host = listen.substr(0, listen.rfind(':'));
    if (so.links.tcp_host.size() > 2 && so.links.tcp_host.front() == '[') {
      so.links.tcp_host = so.links.tcp_host.substr(1, so.links.tcp_host.size() - 2);
    }
  }
  auto service = std::make_unique<DecodeService>(*engine, decode_metrics, model, so);
  DecodeService* svc = service.get();
  decode_metrics.AddGauges(*engine, service->transfers(), [svc] { return svc->draining(); });

  grpc::ServerBuilder builder;
  int grpc_port = 0;
  builder.AddListeningPort(absl::GetFlag(FLAGS_listen), *credentials, &grpc_port);
  builder.RegisterService(service.get());
  ConfigureWorkerServer(builder);
  // The synchronous methods' threads: a PushKv stream holds one for its transfer (Generate,
  // Cancel and Health are callbacks and hold none).
  grpc::ResourceQuota quota("tripod-decode");
  quota.SetMaxThreads(std::max(256, 4 * eo.max_running + 64));
  builder.SetResourceQuota(quota);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || grpc_port == 0) {
    std::fprintf(stderr, "tripod-decode: cannot listen on %s\n",
                 absl::GetFlag(FLAGS_listen).c_str());
    return 1;
  }

  absl::StatusOr<std::unique_ptr<metrics::HttpEndpoint>> http =
      metrics::HttpEndpoint::Start(http_at->host, http_at->port, &registry, [svc] {
        metrics::HealthReport r;
        r.ready = !svc->draining();
        r.json = HealthJson(svc->HealthNow());
        return r;
      });
  if (!http.ok()) {
    std::fprintf(stderr, "tripod-decode: %s\n", http.status().ToString().c_str());
    server->Shutdown();
    return 1;
  }
  const int http_port = (*http)->port();
  if (const std::string pf = absl::GetFlag(FLAGS_port_file); !pf.empty()) {
    if (absl::Status st = WritePortFile(pf, grpc_port, http_port); !st.ok()) {
      std::fprintf(stderr, "tripod-decode: %s\n", st.ToString().c_str());
      server->Shutdown();
      return 1;
    }
  }
  const DecodeEngineStats st0 = engine->stats();
  spdlog::info(
      "tripod-decode: gRPC on port {}, HTTP on port {}; model {} ({}), {}, precision {}, {} KV "
      "blocks of {} tokens, lease {} ms",
      grpc_port, http_port, identity->file_name, engine->plan().DebugString(),
      engine->backend_name(), eo.precision, st0.total_blocks, eo.block_tokens,
      absl::GetFlag(FLAGS_lease_ms));

  // Once a second: after a spell of work, an idle worker gives freed heap back to the kernel.
  IdleMemoryRelease release;
  while (!WaitStopSignal(signals, absl::Seconds(1))) {
    const DecodeEngineStats st = engine->stats();
    const uint64_t activity = static_cast<uint64_t>(st.steps + st.finished + st.reservations);
    release.Observe(activity, st.running == 0 && st.waiting == 0 && st.reservations == 0 &&
                                  service->in_flight() == 0);
  }
  const absl::Duration grace = absl::Milliseconds(absl::GetFlag(FLAGS_grace_ms));
  spdlog::info("tripod-decode: draining ({} in flight, grace {} ms)", service->in_flight(),
               absl::GetFlag(FLAGS_grace_ms));
  service->StartDraining();
  const absl::Time until = absl::Now() + grace;
  while (service->in_flight() > 0 && absl::Now() < until) {
    if (WaitStopSignal(signals, std::min(absl::Milliseconds(20), until - absl::Now()))) {
      spdlog::info("tripod-decode: second signal, cutting the grace period short");
      break;
    }
  }
  if (service->in_flight() > 0) {
    spdlog::info("tripod-decode: cancelling {} still in flight", service->in_flight());
  }
  service->CancelAll("the worker is shutting down");
  // Calls still open after the deadline are cancelled (their requests with them).
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  server->Wait();
  (*http)->Stop();
  engine->Stop();
  server.reset();
  service.reset();
  engine.reset();
  spdlog::info("tripod-decode: stopped");
  return 0;
}

}  // namespace
}  // namespace tripod

int main(int argc, char** argv) {
  const sigset_t signals = tripod::BlockStopSignals();  // before any thread starts

  absl::SetProgramUsageMessage(
      "tripod-decode [flags]: the decode worker (tripod.v1.Decode on gRPC, /health and /metrics "
      "on HTTP)");
  // Flag names with dashes (--kv-budget-mb) mean the abseil flag with underscores.
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
    std::fprintf(stderr, "tripod-decode: unexpected argument '%s' (flags only; see --help)\n",
                 rest[1]);
    return 2;
  }
  return tripod::Run(signals);
}
