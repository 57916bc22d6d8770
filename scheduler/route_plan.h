// The scheduler's routing rules, apart from the RPCs that carry them out (request_call.h issues
// the calls and follows what these return). Pure functions of the request, a snapshot of the
// healthy workers and the dispatcher's options:
//   - the method step: none, nothing to drop, the draft hop, or a method applied here;
//   - the route: a decode worker (least load, router.h), and a prefill worker unless the prompt is
//     short or no prefill worker runs its POP plan (then the decode worker prefills it itself);
//   - the KV the decode worker reserves (untrimmed, a trimmed count, PyramidKV's per-layer
//     budgets) and the bytes a trimmed transfer saved;
//   - the next step after each kind of failure: a failed Reserve moves to another decode worker
//     once (the worker gone or silent) or prefills on the decode worker; a failed prefill retries
//     once on another prefill worker, else on the decode worker; a stream cut short by a dead
//     decode worker migrates (up to --migration_limit), every unfinished choice continuing from its
//     own tokens, unless one held text back; anything else
//     gives up with a status that says whose fault it is.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "scheduler/completion_request.h"
#include "scheduler/dispatcher.h"
#include "scheduler/worker_registry.h"
#include "tripod/v1/decode.pb.h"
#include "tripod/v1/prefill.pb.h"

namespace tripod::scheduler {

enum class Route {
  kDecodeOnly,      // the decode worker prefills the prompt (short, or no prefill worker)
  kDisaggregated,   // a prefill worker pushes the KV to the decode worker
  kRetriedPrefill,  // disaggregated, on a second prefill worker after the first failed
  kRetriedDecode,   // disaggregated, on a second decode worker after a Reserve failed
  kLocalFallback,   // the decode worker prefills after the disaggregated path failed
  kMigrated,        // a second decode worker continues a stream whose worker died
};
// What the response's tripod.route says: "decode_only", "disaggregated", ...
const char* RouteName(Route route);

// The healthy workers of each role at one moment.
struct WorkerSnapshot {
  std::vector<std::shared_ptr<Worker>> decode;
  std::vector<std::shared_ptr<Worker>> prefill;
  std::vector<std::shared_ptr<Worker>> draft;
};
WorkerSnapshot SnapshotOf(const WorkerRegistry& registry);

// UNAVAILABLE "no_workers" when no decode worker is in routing; else OK.
absl::Status CheckDecodeWorkers(const WorkerSnapshot& workers);

enum class MethodStep {
  kNone,      // no method asked
  kKeepsAll,  // the budget keeps everything: the request runs as without the method (applied)
  kDraft,     // the draft worker's importance map first
  kLocal,     // applied here, without a draft
};
struct MethodPlan {
  MethodStep step = MethodStep::kNone;
  int budget = 0;  // tokens kept, resolved against the prompt
};
// min_kept: the floor of a fractional budget (DraftMethodParams::min_kept, ResolveBudget).
MethodPlan PlanMethod(const MethodChoice& method, int prompt_tokens, int min_kept);

// The draft worker's deadline for a prompt: `per_4096` for every 4096 tokens begun of the work
// it answers after, its own prompt's and those of the requests in flight there before it (the
// worker runs them one at a time), at least `per_4096`. The draft's pass grows with the prompt:
// one deadline for all lengths and loads either waits too long on a short prompt or gives up on
// every long one behind others.
std::chrono::milliseconds DraftDeadline(std::chrono::milliseconds per_4096, int64_t tokens);

// What a failed draft hop means: the method is not applied (`why`), and an UNAVAILABLE draft
// worker leaves routing until its next good check.
struct DraftFailure {
  std::string why;
  bool mark_failed = false;
};
DraftFailure AfterDraftFailed(const absl::Status& status, const std::string& draft_address);

// The POP ratio asked of the prefill worker ("0" off; empty: the worker's own plan).
std::string PopRatioFor(const PopChoice& pop, const DispatcherOptions& options);

// The first routing of a request whose prompt (after its method) has `prompt_tokens` tokens.
struct RoutePlan {
  absl::Status status;             // not OK: no decode worker, the request ends
  std::shared_ptr<Worker> decode;  // the decode worker
  Route route = Route::kDecodeOnly;
  std::string pop_ratio;  // kDisaggregated: what PopRatioFor says
};
// A request asking for its prompt's log-probabilities (full_prompt_logits) is decode-only whatever
// its length: the decode worker prefills the whole prompt with its full plan and reports the
// log-softmax at every prompt position. A prefill worker cannot: POP's pruned layers give no
// prompt logits, and a prefill worker's KV arrives without logits. The parser has refused the
// requests that ask for a pruned plan or a compression method with them.
RoutePlan PlanRoute(int prompt_tokens, const PopChoice& pop, const WorkerSnapshot& workers,
                    const DispatcherOptions& options, uint64_t rotation,
                    bool full_prompt_logits = false);

// The prefill worker of a disaggregated request, skipping `exclude` (the one that just failed).
// None that runs the plan: the decode worker prefills, as kDecodeOnly on the first choice (a
// pruned worker cannot run POP off, say) or kLocalFallback on a retry.
struct PrefillChoice {
  std::shared_ptr<Worker> prefill;  // nullptr: `fallback`
  Route fallback = Route::kDecodeOnly;
};
PrefillChoice ChoosePrefill(const WorkerSnapshot& workers, const Worker* exclude,
                            const std::string& pop_ratio, uint64_t rotation);

// The KV the decode worker sets aside for a transfer of a `prompt_tokens` prompt trimmed by
// `trimming` to `kv_entries` entries per layer and head (0 and TRIM_NONE: untrimmed, n - 1).
// PyramidKV's per-layer budgets need the prefill worker's layer count (its last Health).
struct KvPlan {
  int kv_slots = 0;                       // 0: untrimmed
  std::vector<int32_t> layer_budgets;     // PyramidKV: trimming.layer_budgets
  std::vector<int32_t> layer_first_slot;  // PyramidKV: each layer's first slot of kv_slots
  std::string fallback;                   // not empty: the method cannot run (why)
};
KvPlan PlanKv(const v1::Trimming& trimming, int kv_entries, int prompt_tokens,
              const Worker& prefill);

// The bytes a trimmed transfer saved: every slot carries the same bytes (one type, every layer
// and head), so the untrimmed KV would have been bytes_sent * (n - 1) / kv_entries.
int64_t KvBytesSaved(int64_t bytes_sent, int prompt_tokens, int kv_entries);

// What the call does after a failure (or, for the stream, after its end).
struct NextStep {
  enum class Kind {
    kReserveAgain,  // reserve on `worker` (a decode worker) and choose a prefill worker again
    kPrefillOn,     // reserve and prefill again, on `worker` (another prefill worker)
    kLocalPrefill,  // Generate on the decode worker with the plain prompt
    kMigrate,       // Generate on `worker` (another decode worker) with what was streamed
    kFinish,        // ends normally with `finish` ("stop", "length")
    kGiveUp,        // ends with `status`
  };
  Kind kind = Kind::kGiveUp;
  Route route = Route::kLocalFallback;  // kReserveAgain, kPrefillOn, kLocalPrefill, kMigrate
  std::shared_ptr<Worker> worker;
  bool mark_failed = false;  // the failed worker leaves routing until its next good check
  std::string finish;        // kFinish
  absl::Status status;       // kGiveUp
  std::string note;          // for the log: why a possible move was not made
};

// Decode.Reserve on `decode` failed with `status`; `decode_attempts` reroutes so far.
NextStep AfterReserveFailed(const absl::Status& status, const Worker& decode, int decode_attempts,
                            int prompt_tokens, const WorkerSnapshot& workers, uint64_t rotation);

// Prefill.Run on `prefill` failed with `status`; `prefill_attempts` counts this failure.
NextStep AfterPrefillFailed(const absl::Status& status, const Worker& prefill, int prefill_attempts,
                            const std::string& pop_ratio, const WorkerSnapshot& workers,
                            uint64_t rotation);

// One choice of a request (the one of n = 1, a candidate of n > 1) as the call saw it, over
// every decode worker that streamed it.
struct ChoiceProgress {
  int generated = 0;       // its tokens streamed
  bool ended = false;      // its final event came (stop, length)
  bool failed = false;     // its final event came, cancelled or failed
  bool text_held = false;  // its last event's text_held
};

// How a Generate stream ended, as the call saw it.
struct StreamEnd {
  bool end_seen = false;  // the final event came (n > 1: every choice's)
  v1::FinishReason finish = v1::FINISH_NONE;
  std::string error;      // the final event's
  absl::Status status;    // the call's
  int prompt_tokens = 0;  // the request's prompt (after its method)
  int max_tokens = 0;
  int migrations = 0;                   // so far
  std::vector<ChoiceProgress> choices;  // the request's n (best_of) candidates
};
// A stream cut short by a dead decode worker moves when every choice not ended can: none held
// text back and none failed. The new worker is picked for the prompt and the longest of them.
NextStep AfterStream(const StreamEnd& end, const Worker& decode, const WorkerSnapshot& workers,
                     const DispatcherOptions& options, uint64_t rotation);

// What a migrated stream's new worker continues: each choice not ended, in index order, from its
// own tokens so far, with what is left of the request's max_tokens and min_tokens (vLLM's: per
// choice). n = 1: the one choice (GenerateRequest.continuation); n > 1:
// GenerateRequest.continued_choices, whose sampling keeps the rule seed + choice.
struct ChoiceResume {
  int choice = 0;
  int generated = 0;  // its tokens so far: the new worker's prompt ends with them
  int max_tokens = 0;
  int min_tokens = 0;
};
std::vector<ChoiceResume> ChoicesToResume(const std::vector<ChoiceProgress>& choices,
                                          int max_tokens, int min_tokens);

}  // namespace tripod::scheduler
