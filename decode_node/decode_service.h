// DecodeService: tripod.v1.Decode, a thin adapter from the wire to the DecodeEngine and the
// worker's KV transfers (KvTransfers, which it owns). Generate, Cancel and Health run on gRPC's
// callback API: a Generate stream holds no thread while it waits for its KV, its turn in the
// engine or its client, so the streams a worker holds open are bounded by its memory, not by a
// thread quota, and Health answers however many there are. Reserve, OpenKvLink and PushKv (one
// stream per transfer in flight, writing chunks into the blocks) are synchronous.
//
//  - Reserve sets blocks aside in the engine and registers a transfer under a fresh id, with a
//    lease (the request's, else the worker's default).
//  - PushKv binds the transfer named by its first chunk (one stream per transfer) and feeds every
//    chunk to the transfer's KvChunkReceiver, which writes it straight into the reserved blocks
//    from this handler thread. A refused chunk ends the call with the codec's status (the
//    transfer is aborted and its blocks freed); the end message completes the transfer and the
//    call answers with the totals. A stream that ends without its end message aborts it too.
//  - Generate with a transfer id waits (bounded by the lease) for the transfer to complete, then
//    adopts its blocks: the engine runs only the last prompt token. With transfer id 0 the
//    engine prefills the plain prompt itself. The engine's events go to the call's stream writer
//    (common/rpc/server_stream_writer.h), which writes them one at a time as the client takes
//    them; a client that goes away cancels the request (its blocks freed). The last event carries
//    the finish, the usage and this process's timing.
//  - Cancel ends a Generate call (by request id) and/or a transfer (by transfer id).
//  - Health reports the worker's role, model, plan, load and KV blocks.
//
// Errors before anything streamed are the call's status (INVALID_ARGUMENT, RESOURCE_EXHAUSTED,
// the transfer's own failure...); once a Generate call streams, it ends with a finish event.
// While draining, Reserve and plain-prompt Generate calls get UNAVAILABLE; PushKv and Generate
// for transfers reserved before still run, as they finish requests already in flight.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/kv_transfer/kv_links.h"
#include "common/kv_transfer/kv_transfers.h"
#include "common/model/sampler.h"
#include "common/util/mutex.h"
#include "decode_node/decode_engine.h"
#include "decode_node/decode_metrics.h"
#include "grpcpp/grpcpp.h"
#include "tripod/v1/decode.grpc.pb.h"

namespace tripod {

struct GenerateCall;

struct DecodeServiceOptions {
  KvTransfersOptions transfers;
  KvLinksOptions links;  // which KV links (OpenKvLink) this worker takes
};

// The wire's sampling parameters, with its zero defaults read as "off" (top_p 0 and
// repetition_penalty 0 are 1). INVALID_ARGUMENT naming the field when out of range.
absl::StatusOr<SamplingParams> SamplingFromWire(const v1::SamplingParams& p);

using DecodeServiceBase =
    v1::Decode::WithCallbackMethod_Generate<v1::Decode::WithCallbackMethod_Cancel<
        v1::Decode::WithCallbackMethod_Health<v1::Decode::Service>>>;

class DecodeService final : public DecodeServiceBase {
 public:
  // `engine` (started, with its loop) and `metrics` must outlive the service. `model`: what
  // Health reports.
  DecodeService(DecodeEngine& engine, DecodeMetrics& metrics, v1::ModelIdentity model,
                const DecodeServiceOptions& options = {});
  // Aborts every transfer (their blocks freed). The gRPC server must be shut down first.
  ~DecodeService() override;

  grpc::Status Reserve(grpc::ServerContext* context, const v1::ReserveRequest* request,
                       v1::ReserveResponse* response) override;
  grpc::Status PushKv(grpc::ServerContext* context, grpc::ServerReader<v1::KvChunk>* reader,
                      v1::PushKvResponse* response) override;
  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Cancel(grpc::CallbackServerContext* context,
                                   const v1::CancelRequest* request,
                                   v1::CancelResponse* response) override;
  grpc::ServerUnaryReactor* Health(grpc::CallbackServerContext* context,
                                   const v1::HealthRequest* request,
                                   v1::HealthResponse* response) override;
  grpc::Status OpenKvLink(grpc::ServerContext* context, const v1::OpenKvLinkRequest* request,
                          v1::OpenKvLinkResponse* response) override;

  // What Health answers, for the HTTP /health beside gRPC. Thread-safe.
  v1::HealthResponse HealthNow() const;

  // Stops accepting new work (see above). Thread-safe, idempotent.
  void StartDraining();
  bool draining() const { return draining_.load(); }
  // Generate calls and PushKv streams in progress, and transfers not yet adopted.
  int in_flight() const;
  // Ends the drain period: cancels every Generate call and transfer in progress.
  void CancelAll(const std::string& why);

  KvTransfers& transfers() { return *transfers_; }

 private:
  using Call = GenerateCall;  // generate_call.h
  // The call's transfer completed or ended: adopt its KV and submit, or end the call.
  void TransferSettled(const std::shared_ptr<Call>& call);
  // Submits the call's request to the engine (with its transfer's KV, if any).
  void Submit(const std::shared_ptr<Call>& call);
  // The call's RPC is done and its request ended.
  void Forget(Call* call);

  DecodeEngine& engine_;
  DecodeMetrics& metrics_;
  const v1::ModelIdentity model_;
  const DecodeServiceOptions options_;
  const KvLayout layout_;  // the cache's
  std::atomic<bool> draining_{false};
  std::atomic<int> handlers_{0};  // Generate calls and PushKv handlers not yet done

  // Generate calls until both their RPC is done and their request ended (an engine request
  // outlives a client that went away).
  mutable Mutex calls_mu_;
  CondVar calls_gone_;  // calls_ became empty
  absl::flat_hash_map<const Call*, std::shared_ptr<Call>> calls_ ABSL_GUARDED_BY(calls_mu_);

  std::unique_ptr<KvLinks> links_;
  std::unique_ptr<KvTransfers> transfers_;  // last: destroyed first
};

}  // namespace tripod
