// DecodeEngine: the decode worker's engine. One model on a backend (the CPU's, or a GPU's with the
// paged KV in device memory), a paged KV cache, and
// continuous batching (batch_scheduler.h): every Step() is ONE forward over all running
// sequences (decode tokens and prompt chunks mixed), then one sampled token per sequence that
// reached its last token, streamed through the request's callback. Submit and Cancel are
// thread-safe; the cache, the forward and the callbacks run on the engine's thread only (the
// background loop of Start(), or the caller of Step / RunUntilIdle when there is none).
//
// A request of n choices (DecodeRequest::n) runs its prompt once; once the prompt's last token
// ran, ForkChoices makes the other choices, sequences on forks of its KV (PagedKvCache::Fork).
//
// With precision "fp32" the backend runs batch-invariant kernels, so a sequence's greedy tokens
// are the same whatever it is batched with, however its prompt is chunked, and after preemption.
//
// KV from a prefill worker arrives either as a KvSnapshot (DecodeRequest::kv, copied in at
// admission) or in place: ReserveKv sets blocks aside and hands out a view of them, another
// thread (the transfer) writes the KV through it, and a request naming the reservation adopts
// those blocks as they are. The cache stays single-threaded: reservations and releases are tasks
// that the engine's thread runs at a step boundary.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/compute/backend.h"
#include "common/compute/forward.h"
#include "common/compute/model.h"
#include "common/compute/plan.h"
#include "common/kv/paged_kv_cache.h"
#include "common/kv_transfer/kv_reservation.h"
#include "common/model/tokenizer.h"
#include "common/structured/constraint_cache.h"
#include "common/util/mutex.h"
#include "decode_node/batch_scheduler.h"
#include "decode_node/continued_choices.h"
#include "decode_node/request.h"

namespace tripod {

struct DecodeEngineOptions {
  std::string model_path;          // empty: BundledModelPath()
  std::string precision = "auto";  // fp32 | bf16 | int8 | int16 | auto (CpuOptionsForPrecision)
  // cpu | cuda | cpu-guarded-kv (MakeBackend). On the GPU the blocks live in device memory;
  // transfers, snapshots and prefix-cache copies reach them through the cache's copies.
  std::string backend = "cpu";
  // KV element type: auto (the backend's: for the CPU the precision's, f32 for fp32, else f16;
  // f16 on the GPU) | f32 | f16 | bf16 | q8_0.
  std::string kv_cache_dtype = "auto";
  // Batch-invariant kernels (exact tokens under batching; the CPU's); -1: on for "fp32" only.
  int batch_invariant = -1;
  size_t kv_budget_bytes = size_t{512} << 20;
  int block_tokens = 16;
  double watermark = 0.01;  // fraction of blocks admission keeps free
  // Forward rows per step (decode tokens + prompt chunks). A step with a prompt chunk stalls every
  // running stream: fewer rows cut the inter-token tail while a long prompt's first token comes
  // about as soon (docs/benchmarks.md, "Decode step budget").
  int max_tokens_per_step = 256;
  int max_running = 128;   // sequences in the batch at most
  int context_tokens = 0;  // 0: the model's context length
  // In a core share (core_share.h), while a neighbour (a prefill or draft worker) has prompts
  // queued, the loop holds back steps that would only advance streams already started, lending
  // its CPUs to the neighbour's prefill, for at most this long between two steps (or four times
  // the last step's time, where that is longer: steps then take at most a fifth of the time while
  // the prompts queue); a new sequence
  // (its first token), a cancel or a posted task runs a step at once. 0: never holds back. Why:
  // on a few cores a burst's small decode steps and its prefill share the same CPUs, and the
  // steps, reading every weight for a handful of rows, buy far less than the prefill they slow.
  int yield_to_prefill_ms = 0;
};

struct DecodeEngineStats {
  int64_t steps = 0;
  int64_t forward_tokens = 0;    // rows run through the model
  int64_t generated_tokens = 0;  // tokens sampled
  int64_t preemptions = 0;
  int64_t prefix_hit_slots = 0;  // slots attached from the prefix cache
  int64_t prefix_queries = 0;    // tokens looked up in the prefix cache (hit or not)
  int64_t imported = 0;          // sequences admitted by Import (re-imports included)
  int64_t finished = 0;          // requests ended, any reason
  int64_t adopted = 0;           // requests that adopted a reservation's KV
  int max_batch_seqs = 0;        // most sequences in one step
  double forward_seconds = 0;    // time in Forward
  double step_seconds = 0;       // time in Step (schedule + forward + sampling + callbacks)
  double yielded_seconds = 0;    // time the loop held back steps for a neighbour's prefill
  // Now (as of the last step or engine task; waiting also counts submissions not taken in yet):
  int waiting = 0;
  int running = 0;
  int reservations = 0;  // reservations not adopted nor released
  int free_blocks = 0;   // free or evictable
  int total_blocks = 0;
};

class DecodeEngine {
 public:
  // On the backend options.backend names (decode_engine_create.cc: MakeBackend, with the CPU's
  // batch invariance).
  static absl::StatusOr<std::unique_ptr<DecodeEngine>> Create(const DecodeEngineOptions& options);
  // On a backend the caller made (options.backend, precision and batch_invariant unused); "auto"
  // KV means default_kv. A separate definition, so that a program giving its own backend
  // (bench/gpu_check) links no other.
  static absl::StatusOr<std::unique_ptr<DecodeEngine>> Create(const DecodeEngineOptions& options,
                                                              std::unique_ptr<Backend> backend,
                                                              KvDtype default_kv);
  ~DecodeEngine();  // stops the loop; requests still in flight end as cancelled
  DecodeEngine(const DecodeEngine&) = delete;
  DecodeEngine& operator=(const DecodeEngine&) = delete;

  // Queues a request (its continued choices: a sequence each, under the id returned); its events
  // go to request.on_event. Bad input is an error here, before
  // anything streams. Thread-safe.
  absl::StatusOr<int64_t> Submit(DecodeRequest request);
  // Submit's checks alone (INVALID_ARGUMENT saying what is wrong). Thread-safe.
  absl::Status Validate(const DecodeRequest& request) const;
  // A structured-output constraint for DecodeRequest::constraint, compiled from the regex the
  // output must fullmatch, or found among those compiled before (a bounded cache keyed by the
  // text: this engine has one model). Errors are the pattern's (INVALID_ARGUMENT,
  // UNIMPLEMENTED, RESOURCE_EXHAUSTED). Thread-safe.
  absl::StatusOr<std::shared_ptr<structured::TokenConstraint>> CompileConstraint(
      std::string_view regex);
  // Ends a request at the next step boundary: blocks freed, a kCancelled event. Unknown or
  // finished ids are ignored. Thread-safe.
  void Cancel(int64_t id);

  // Sets blocks aside for n_slots slots of KV that the plan with KvKey() == plan_key computes
  // elsewhere, plus the last prompt token. Runs on the engine's thread (at the next step
  // boundary; inline when no loop runs, so then call it from the thread that steps), and waits
  // for it. RESOURCE_EXHAUSTED when the blocks would cut into the watermark (the message says
  // whether it can ever fit). Thread-safe, but not from an on_event callback (it would wait for
  // its own thread).
  // layer_first: as KvReservation's (validated here: [n_layers] values in [0, n_slots]).
  absl::StatusOr<KvReservation> ReserveKv(int n_slots, uint64_t plan_key,
                                          std::vector<int32_t> layer_first = {});
  // Frees a reservation that no request adopted (at the next step boundary, and waits for it;
  // inline without a loop), so that the blocks are free when it returns. Adopted or unknown ones
  // are ignored. The caller must be done writing through its view. Thread-safe, but not from an
  // on_event callback.
  void ReleaseKv(int32_t kv_seq);

  // One scheduling step and forward (engine thread only). Errors are internal failures (the
  // affected requests got error events).
  absl::Status Step();
  // Steps until nothing is queued or running (engine thread only; not with Start()).
  absl::Status RunUntilIdle();
  // The background loop: steps whenever there is work.
  void Start();
  void Stop();

  bool idle() const;  // nothing queued or running (thread-safe)
  DecodeEngineStats stats() const;

  const LoadedModel& model() const { return *model_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const ForwardPlan& plan() const { return plan_; }
  std::string backend_name() const { return backend_->name(); }
  // The cache, for inspection between steps (engine thread only).
  const PagedKvCache& cache() const { return *cache_; }
  // KV held by running sequences: blocks they reference and slots they fill (engine thread).
  struct KvUsage {
    int blocks = 0;
    int64_t slots = 0;
  };
  KvUsage kv_usage() const;
  const DecodeEngineOptions& options() const { return options_; }
  int context_tokens() const { return context_; }

 private:
  struct Sequence;
  DecodeEngine() = default;
  struct Reserved {
    int n_slots = 0;
    uint64_t plan_key = 0;  // of the plan that fills it
    std::vector<int32_t> layer_first;
  };
  // Validate of a request with continued choices: each choice's sequence.
  absl::Status ValidateContinuedChoices(const DecodeRequest& request) const;
  // A sequence for a validated request (any thread; not queued yet).
  std::unique_ptr<Sequence> NewSequence(DecodeRequest request);
  // Queues the sequences of one request under one id (the first's), which Cancel ends them all by.
  int64_t Enqueue(std::vector<ChoiceSequence> parts);
  // Moves submitted requests in, runs posted tasks and applies cancellations (engine thread).
  void Intake();
  // Queues a task for the loop; false (nothing queued) when no loop runs.
  bool Post(std::function<void()> task);
  void RunTasks();
  absl::StatusOr<KvReservation> ReserveOnEngine(int n_slots, uint64_t plan_key,
                                                std::vector<int32_t> layer_first);
  // Hands a reservation to its adopting sequence (Intake).
  absl::Status Adopt(Sequence& s);
  void UpdateGauges();  // the "now" fields of stats_
  // Ends a sequence: event, blocks freed, forgotten.
  void Finish(Sequence& s, TokenEvent event);
  // Makes a sequence's other choices (DecodeRequest::n) once its prompt ran: each a sequence on
  // a fork of its KV, queued for sampling from the same logits row this step (engine thread).
  void ForkChoices(Sequence& parent, const float* logits);
  // Streams a sequence's sampled token (and ends the sequence where it stops).
  void EmitToken(Sequence& s, SampledToken token);
  // Where a step's chunk finds its rows in logits_: its prompt positions' (prompt
  // log-probabilities) from first_row, then the row it samples from.
  struct ChunkLogits {
    size_t first_row = 0;
    int n_prompt_rows = 0;
    int first_position = 0;  // the prompt position of the first of them
  };
  // The prompt log-probabilities of this step's rows, one event per sequence (engine thread).
  void EmitPromptLogprobs(const StepSchedule& sched, std::span<const ChunkLogits> rows);
  void Loop();
  // Whether the loop may hold back its next step for a neighbour's queued prompts: only started
  // streams would run (engine thread; the caller checked incoming_, cancels_ and tasks_).
  bool OnlyStartedStreams() const;
  // One chunk of a sequence under a POP control, through the control's plans; *logits gets its
  // last row's logits when the chunk wants them (engine thread).
  absl::Status RunControlledChunk(const ScheduledChunk& c, std::vector<float>* logits);

  DecodeEngineOptions options_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<LoadedModel> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<PagedKvCache> cache_;
  std::unique_ptr<ForwardWorkspace> ws_;
  ForwardPlan plan_;
  SchedulerConfig sched_config_;
  int context_ = 0;
  std::unique_ptr<structured::ConstraintCache> constraints_;  // thread-safe

  // Engine thread only.
  absl::flat_hash_map<int64_t, std::unique_ptr<Sequence>> seqs_;
  SchedulerQueues queues_;
  std::vector<float> logits_;
  struct SampledSeq {
    Sequence* seq;
    const float* logits;  // its row of the step's logits
    SampledToken token;
  };
  std::vector<SampledSeq> sampling_;  // Step's scratch: the sequences sampled this step
  absl::flat_hash_map<int32_t, Reserved> reservations_;  // by kv_seq, until adopted or released

  mutable Mutex mu_;
  CondVar cv_;
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::deque<std::unique_ptr<Sequence>> incoming_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<int64_t> cancels_ ABSL_GUARDED_BY(mu_);
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool loop_running_ ABSL_GUARDED_BY(mu_) = false;
  int64_t active_ ABSL_GUARDED_BY(mu_) = 0;  // sequences the engine thread holds
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  DecodeEngineStats stats_ ABSL_GUARDED_BY(mu_);
  std::thread loop_;
};

}  // namespace tripod
