// DecodeEngine: the decode worker's engine. One model on a CPU backend, a paged KV cache, and
// continuous batching (batch_scheduler.h): every Step() is ONE forward over all running
// sequences (decode tokens and prompt chunks mixed), then one sampled token per sequence that
// reached its last token, streamed through the request's callback. Submit and Cancel are
// thread-safe; the cache, the forward and the callbacks run on the engine's thread only (the
// background loop of Start(), or the caller of Step / RunUntilIdle when there is none).
//
// With precision "fp32" the backend runs batch-invariant kernels, so a sequence's greedy tokens
// are the same whatever it is batched with, however its prompt is chunked, and after preemption.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/compute/backend.h"
#include "common/compute/forward.h"
#include "common/compute/model.h"
#include "common/compute/plan.h"
#include "common/kv/paged_kv_cache.h"
#include "common/model/tokenizer.h"
#include "decode_node/batch_scheduler.h"
#include "decode_node/request.h"

namespace tripod {

struct DecodeEngineOptions {
  std::string model_path;          // empty: BundledModelPath()
  std::string precision = "auto";  // fp32 | bf16 | int8 | int16 | auto (CpuOptionsForPrecision)
  // KV element type: auto (the precision's: f32 for fp32, else f16) | f32 | f16 | bf16 | q8_0.
  std::string kv_cache_dtype = "auto";
  // Batch-invariant kernels (exact tokens under batching); -1: on for "fp32" only.
  int batch_invariant = -1;
  size_t kv_budget_bytes = size_t{512} << 20;
  int block_tokens = 16;
  double watermark = 0.01;  // fraction of blocks admission keeps free
  // Forward rows per step (decode tokens + prompt chunks). A step with a prompt chunk stalls every
  // running stream: at 16 sequences on Zen 4 (2 threads) 512 rows gave an ITL p99 of ~390 ms,
  // 256 ~255 ms and 128 ~150 ms; a 2048-token prompt's TTFT was 2.39 / 2.36 / 2.51 s.
  int max_tokens_per_step = 256;
  int max_running = 128;   // sequences in the batch at most
  int context_tokens = 0;  // 0: the model's context length
};

struct DecodeEngineStats {
  int64_t steps = 0;
  int64_t forward_tokens = 0;    // rows run through the model
  int64_t generated_tokens = 0;  // tokens sampled
  int64_t preemptions = 0;
  int64_t prefix_hit_slots = 0;  // slots attached from the prefix cache
  int64_t imported = 0;          // sequences admitted by Import (re-imports included)
  int64_t finished = 0;          // requests ended, any reason
  int max_batch_seqs = 0;        // most sequences in one step
  double forward_seconds = 0;    // time in Forward
  double step_seconds = 0;       // time in Step (schedule + forward + sampling + callbacks)
};

class DecodeEngine {
 public:
  static absl::StatusOr<std::unique_ptr<DecodeEngine>> Create(const DecodeEngineOptions& options);
  ~DecodeEngine();  // stops the loop; requests still in flight end as cancelled
  DecodeEngine(const DecodeEngine&) = delete;
  DecodeEngine& operator=(const DecodeEngine&) = delete;

  // Queues a request; its events go to request.on_event. Bad input is an error here, before
  // anything streams. Thread-safe.
  absl::StatusOr<int64_t> Submit(DecodeRequest request);
  // Ends a request at the next step boundary: blocks freed, a kCancelled event. Unknown or
  // finished ids are ignored. Thread-safe.
  void Cancel(int64_t id);

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
  // Moves submitted requests in and applies cancellations (engine thread).
  void Intake();
  // Ends a sequence: event, blocks freed, forgotten.
  void Finish(Sequence& s, TokenEvent event);
  // Streams a sequence's sampled token (and ends the sequence where it stops).
  void EmitToken(Sequence& s, SampledToken token);
  void Loop();

  DecodeEngineOptions options_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<LoadedModel> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<PagedKvCache> cache_;
  std::unique_ptr<ForwardWorkspace> ws_;
  ForwardPlan plan_;
  SchedulerConfig sched_config_;
  int context_ = 0;

  // Engine thread only.
  absl::flat_hash_map<int64_t, std::unique_ptr<Sequence>> seqs_;
  SchedulerQueues queues_;
  std::vector<float> logits_;
  struct SampledSeq {
    Sequence* seq;
    SampledToken token;
  };
  std::vector<SampledSeq> sampling_;  // Step's scratch: the sequences sampled this step

  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::deque<std::unique_ptr<Sequence>> incoming_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<int64_t> cancels_ ABSL_GUARDED_BY(mu_);
  int64_t active_ ABSL_GUARDED_BY(mu_) = 0;  // sequences the engine thread holds
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  DecodeEngineStats stats_ ABSL_GUARDED_BY(mu_);
  std::thread loop_;
};

}  // namespace tripod
