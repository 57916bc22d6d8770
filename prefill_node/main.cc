// tripod-prefill: the POP prefill worker. Serves tripod.v1.Prefill on gRPC (--listen) and GET
// /health and /metrics on HTTP (--http_listen); prefills each request's prompt on the engine
// thread and streams its KV, layer by layer, to the decode worker the request names. Writes
// {"grpc_port":N,"http_port":M} to --port_file once both listen. SIGTERM/SIGINT: stop accepting,
// let requests finish within --grace_ms, cancel the rest, exit 0.

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/compute/session.h"
#include "common/kv_transfer/prefill_transfer_setup.h"
#include "common/metrics/http_endpoint.h"
#include "common/metrics/metrics.h"
#include "common/rpc/model_identity.h"
#include "common/rpc/worker_process.h"
#include "common/rpc/worker_server.h"
#include "common/util/status_macros.h"
#include "common/util/thread_pool.h"
#include "grpcpp/grpcpp.h"
#include "prefill_node/prefill_engine.h"
#include "prefill_node/prefill_flags.h"
#include "prefill_node/prefill_service.h"
#include "prefill_node/prefill_worker.h"
#include "spdlog/spdlog.h"

namespace tripod {

const ProcessInfo kThisProcess{
    .name = "tripod-prefill",
    .usage =
        "tripod-prefill [flags]: the POP prefill worker (tripod.v1.Prefill; /health, /metrics)"};

absl::Status ServeThisProcess(WorkerProcess& process) {
  ASSIGN_OR_RETURN(PrefillFlags f, PrefillFlagsFromCommandLine(process));
  const PrefillOptions& options = f.engine;

  ASSIGN_OR_RETURN(ModelIdentityInfo identity, ComputeModelIdentity(options.model_path));
  v1::ModelIdentity model;
  ToWire(identity, &model);
  ASSIGN_OR_RETURN(std::unique_ptr<PrefillEngine> engine, PrefillEngine::Create(options));
  const ModelConfig& c = engine->model().config;
  spdlog::info("model {} ({}), {}, plan {}, {} threads, chunk {}", identity.file_name,
               engine->backend().name(), DescribeSkipped(engine->skipped_layers(), c.n_layers),
               engine->plan().DebugString(), ComputeThreads(), options.chunk);

  metrics::Registry registry;
  PrefillWorkerOptions wo;
  wo.max_queue = f.max_queue;
  const std::optional<KvMemory> kv_memory = engine->backend().DeviceKvMemory();
  ASSIGN_OR_RETURN(wo.transfer,
                   SetUpPrefillTransfer(f.transfer, kv_memory, engine->kv_dtype(), registry));
  PrefillWorker worker(*engine, &registry, wo);
  PrefillService service(worker, model);

  // Queued and running requests get the grace period, then are cancelled; new ones are refused
  // (UNAVAILABLE) from the first signal.
  return process.ServeWorker(
      service, &registry, [&] { return service.HealthNow(); }, worker.queue());
}

}  // namespace tripod
