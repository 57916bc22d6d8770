#include "draft_node/draft_service.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/rpc/protocol.h"
#include "spdlog/spdlog.h"

namespace tripod {

absl::StatusOr<DraftRequest> DraftRequestFromWire(const v1::ScoreRequest& w) {
  for (const auto& [name, value] : {std::pair<const char*, int>{"budget", w.budget()},
                                    {"window", w.window()},
                                    {"pool_kernel", w.pool_kernel()},
                                    {"neighbourhood", w.neighbourhood()},
                                    {"lookahead", w.lookahead()}}) {
    if (value < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("draft: ", name, " must not be negative, got ", value));
    }
  }
  if (w.has_first_layer() && w.first_layer() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("draft: first_layer must not be negative, got ", w.first_layer()));
  }
  DraftRequest r;
  r.prompt.assign(w.prompt().begin(), w.prompt().end());
  r.specpc.budget = w.budget();
  if (w.window() > 0) r.specpc.window = w.window();
  if (w.pool_kernel() > 0) r.specpc.pool_kernel = w.pool_kernel();
  if (w.neighbourhood() > 0) r.specpc.neighbourhood = w.neighbourhood();
  r.first_layer = w.has_first_layer() ? w.first_layer() : -1;
  r.lookahead = w.lookahead();
  return r;
}

DraftService::DraftService(DraftWorker& worker, DraftMetrics* metrics, v1::ModelIdentity model,
                           v1::ModelIdentity target)
    : worker_(worker), metrics_(metrics), model_(std::move(model)), target_(std::move(target)) {}

grpc::Status DraftService::Score(grpc::ServerContext* context, const v1::ScoreRequest* request,
                                 v1::ImportanceMap* response) {
  grpc::Status status = CheckProtocol(*context);
  DraftOutcome o;
  if (status.ok()) {
    absl::StatusOr<DraftRequest> r = DraftRequestFromWire(*request);
    absl::StatusOr<DraftOutcome> got =
        r.ok() ? worker_.Run(*r, absl::FromChrono(context->deadline()),
                             [context] { return context->IsCancelled(); })
               : absl::StatusOr<DraftOutcome>(r.status());
    if (got.ok()) {
      o = *std::move(got);
      const DraftResult& d = o.result;
      response->mutable_token_scores()->Assign(d.token_scores.begin(), d.token_scores.end());
      response->mutable_keep()->Assign(d.keep.begin(), d.keep.end());
      response->mutable_lookahead()->Assign(d.lookahead.begin(), d.lookahead.end());
      response->set_depth(worker_.engine().depth());
      response->set_first_layer(d.first_layer);
      response->set_queue_s(o.queue_s);
      response->set_prefill_s(d.prefill_s);
      response->set_lookahead_s(d.lookahead_s);
      response->set_total_s(o.total_s);
    } else {
      status = ToGrpcStatus(got.status());
    }
  }
  if (metrics_ != nullptr) metrics_->RequestDone(FromGrpcStatus(status));
  spdlog::info(
      "draft request {}: {} prompt tokens, budget {}, lookahead {}, {}: queue {:.3f}s "
      "draft {:.3f}s lookahead {:.3f}s total {:.3f}s, {} kept",
      request->request_id(), request->prompt_size(), request->budget(), request->lookahead(),
      status.ok() ? "ok" : FromGrpcStatus(status).ToString(), o.queue_s, o.result.prefill_s,
      o.result.lookahead_s, o.total_s, o.result.keep.size());
  return status;
}

grpc::Status DraftService::Health(grpc::ServerContext* context, const v1::HealthRequest* request,
                                  v1::HealthResponse* response) {
  if (grpc::Status s = CheckProtocol(*context); !s.ok()) return s;
  *response = HealthNow();
  return grpc::Status::OK;
}

v1::HealthResponse DraftService::HealthNow() const {
  v1::HealthResponse h;
  h.set_role(v1::ROLE_DRAFT);
  h.set_protocol_version(kProtocolVersion);
  *h.mutable_model() = model_;
  *h.mutable_target_model() = target_;
  h.set_plan(
      ForwardPlan::SelfDraft(worker_.engine().model().config.n_layers, worker_.engine().depth())
          .DebugString());
  h.set_queued(worker_.queued());
  h.set_running(worker_.running());
  h.set_draining(worker_.draining());
  return h;
}

}  // namespace tripod
