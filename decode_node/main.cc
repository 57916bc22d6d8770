// tripod-decode: the decode worker process. A DecodeEngine (its own compute thread), the
// tripod.v1.Decode service on gRPC, and GET /health and /metrics on an HTTP port beside it.
// SIGTERM / SIGINT drain it: new work is refused (health says draining), requests in flight get
// --grace_ms to finish, the rest are cancelled, then the server stops and everything is freed
// (exit 0). A second signal cuts the grace period short.

#include <algorithm>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/compute/session.h"
#include "common/metrics/http_endpoint.h"
#include "common/metrics/metrics.h"
#include "common/rpc/model_identity.h"
#include "common/rpc/worker_process.h"
#include "common/rpc/worker_server.h"
#include "common/util/idle_memory_release.h"
#include "common/util/status_macros.h"
#include "decode_node/decode_engine.h"
#include "decode_node/decode_flags.h"
#include "decode_node/decode_metrics.h"
#include "decode_node/decode_service.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/resource_quota.h"
#include "spdlog/spdlog.h"

namespace tripod {

const ProcessInfo kThisProcess{
    .name = "tripod-decode",
    .usage =
        "tripod-decode [flags]: the decode worker (tripod.v1.Decode on gRPC, /health and "
        "/metrics on HTTP)",
    .invalid_argument_exit = 2};

absl::Status ServeThisProcess(WorkerProcess& process) {
  ASSIGN_OR_RETURN(DecodeFlags f, DecodeFlagsFromCommandLine(process));
  const DecodeEngineOptions& eo = f.engine;
  const DecodeServiceOptions& so = f.service;
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
               absl::ToInt64Milliseconds(so.transfers.default_lease));

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

}  // namespace tripod
