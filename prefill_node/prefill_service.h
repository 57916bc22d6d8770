// PrefillService: tripod.v1.Prefill on gRPC's synchronous API, a thin adapter from the wire to a
// PrefillWorker. Run checks the protocol and the request, queues the job, and waits for it on the
// handler thread (which never computes), bounded by the call's deadline and the client's cancel
// (either cancels the job). Cancel and Health answer at once.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "prefill_node/prefill_engine.h"
#include "prefill_node/prefill_queue.h"
#include "prefill_node/prefill_worker.h"
#include "tripod/v1/prefill.grpc.pb.h"

namespace tripod {

// The job a Prefill.Run request asks for, checked: a prompt the model takes, a decode address
// and transfer id, a trimming policy that holds (ValidateTrimPolicy), and a plan the engine can run
// (PrefillEngine::PlanFor: the worker's own when the request names none). INVALID_ARGUMENT or
// FAILED_PRECONDITION saying what is wrong otherwise.
absl::StatusOr<PrefillJob> JobFromRequest(const PrefillEngine& engine,
                                          const v1::PrefillRequest& request);

// The engine's trimming policy for a request's Trimming (defaults filled in: window 32, pool 7,
// sink tokens 4); INVALID_ARGUMENT for an unknown method or negative fields.
absl::StatusOr<TrimPolicy> TrimPolicyFromWire(const v1::Trimming& trimming);

class PrefillService final : public v1::Prefill::Service {
 public:
  // `worker` must outlive the service. `model`: what Health reports.
  PrefillService(PrefillWorker& worker, v1::ModelIdentity model);

  grpc::Status Run(grpc::ServerContext* context, const v1::PrefillRequest* request,
                   v1::PrefillResponse* response) override;
  grpc::Status Cancel(grpc::ServerContext* context, const v1::CancelRequest* request,
                      v1::CancelResponse* response) override;
  grpc::Status Health(grpc::ServerContext* context, const v1::HealthRequest* request,
                      v1::HealthResponse* response) override;

  // What Health answers, for the HTTP /health beside gRPC. Thread-safe.
  v1::HealthResponse HealthNow() const;

  // How often a waiting Run looks whether its client went away (the sync API has no callback).
  void set_poll_interval(absl::Duration d) { poll_ = d; }

 private:
  grpc::Status RunChecked(grpc::ServerContext* context, const v1::PrefillRequest& request,
                          v1::PrefillResponse* response, PrefillOutcome* outcome);

  PrefillWorker& worker_;
  const v1::ModelIdentity model_;
  absl::Duration poll_ = absl::Milliseconds(20);
};

}  // namespace tripod
