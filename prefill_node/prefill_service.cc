// PrefillService; see prefill_service.h.
#include "prefill_node/prefill_service.h"

#include <chrono>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/compute/pop_control.h"
#include "common/kv_transfer/kv_chunk_codec.h"
#include "common/rpc/protocol.h"
#include "common/util/status_macros.h"
#include "spdlog/spdlog.h"

namespace tripod {

absl::StatusOr<TrimPolicy> TrimPolicyFromWire(const v1::Trimming& t) {
  TrimPolicy p;
  switch (t.method()) {
    case v1::TRIM_NONE:
      return p;
    case v1::TRIM_SPECKV:
      p.method = TrimMethod::kSpecKv;
      break;
    case v1::TRIM_SNAPKV:
      p.method = TrimMethod::kSnapKv;
      break;
    case v1::TRIM_STREAMINGLLM:
      p.method = TrimMethod::kStreamingLlm;
      break;
    case v1::TRIM_DRAFTMAP:
      p.method = TrimMethod::kDraftMap;
      break;
    case v1::TRIM_PYRAMIDKV:
      p.method = TrimMethod::kPyramidKv;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("prefill: unknown trimming method ", static_cast<int>(t.method())));
  }
  if (t.window() < 0 || t.pool_kernel() < 0 || t.sink_tokens() < 0) {
    return absl::InvalidArgumentError(
        "prefill: trimming window, pool_kernel and sink_tokens must not be negative");
  }
  p.budget = t.budget();
  if (t.window() > 0) p.window = t.window();
  if (t.pool_kernel() > 0) p.pool_kernel = t.pool_kernel();
  if (t.sink_tokens() > 0) p.sink_tokens = t.sink_tokens();
  p.lookahead.assign(t.lookahead().begin(), t.lookahead().end());
  p.keep.assign(t.keep().begin(), t.keep().end());
  p.layer_budgets.assign(t.layer_budgets().begin(), t.layer_budgets().end());
  return p;
}

absl::StatusOr<PrefillJob> JobFromRequest(const PrefillEngine& engine,
                                          const v1::PrefillRequest& request) {
  PrefillJob job;
  job.request_id = request.request_id();
  job.prompt.assign(request.prompt().begin(), request.prompt().end());
  RETURN_IF_ERROR(CheckPrompt(engine.model().config, job.prompt));
  if (request.decode_address().empty()) {
    return absl::InvalidArgumentError("prefill: decode_address is missing");
  }
  if (request.transfer_id() == 0) {
    return absl::InvalidArgumentError("prefill: transfer_id is missing (Decode.Reserve gives it)");
  }
  ASSIGN_OR_RETURN(job.trim, TrimPolicyFromWire(request.trimming()));
  RETURN_IF_ERROR(ValidateTrimPolicy(job.trim, static_cast<int>(job.prompt.size()) - 1));
  const int n_layers = engine.model().config.n_layers;
  if (!job.trim.layer_budgets.empty() && job.trim.layer_budgets.size() != size_t(n_layers)) {
    return absl::InvalidArgumentError(absl::StrCat("prefill: ", job.trim.layer_budgets.size(),
                                                   " per-layer budgets for a model of ", n_layers,
                                                   " layers"));
  }
  // Each branch asks for its plan itself: an optional<PopConfig> filled in branches made GCC 12
  // under ASan warn (-Wmaybe-uninitialized) about the vector inside it.
  const v1::PrefillPlan& plan = request.plan();
  if (plan.plan_case() == v1::PrefillPlan::kPopRatio && !plan.pop_ratio().empty()) {
    ASSIGN_OR_RETURN(const PopConfig pop, ParsePopConfig(plan.pop_ratio(), ""));
    ASSIGN_OR_RETURN(job.plan, engine.PlanFor(pop));
  } else if (plan.plan_case() == v1::PrefillPlan::kSkippedLayers) {
    PopConfig pop;
    pop.layers.emplace(plan.skipped_layers().layers().begin(),
                       plan.skipped_layers().layers().end());
    ASSIGN_OR_RETURN(job.plan, engine.PlanFor(pop));
  } else {
    ASSIGN_OR_RETURN(job.plan, engine.PlanFor(std::nullopt));
  }
  if (!plan.variant().empty()) {
    const std::optional<PopVariant> v = ParsePopVariant(plan.variant());
    if (!v.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat("prefill: POP variant '", plan.variant(),
                                                     "' is not pop, noboundary, nokv or shortgpt"));
    }
    if (*v != PopVariant::kPop && job.trim.method != TrimMethod::kNone) {
      return absl::InvalidArgumentError("prefill: a POP control runs on untrimmed KV");
    }
    std::vector<int> skipped;
    for (int l = 0; l < n_layers; ++l) {
      if (job.plan.layers[l] == LayerMode::kKvOnly) skipped.push_back(l);
    }
    job.plan = PopVariantPrefillPlan(n_layers, skipped, *v);
  }
  job.decode_address = request.decode_address();
  job.decode_tls_name = request.decode_tls_name();
  job.transfer_id = request.transfer_id();
  return job;
}

PrefillService::PrefillService(PrefillWorker& worker, v1::ModelIdentity model)
    : worker_(worker), model_(std::move(model)) {}

grpc::Status PrefillService::RunChecked(grpc::ServerContext* context,
                                        const v1::PrefillRequest& request,
                                        v1::PrefillResponse* response, PrefillOutcome* outcome) {
  if (grpc::Status s = CheckProtocol(*context); !s.ok()) return s;
  absl::StatusOr<PrefillJob> job = JobFromRequest(worker_.engine(), request);
  if (!job.ok()) return ToGrpcStatus(job.status());
  job->deadline = context->deadline();
  absl::StatusOr<std::shared_ptr<PrefillTicket>> ticket = worker_.queue().Submit(*std::move(job));
  if (!ticket.ok()) return ToGrpcStatus(ticket.status());
  // Wait on this handler thread; the engine thread does the work. A client that hangs up (or a
  // deadline that passes: gRPC cancels the call) cancels the job.
  while (!(*ticket)->WaitUntil(absl::Now() + poll_)) {
    if (context->IsCancelled()) {
      worker_.queue().Cancel(**ticket);
      const bool late = std::chrono::system_clock::now() >= context->deadline();
      return late ? grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                                 "prefill: the call's deadline passed; request cancelled")
                  : grpc::Status(grpc::StatusCode::CANCELLED,
                                 "prefill: the client cancelled the call; request cancelled");
    }
  }
  *outcome = (*ticket)->outcome();
  if (!outcome->status.ok()) {
    // UNAVAILABLE after the job ran can only be the KV push finding the decode worker gone: the
    // caller must not take it for this worker's own (and stop routing here), so it goes back as
    // ABORTED, the message kept.
    if (absl::IsUnavailable(outcome->status)) {
      return grpc::Status(
          grpc::StatusCode::ABORTED,
          absl::StrCat("the decode worker is unreachable: ", outcome->status.message()));
    }
    return ToGrpcStatus(outcome->status);
  }
  response->set_prefilled_tokens(outcome->prefilled_tokens);
  response->set_plan_key(outcome->plan_key);
  response->set_bytes_sent(outcome->bytes_sent);
  response->set_chunks_sent(outcome->chunks_sent);
  response->set_queue_s(outcome->queue_s);
  response->set_compute_s(outcome->compute_s);
  response->set_transfer_s(outcome->transfer_s);
  response->set_tail_s(outcome->tail_s);
  response->set_total_s(outcome->total_s);
  return grpc::Status::OK;
}

grpc::Status PrefillService::Run(grpc::ServerContext* context, const v1::PrefillRequest* request,
                                 v1::PrefillResponse* response) {
  PrefillOutcome o;
  const grpc::Status s = RunChecked(context, *request, response, &o);
  if (worker_.metrics() != nullptr) worker_.metrics()->RequestDone(FromGrpcStatus(s));
  // One line per request; nothing per chunk.
  spdlog::info(
      "prefill request {} transfer {} -> {}: {} prompt tokens, {}: queue {:.3f}s compute {:.3f}s "
      "transfer {:.3f}s tail {:.3f}s total {:.3f}s, {} bytes in {} chunks",
      request->request_id(), request->transfer_id(), request->decode_address(),
      request->prompt_size(), s.ok() ? "ok" : FromGrpcStatus(s).ToString(), o.queue_s, o.compute_s,
      o.transfer_s, o.tail_s, o.total_s, o.bytes_sent, o.chunks_sent);
  return s;
}

grpc::Status PrefillService::Cancel(grpc::ServerContext* context, const v1::CancelRequest* request,
                                    v1::CancelResponse* response) {
  if (grpc::Status s = CheckProtocol(*context); !s.ok()) return s;
  response->set_found(worker_.queue().Cancel(request->request_id()));
  return grpc::Status::OK;
}

grpc::Status PrefillService::Health(grpc::ServerContext* context, const v1::HealthRequest* request,
                                    v1::HealthResponse* response) {
  if (grpc::Status s = CheckProtocol(*context); !s.ok()) return s;
  *response = HealthNow();
  return grpc::Status::OK;
}

v1::HealthResponse PrefillService::HealthNow() const {
  v1::HealthResponse h;
  h.set_role(v1::ROLE_PREFILL);
  h.set_protocol_version(kProtocolVersion);
  *h.mutable_model() = model_;
  const PrefillEngine& engine = worker_.engine();
  h.set_plan_key(engine.plan().KvKey());
  h.set_plan(engine.plan().DebugString());
  h.set_full_weights(engine.full_weights());
  for (int layer : engine.skipped_layers()) h.add_skipped_layers(layer);
  h.set_kv_dtype(KvDtypeToWire(engine.kv_dtype()));
  const PrefillQueue& queue = worker_.queue();
  h.set_queued(queue.queued());
  h.set_running(queue.running());
  h.set_draining(queue.draining());
  return h;
}

}  // namespace tripod
