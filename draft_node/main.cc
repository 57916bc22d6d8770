// tripod-draft: the draft worker. Serves tripod.v1.Draft on gRPC (--listen) and GET /health and
// /metrics on HTTP (--http_listen): each Score runs the draft over the prompt and answers with
// its importance map. Writes {"grpc_port":N,"http_port":M} to --port_file once both listen.
// SIGTERM/SIGINT: stop accepting, let requests finish within --grace_ms, exit 0.

#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "common/metrics/http_endpoint.h"
#include "common/metrics/metrics.h"
#include "common/model/model_resolver.h"
#include "common/rpc/engine_flags.h"
#include "common/rpc/model_identity.h"
#include "common/rpc/worker_process.h"
#include "common/rpc/worker_server.h"
#include "common/util/status_macros.h"
#include "common/util/thread_pool.h"
#include "draft_node/draft_engine.h"
#include "draft_node/draft_metrics.h"
#include "draft_node/draft_service.h"
#include "draft_node/draft_worker.h"
#include "grpcpp/grpcpp.h"
#include "spdlog/spdlog.h"

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
ABSL_FLAG(int, chunk, 512, "prompt tokens per forward pass");
ABSL_FLAG(int, context, 0, "prompt + lookahead tokens at most (0: the model's context length)");
ABSL_FLAG(int, max_queue, 64, "requests waiting at most; more are refused (RESOURCE_EXHAUSTED)");

namespace tripod {

const ProcessInfo kThisProcess{
    .name = "tripod-draft",
    .usage = "tripod-draft [flags]: the draft worker (tripod.v1.Draft; /health, /metrics on HTTP)"};

absl::Status ServeThisProcess(WorkerProcess& process) {
  const int max_queue = absl::GetFlag(FLAGS_max_queue);
  if (max_queue < 1) return absl::InvalidArgumentError("--max_queue must be at least 1");
  if (absl::GetFlag(FLAGS_context) < 0) {
    return absl::InvalidArgumentError("--context must not be negative");
  }
  ASSIGN_OR_RETURN(const EngineFlags flags, SetUpEngineFlags());
  DraftEngineOptions o;
  ASSIGN_OR_RETURN(o.model_path, process.ModelPath());
  o.self_draft_layers = absl::GetFlag(FLAGS_draft_layers);
  ASSIGN_OR_RETURN(o.lookahead_layers, ParseLookaheadLayers(absl::GetFlag(FLAGS_lookahead_layers)));
  if (!absl::GetFlag(FLAGS_target_model).empty()) {
    ASSIGN_OR_RETURN(o.target_model_path, ResolveModel(absl::GetFlag(FLAGS_target_model)));
  }
  o.backend = flags.backend;
  o.precision = flags.precision;
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
  spdlog::info("model {}, {} of {} layers ({} for lookahead), {} threads, chunk {}",
               identity.file_name, engine->depth(), engine->model().config.n_layers,
               engine->lookahead_depth(), ComputeThreads(), o.prefill_chunk);

  metrics::Registry registry;
  DraftMetrics metrics(registry);
  DraftWorker worker(*engine, &metrics, max_queue);
  metrics.AddQueueGauges([&] { return worker.queued(); }, [&] { return worker.running(); },
                         [&] { return worker.draining(); });
  DraftService service(worker, &metrics, model, target);

  return process.ServeWorker(
      service, &registry, [&] { return service.HealthNow(); }, worker.drainable());
}

}  // namespace tripod
