// tripod-decode: the decode worker process. A DecodeEngine (its own compute thread), the
// tripod.v1.Decode service on gRPC, and GET /health and /metrics on an HTTP port beside it.
// SIGTERM / SIGINT drain it: new work is refused (health says draining), requests in flight get
// --grace_ms to finish, the rest are cancelled, then the server stops and everything is freed
// (exit 0). A second signal cuts the grace period short.

#include <algorithm>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/compute/session.h"
#include "common/kv_transfer/kv_links.h"
#include "common/metrics/http_endpoint.h"
#include "common/metrics/metrics.h"
#include "common/rpc/engine_flags.h"
#include "common/rpc/model_identity.h"
#include "common/rpc/worker_process.h"
#include "common/rpc/worker_server.h"
#include "common/util/idle_memory_release.h"
#include "common/util/status_macros.h"
#include "decode_node/decode_engine.h"
#include "decode_node/decode_metrics.h"
#include "decode_node/decode_service.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/resource_quota.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, kv_cache_dtype, "auto", "KV element type: auto | f32 | f16 | bf16 | q8_0");
ABSL_FLAG(int64_t, kv_budget_mb, 512, "KV cache memory in MiB");
ABSL_FLAG(int, block_tokens, 16, "token slots per KV block");
ABSL_FLAG(int, max_running, 128, "sequences in the continuous batch at most");
ABSL_FLAG(int, max_tokens_per_step, 256, "forward rows per step (decode tokens + prompt chunks)");
ABSL_FLAG(std::string, kv_links, "nccl,ipc",
          "KV links (device-to-device payloads, Decode.OpenKvLink) this worker takes, "
          "comma-separated: nccl (with --backend cuda, in a build with NCCL) | ipc (a prefill "
          "worker on this worker's device: a shared buffer, in NCCL's place) | tcp (tests: the "
          "same protocol over TCP, for a KV out of the host's reach without a GPU) | none");
ABSL_FLAG(int64_t, lease_ms, 30000,
          "default lease of a KV reservation: freed unless adopted by then (Reserve may ask for "
          "another)");

namespace tripod {
namespace {

constexpr ProcessInfo kProcess{
    .name = "tripod-decode",
    .usage =
        "tripod-decode [flags]: the decode worker (tripod.v1.Decode on gRPC, /health and "
        "/metrics on HTTP)",
    .invalid_argument_exit = 2};

absl::Status CheckFlags() {
  if (absl::GetFlag(FLAGS_kv_budget_mb) <= 0) {
    return absl::InvalidArgumentError("--kv_budget_mb must be > 0");
  }
  if (absl::GetFlag(FLAGS_lease_ms) <= 0) {
    return absl::InvalidArgumentError("--lease_ms must be > 0");
  }
  return absl::OkStatus();
}

absl::Status Serve(WorkerProcess& process) {
  RETURN_IF_ERROR(CheckFlags());
  ASSIGN_OR_RETURN(const EngineFlags flags, SetUpEngineFlags());
  DecodeEngineOptions eo;
  ASSIGN_OR_RETURN(eo.model_path, process.ModelPath());
  eo.precision = flags.precision;
  eo.backend = flags.backend;
  eo.kv_cache_dtype = absl::GetFlag(FLAGS_kv_cache_dtype);
  eo.kv_budget_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_kv_budget_mb)) << 20;
  eo.block_tokens = absl::GetFlag(FLAGS_block_tokens);
  eo.max_running = absl::GetFlag(FLAGS_max_running);
  eo.max_tokens_per_step = absl::GetFlag(FLAGS_max_tokens_per_step);
  DecodeServiceOptions so;
  so.transfers.default_lease = absl::Milliseconds(absl::GetFlag(FLAGS_lease_ms));
  so.transfers.max_lease = std::max(so.transfers.max_lease, so.transfers.default_lease);
  // TCP links listen where the gRPC server does.
  ASSIGN_OR_RETURN(so.links, ParseKvLinks(absl::GetFlag(FLAGS_kv_links), eo.backend,
                                          ParseHostPort("listen", process.listen())->host));
  ASSIGN_OR_RETURN(const ModelIdentityInfo identity, ComputeModelIdentity(eo.model_path));
  ASSIGN_OR_RETURN(std::unique_ptr<DecodeEngine> engine, DecodeEngine::Create(eo));
  engine->Start();

  metrics::Registry registry;
  DecodeMetrics decode_metrics(registry);
  v1::ModelIdentity model;
  ToWire(identity, &model);
  DecodeService service(*engine, decode_metrics, model, so);
  decode_metrics.AddGauges(*engine, service.transfers(), [&] { return service.draining(); });
  GrpcServerOptions go;
  // The synchronous methods' threads: a PushKv stream holds one for its transfer (Generate,
  // Cancel and Health are callbacks and hold none).
  go.configure = [&](grpc::ServerBuilder& builder) {
    grpc::ResourceQuota quota("tripod-decode");
    quota.SetMaxThreads(std::max(256, 4 * eo.max_running + 64));
    builder.SetResourceQuota(quota);
  };
  spdlog::info("model {} ({}), {}, precision {}, {} KV blocks of {} tokens, lease {} ms",
               identity.file_name, engine->plan().DebugString(), engine->backend_name(),
               eo.precision, engine->stats().total_blocks, eo.block_tokens,
               absl::GetFlag(FLAGS_lease_ms));

  ServeOptions serve;
  // Once a second: after a spell of work, an idle worker gives freed heap back to the kernel.
  IdleMemoryRelease release;
  serve.tick_every = absl::Seconds(1);
  serve.tick = [&] {
    const DecodeEngineStats st = engine->stats();
    release.Observe(
        static_cast<uint64_t>(st.steps + st.finished + st.reservations),
        st.running == 0 && st.waiting == 0 && st.reservations == 0 && service.in_flight() == 0);
  };
  serve.server_shutdown = absl::Seconds(5);
  DrainableFunctions work([&] { service.StartDraining(); }, [&] { return service.in_flight(); },
                          [&] { service.CancelAll("the worker is shutting down"); });
  RETURN_IF_ERROR(process.ServeWorker(
      service, &registry, [&] { return service.HealthNow(); }, work, go, serve));
  engine->Stop();
  return absl::OkStatus();
}

}  // namespace
}  // namespace tripod

int main(int argc, char** argv) {
  return tripod::RunProcess(tripod::kProcess, argc, argv, tripod::Serve);
}
