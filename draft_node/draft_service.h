// DraftService: tripod.v1.Draft on gRPC's synchronous API, a thin adapter from the wire to a
// DraftWorker: Score checks the protocol and the request and runs it (waiting for the engine on
// the handler thread, bounded by the call's deadline and the client's cancel); Health answers at
// once.
#pragma once

#include "absl/status/statusor.h"
#include "draft_node/draft_worker.h"
#include "grpcpp/grpcpp.h"
#include "tripod/v1/draft.grpc.pb.h"

namespace tripod {

// The engine request a Score call asks for, its defaults filled in (window 64, pool and
// neighbourhood 32); INVALID_ARGUMENT saying what is wrong for negative fields. The engine checks
// the rest (the prompt, the first layer, the context).
absl::StatusOr<DraftRequest> DraftRequestFromWire(const v1::ScoreRequest& request);

class DraftService final : public v1::Draft::Service {
 public:
  // `worker` must outlive the service; `model` and `target` (the model whose token ids it
  // serves: its own for a self-draft): what Health reports.
  DraftService(DraftWorker& worker, DraftMetrics* metrics, v1::ModelIdentity model,
               v1::ModelIdentity target);

  grpc::Status Score(grpc::ServerContext* context, const v1::ScoreRequest* request,
                     v1::ImportanceMap* response) override;
  grpc::Status Health(grpc::ServerContext* context, const v1::HealthRequest* request,
                      v1::HealthResponse* response) override;

  // What Health answers, for the HTTP /health beside gRPC. Thread-safe.
  v1::HealthResponse HealthNow() const;

 private:
  DraftWorker& worker_;
  DraftMetrics* metrics_;
  const v1::ModelIdentity model_;
  const v1::ModelIdentity target_;
};

}  // namespace tripod
