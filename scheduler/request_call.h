// One request's path through the workers:
//   draft hop:       Draft.Score first when the request's method needs an importance map
//                    (draft_methods.h); a draft failure or timeout runs the request without its
//                    method, and the response's tripod.method says so
//   decode-only:     Decode.Generate with the prompt (short prompts, or no prefill worker)
//   disaggregated:   Decode.Reserve -> Prefill.Run (the KV pushed straight to the decode worker)
//                    -> Decode.Generate over the transferred KV
// A failed prefill is retried once on another prefill worker, else (or after a second failure)
// run on the decode worker itself: the reservation is cancelled, nothing is lost. A decode
// worker that dies mid-stream (UNAVAILABLE) hands the request to another one, up to
// --migration_limit times: it prefills the prompt and the tokens already streamed and continues
// (route "migrated"; n > 1: each unfinished choice from its own tokens), unless the dead worker
// held text back (a possible stop string's start, an incomplete character), which would be lost.
// Any other decode failure ends the request with an error. A client that leaves cancels the request
// on every worker holding it (the Generate call is cancelled and Decode.Cancel sent, which the
// engine sees before its next step; a running prefill gets Prefill.Cancel and its reservation is
// cancelled). All calls are gRPC's callback API: no thread waits for a worker. Every choice
// along the way (which worker, which route, what to reserve, what follows a failure) is
// route_plan.h's; this only issues the calls and follows its answers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/util/mutex.h"
#include "grpcpp/grpcpp.h"
#include "scheduler/dispatcher.h"
#include "scheduler/route_plan.h"
#include "tripod/v1/decode.grpc.pb.h"
#include "tripod/v1/draft.grpc.pb.h"
#include "tripod/v1/prefill.grpc.pb.h"

namespace tripod::scheduler {

class Call : public grpc::ClientReadReactor<v1::GenerateResponse>,
             public std::enable_shared_from_this<Call> {
 public:
  Call(Dispatcher* dispatcher, PreparedRequest request, RequestCallbacks callbacks,
       uint64_t request_id);
  ~Call() override;

  uint64_t request_id() const { return request_id_; }

  // Admitted: sends the request on its way. Called once, outside the dispatcher's lock.
  void Begin();
  // The client left. Idempotent, any thread.
  void Cancel();
  // Never admitted (the scheduler stops): ends with `error`.
  void FailQueued(const absl::Status& error);

  // ClientReadReactor (the Generate stream); gRPC's threads.
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  enum class Phase { kQueued, kDrafting, kReserving, kPrefilling, kGenerating, kDone };

  // The healthy workers now.
  WorkerSnapshot Workers() const;
  // Before each worker call: the call's context (kept for Cancel), the phase set, or nullptr
  // when the client has left (then no call starts). Generating also holds the Call until the
  // stream's OnDone.
  grpc::ClientContext* NextContext(
      Phase phase, std::chrono::milliseconds timeout = std::chrono::milliseconds(0));

  void StartDraft();
  void OnDrafted(const grpc::Status& status);
  // The method is not applied (the request runs without it): why, for the response.
  void MethodFallback(const std::string& why);
  // After the draft hop (or without one): decode worker, then prefill or decode-only.
  void ChooseWorkers();
  // Reserve on decode_, then prefill on the chosen worker (or, without one, its fallback route).
  void ReserveAndPrefill(PrefillChoice choice);
  void OnReserved(const grpc::Status& status);
  void RunPrefill();
  void OnPrefilled(const grpc::Status& status);
  // After a failed prefill: another prefill worker once, else the decode worker itself.
  void RetryPrefill(const grpc::Status& status);
  void StartGenerate(uint64_t transfer_id, Route route);
  // The Generate stream failed with `status` before its end: a new stream on `other`.
  void Migrate(std::shared_ptr<Worker> other, const grpc::Status& status);
  // n > 1: one choice's final event (the stream ends after the last).
  void OnChoiceEnded(const v1::GenerateResponse& ev);
  // The prompt log-probabilities of a Generate event, the positions not passed on yet.
  void PassPromptLogprobs(const v1::GenerateResponse& ev);
  // Ends the request once: the callback (unless the client left), metrics, the dispatcher.
  void Finish(const std::string& finish, const absl::Status* error);
  bool cancelled() const;
  // Fire-and-forget cancels on the workers (bounded by a deadline): the transfer if given, else
  // the request's Generate call; on `worker` (default: decode_).
  void SendDecodeCancel(uint64_t transfer_id, std::shared_ptr<Worker> worker = nullptr);
  void SendPrefillCancel();

  Dispatcher* const dispatcher_;
  const PreparedRequest request_;
  const RequestCallbacks callbacks_;
  const uint64_t request_id_;
  const absl::Time accepted_;

  mutable Mutex mu_;
  Phase phase_ ABSL_GUARDED_BY(mu_) = Phase::kQueued;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  // Every call's context, kept for the Call's life (Cancel may still be cancelling one that is
  // done); the last is the call in flight. TryCancel runs outside mu_: gRPC may run the call's
  // callback inline, which takes mu_.
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Call> hold_ ABSL_GUARDED_BY(mu_);  // alive until the Generate stream is done

  // Touched by one step of the path at a time (each step starts the next); decode_ is also read
  // by Cancel, under mu_, and so written under mu_ once a stream has started (Migrate).
  std::shared_ptr<Worker> decode_;
  std::shared_ptr<Worker> prefill_;
  std::shared_ptr<Worker> draft_;
  std::vector<int32_t> prompt_;  // what the workers see (SpecPC: the kept tokens)
  v1::Trimming trimming_;        // the prefill worker's KV trimming (TRIM_NONE: none)
  int kv_entries_ = 0;           // what the trimmed KV holds per layer and head
  absl::Time draft_started_;
  int64_t draft_tokens_ = 0;  // this request's tokens in the draft worker's inflight_tokens()
  v1::ScoreRequest score_request_;
  v1::ImportanceMap importance_map_;
  uint64_t transfer_id_ = 0;
  int prefill_attempts_ = 0;
  int decode_attempts_ = 0;
  Route route_ = Route::kDisaggregated;  // the disaggregated path's, once chosen
  std::string plan_ratio_;  // the POP ratio asked of the prefill worker; empty: its own
  v1::ReserveRequest reserve_request_;
  v1::ReserveResponse reserve_response_;
  v1::PrefillRequest prefill_request_;
  v1::PrefillResponse prefill_response_;
  v1::GenerateRequest generate_request_;
  v1::GenerateResponse event_;

  // One choice's stream over every decode worker: a migration continues it from its tokens.
  struct ChoiceStream {
    std::vector<int32_t> tokens;  // every token streamed
    int carried = 0;              // of them, those streamed by decode workers before this one
    ChoiceProgress progress;      // its generated field unused: tokens.size() (Progress)
  };
  // The event's choice, or nullptr when the worker named none of the request's.
  ChoiceStream* ChoiceOf(const v1::GenerateResponse& ev);
  // Every choice's progress, its tokens counted.
  std::vector<ChoiceProgress> Progress() const;

  // The Generate stream's results (OnReadDone, then OnDone).
  bool end_seen_ = false;
  v1::GenerateResponse end_;
  int tokens_ = 0;
  std::vector<ChoiceStream> choices_;  // PreparedRequest::n
  // n > 1 candidates (PreparedRequest::n): the stream's end is the last choice's final event.
  int choices_ended_ = 0;
  int choice_tokens_ = 0;       // completion tokens of the choices that ended
  bool choice_failed_ = false;  // a choice ended neither "stop" nor "length": end_ holds it
  int migrations_ = 0;
  int prompt_logprobs_next_ = 1;  // the next prompt position whose log-probability is owed
  absl::Time started_;
  absl::Time last_token_;
  StageTimes times_;
};

}  // namespace tripod::scheduler
