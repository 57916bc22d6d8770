// tripod-prefill: the POP prefill worker. Serves tripod.v1.Prefill on gRPC (--listen) and GET
// /health and /metrics on HTTP (--http_listen); prefills each request's prompt on the engine
// thread and streams its KV, layer by layer, to the decode worker the request names. Writes
// {"grpc_port":N,"http_port":M} to --port_file once both listen. SIGTERM/SIGINT: stop accepting,
// let requests finish within --grace_ms, cancel the rest, exit 0.

#include <map>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/compute/session.h"
#include "common/kv_transfer/kv_link_cache.h"
#include "common/kv_transfer/nccl_kv_link.h"
#include "common/kv_transfer/transfer_faults.h"
#include "common/metrics/http_endpoint.h"
#include "common/metrics/metrics.h"
#include "common/rpc/engine_flags.h"
#include "common/rpc/model_identity.h"
#include "common/rpc/worker_process.h"
#include "common/rpc/worker_server.h"
#include "common/util/status_macros.h"
#include "common/util/thread_pool.h"
#include "grpcpp/grpcpp.h"
#include "prefill_node/prefill_engine.h"
#include "prefill_node/prefill_service.h"
#include "prefill_node/prefill_worker.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, pop_ratio, "0",
          "POP pruning ratio of the plan loaded, e.g. 1/3 (0: full weights, any request's plan)");
ABSL_FLAG(std::string, pop_layers, "",
          "skipped layers instead of a ratio, e.g. 20-29 or 3,7 (none: skip nothing)");
ABSL_FLAG(int, chunk, tripod::PrefillOptions{}.chunk, "prompt tokens per forward pass");
ABSL_FLAG(int, max_queue, 64, "requests waiting at most; more are refused (RESOURCE_EXHAUSTED)");
ABSL_FLAG(int, ack_timeout_ms, 30000,
          "how long a KV transfer waits for the decode side's acknowledgement of its end");
ABSL_FLAG(int, send_stall_ms, 10000,
          "a KV push that finds the send buffer full waits at most this long for the decode "
          "worker to take some (a paused decode worker then fails its transfer, and the "
          "scheduler moves the request, rather than holding this worker's engine)");
ABSL_FLAG(int, send_buffer_mb, 64,
          "encoded KV waiting for the network per transfer, at most (the forward then waits)");
ABSL_FLAG(std::string, kv_link, "auto",
          "where KV payloads travel: auto (a link, GPU to GPU, when this worker and the decode "
          "worker keep their KV on GPUs: NCCL, or IPC when they share one GPU; else in the "
          "PushKv messages) | none | nccl | ipc (one device only) | tcp (tests: the link's "
          "protocol over TCP, for a KV out of the host's reach without a GPU)");
ABSL_FLAG(int, kv_link_timeout_ms, 10000,
          "a KV link's set-up, and one payload on it, at most; a decode worker that offers no "
          "link, or whose link fails (the transfer then fails and the scheduler retries it), is "
          "not asked again for a minute, doubled after each failure in a row up to 64 minutes");
ABSL_FLAG(std::string, inject_transfer_faults, "",
          "TESTING ONLY: drop, corrupt or delay KV chunks on their way to the decode worker, "
          "e.g. drop=0.02,corrupt=0.02,delay=0.05,delay_ms=300,seed=1 (tests/chaos/)");

namespace tripod {
namespace {

constexpr ProcessInfo kProcess{
    .name = "tripod-prefill",
    .usage =
        "tripod-prefill: the POP prefill worker (tripod.v1.Prefill on gRPC, /health and "
        "/metrics on HTTP)"};

absl::StatusOr<PrefillOptions> EngineOptions(const WorkerProcess& process) {
  PrefillOptions o;
  ASSIGN_OR_RETURN(o.model_path, process.ModelPath());
  ASSIGN_OR_RETURN(const EngineFlags engine, SetUpEngineFlags());
  o.precision = engine.precision;
  o.backend = engine.backend;
  o.chunk = absl::GetFlag(FLAGS_chunk);
  if (o.chunk <= 0) return absl::InvalidArgumentError("--chunk must be positive");
  std::string ratio = absl::GetFlag(FLAGS_pop_ratio);
  const std::string layers = absl::GetFlag(FLAGS_pop_layers);
  if (!layers.empty()) {
    // --pop_ratio's default gives way to an explicit layer list; a ratio given too is an error.
    if (ratio != "0") {
      return absl::InvalidArgumentError("give --pop_ratio or --pop_layers, not both");
    }
    ratio.clear();
  }
  ASSIGN_OR_RETURN(o.pop, ParsePopConfig(ratio, layers));
  return o;
}

absl::Status Serve(WorkerProcess& process) {
  const int max_queue = absl::GetFlag(FLAGS_max_queue);
  if (max_queue < 1) return absl::InvalidArgumentError("--max_queue must be at least 1");
  if (absl::GetFlag(FLAGS_ack_timeout_ms) <= 0 || absl::GetFlag(FLAGS_send_buffer_mb) <= 0 ||
      absl::GetFlag(FLAGS_send_stall_ms) <= 0) {
    return absl::InvalidArgumentError(
        "--ack_timeout_ms, --send_stall_ms and --send_buffer_mb must be positive");
  }
  ASSIGN_OR_RETURN(const TransferFaultRates faults,
                   ParseTransferFaults(absl::GetFlag(FLAGS_inject_transfer_faults)));
  ASSIGN_OR_RETURN(PrefillOptions options, EngineOptions(process));

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
  wo.max_queue = max_queue;
  wo.transfer.ack_timeout = std::chrono::milliseconds(absl::GetFlag(FLAGS_ack_timeout_ms));
  wo.transfer.stall_timeout = std::chrono::milliseconds(absl::GetFlag(FLAGS_send_stall_ms));
  wo.transfer.max_queued_bytes = size_t{1} * absl::GetFlag(FLAGS_send_buffer_mb) << 20;
  if (faults.any()) {
    wo.transfer.faults = std::make_shared<TransferFaultInjector>(faults);
    spdlog::warn(
        "TESTING ONLY: injecting KV transfer faults per chunk: drop {}, corrupt {}, "
        "delay {} ({} ms)",
        faults.drop, faults.corrupt, faults.delay, faults.delay_ms);
    for (ChunkFault f : {ChunkFault::kDrop, ChunkFault::kCorrupt, ChunkFault::kDelay}) {
      registry.AddCallbackGauge(
          "tripod:kv_transfer_faults_injected",
          "KV chunks dropped, corrupted or delayed on purpose",
          {{"role", "prefill"}, {"kind", ChunkFaultName(f)}},
          [injector = wo.transfer.faults, f] { return static_cast<double>(injector->count(f)); });
    }
  }
  ASSIGN_OR_RETURN(const KvLinkMode link_mode, ParseKvLinkMode(absl::GetFlag(FLAGS_kv_link)));
  const std::optional<KvMemory> kv_memory = engine->backend().DeviceKvMemory();
  const bool nccl = options.backend == "cuda" && NcclLinksBuilt();
  if (link_mode == KvLinkMode::kNccl && !nccl) {
    return absl::InvalidArgumentError("--kv_link=nccl needs --backend cuda and a build with NCCL");
  }
  if (link_mode == KvLinkMode::kTcp && (!kv_memory || !kv_memory->gather_rows)) {
    return absl::InvalidArgumentError(
        "--kv_link=tcp needs a KV out of the host's memory (--backend cuda or cpu-guarded-kv)");
  }
  if (link_mode == KvLinkMode::kIpc && (!kv_memory || !kv_memory->open_shared)) {
    return absl::InvalidArgumentError(
        "--kv_link=ipc needs a KV memory other processes share (--backend cuda or "
        "cpu-guarded-kv)");
  }
  if (absl::GetFlag(FLAGS_kv_link_timeout_ms) <= 0) {
    return absl::InvalidArgumentError("--kv_link_timeout_ms must be positive");
  }
  KvLinkCacheOptions lo;
  lo.mode = link_mode;
  lo.nccl = nccl;
  lo.gpu = options.backend == "cuda";
  lo.open_timeout = lo.io_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_kv_link_timeout_ms));
  metrics::Counter& fallbacks = registry.AddCounter(
      "tripod:kv_link_fallbacks_total",
      "KV transfers that could have taken a KV link (device to device) and sent their payloads "
      "in the PushKv messages: the decode worker offered none, or the link failed",
      {{"role", "prefill"}});
  std::map<std::string, metrics::Counter*> on_link;
  for (const char* kind : {"nccl", "ipc", "tcp"}) {
    on_link[kind] = &registry.AddCounter("tripod:kv_link_transfers_total",
                                         "KV transfers whose payloads took a KV link",
                                         {{"role", "prefill"}, {"kind", kind}});
  }
  wo.transfer.links = std::make_shared<KvLinkCache>(
      lo, kv_memory ? &*kv_memory : nullptr, engine->kv_dtype(),
      [&on_link](const char* kind) {
        if (auto it = on_link.find(kind); it != on_link.end()) it->second->Inc();
      },
      [&fallbacks](const std::string&) { fallbacks.Inc(); });
  wo.transfer.link_timeout = lo.io_timeout;
  PrefillWorker worker(*engine, &registry, wo);
  PrefillService service(worker, model);

  // Queued and running requests get the grace period, then are cancelled; new ones are refused
  // (UNAVAILABLE) from the first signal.
  return process.ServeWorker(
      service, &registry, [&] { return service.HealthNow(); }, worker.queue());
}

}  // namespace
}  // namespace tripod

int main(int argc, char** argv) {
  return tripod::RunProcess(tripod::kProcess, argc, argv, tripod::Serve);
}
