// PrefillEngine: POP prefill of one prompt on a pruned model. It loads only what its plan needs
// (kept layers in full; the skipped layers' norm and K/V weights, stacked into one GEMM; no
// output head) and computes the KV of prompt tokens 0..n-2 for every layer. The last prompt
// token is not prefilled (the boundary rule): whoever decodes runs it through the full model
// first, at position n-1, and its logits give the first output token.
//
// The KV leaves either as one snapshot after the whole prefill (Run without a sink: the CLI, the
// in-process path), or layer by layer through a KvSink while the forward goes on (the prefill
// worker streams it to a decode worker). A cancel flag stops a run between layers.
//
// Threads: Create, then Run on ONE thread at a time (the engine thread: it owns the workspace
// and opens the OpenMP team). Everything else here is fixed at Create and may be read from any
// thread: plan(), PlanFor(), skipped_layers(), model() (its config), kv_dtype().
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/compute/backend.h"
#include "common/compute/forward.h"
#include "common/compute/model.h"
#include "common/compute/plan.h"
#include "common/kv/kv_snapshot.h"
#include "common/kv_transfer/kv_sink.h"
#include "prefill_node/kv_trimming.h"
#include "prefill_node/pop_config.h"

namespace tripod {

struct PrefillOptions {
  std::string model_path;          // empty: BundledModelPath()
  std::string precision = "auto";  // fp32 | bf16 | int8 | int16 | auto (CpuOptionsForPrecision)
  // cpu | cuda | cpu-guarded-kv (MakeBackend). On the GPU the KV is made in device memory and
  // leaves through the store's copies (a snapshot, or the sink's chunks).
  std::string backend = "cpu";
  PopConfig pop;
  int chunk = 1024;      // prompt tokens per forward, so that long prompts fit
  bool stack_kv = true;  // the skipped layers' K/V as one GEMM (false: one per layer)
  // The skipped layers' Q projections too, so that SpecKV and SnapKV can score their KV under
  // POP (RunTrimmed); costs q_dim x d_model weights per skipped layer.
  bool score_queries = true;
};

struct PrefillRun {
  const ForwardPlan* plan = nullptr;  // null: the engine's own; else one from PlanFor()
  KvSink sink;                        // set: the KV goes here, and no snapshot is made
  // Set (by any thread): the run stops at the next layer boundary with CANCELLED.
  const std::atomic<bool>* cancel = nullptr;
};

struct PrefillResult {
  KvSnapshot kv;  // without a sink: tokens 0..n-2, all layers; plan_key and token_ids filled
  int prefilled_tokens = 0;  // n - 1
  uint64_t plan_key = 0;     // KvKey() of the plan that ran
  int32_t last_token = 0;
  int32_t last_position = 0;  // n - 1
  double forward_s = 0;       // the forward passes (with the sink's calls)
  double sink_s = 0;          // of which in the sink (encoding, and waiting for the network)
  double export_s = 0;        // copying the KV out of the cache into the snapshot
  int chunks = 0;
};

class PrefillEngine {
 public:
  // On the backend options.backend names (prefill_engine_create.cc: MakeBackend).
  static absl::StatusOr<std::unique_ptr<PrefillEngine>> Create(const PrefillOptions& options);
  // On a backend the caller made (options.backend and options.precision unused), its K/V stored
  // as `kv`: a separate definition, so that a program giving its own backend (bench/gpu_check)
  // links no other.
  static absl::StatusOr<std::unique_ptr<PrefillEngine>> Create(const PrefillOptions& options,
                                                               std::unique_ptr<Backend> backend,
                                                               KvDtype kv);

  // Prefills prompt[0..n-2]; n >= 1 (a one-token prompt prefills nothing: an empty snapshot, no
  // sink call). Engine thread only.
  absl::StatusOr<PrefillResult> Run(const std::vector<int32_t>& prompt, const PrefillRun& run = {});

  // Prefills prompt[0..n-2] and trims its KV by `policy`, in process (a snapshot, no sink).
  // SpecKV and SnapKV score through RunScored and keep per layer and KV head the window and the
  // best-scored rest. A policy that keeps every position gives exactly Run's result. Engine
  // thread only.
  absl::StatusOr<PrefillResult> RunTrimmed(const std::vector<int32_t>& prompt,
                                           const TrimPolicy& policy,
                                           const ForwardPlan* plan = nullptr);

  // The untrimmed KV of prompt[0..n-2] and the attention of the last `window` prefilled tokens'
  // queries, the last prompt token's and the lookahead's over it, captured in every layer: what
  // SpecKV and SnapKV select from at any budget (ScoredPositions). The window and lookahead run
  // as one batch after the rest. Every layer needs queries: full layers have them, POP's K/V-only
  // layers project theirs from the stream their K/V come from (loaded with
  // PrefillOptions::score_queries); FAILED_PRECONDITION otherwise. window in [1, n - 1].
  //
  // split_lookahead (an evaluation's sharing, not the worker's path): the lookahead runs as a
  // batch of its own after the window's, so that `window_only` holds the window's and the last
  // token's attention alone (SnapKV's scores) while `attention` combines both batches (max and
  // sum over the queries, as one batch gives them up to rounding), and one pass serves SpecKV,
  // SnapKV and the untrimmed KV. lookahead_s: that batch's time (part of full.forward_s).
  struct Scored {
    PrefillResult full;
    CapturedAttention attention;
    CapturedAttention window_only;  // split_lookahead only
    double lookahead_s = 0;
  };
  absl::StatusOr<Scored> RunScored(const std::vector<int32_t>& prompt, int window,
                                   const std::vector<int32_t>& lookahead,
                                   const ForwardPlan* plan = nullptr, bool split_lookahead = false);

  // The plan for a request's POP config (nullopt: this worker's own). A worker that loaded the
  // full weights (no layer skipped at load) runs any legal plan, its K/V-only layers through the
  // full Q|K|V weights; a pruned worker runs only a plan that writes the same KV as its own
  // (equal KvKey): FAILED_PRECONDITION naming both otherwise. Thread-safe.
  absl::StatusOr<ForwardPlan> PlanFor(const std::optional<PopConfig>& pop) const;
  bool full_weights() const { return skipped_.empty(); }

  const ForwardPlan& plan() const { return plan_; }
  const std::vector<int>& skipped_layers() const { return skipped_; }
  const LoadedModel& model() const { return *model_; }
  const PrefillOptions& options() const { return options_; }
  Backend& backend() { return *backend_; }
  KvDtype kv_dtype() const { return kv_dtype_; }
  size_t resident_weight_bytes() const { return model_->resident_weight_bytes(); }

 private:
  PrefillEngine() = default;
  PrefillOptions options_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<LoadedModel> model_;
  std::unique_ptr<ForwardWorkspace> ws_;
  ForwardPlan plan_;
  std::vector<int> skipped_;
  KvDtype kv_dtype_ = KvDtype::kF32;
};

// OK when `prompt` can be prefilled on a model of `config`: not empty, every id in the
// vocabulary, no longer than the context; INVALID_ARGUMENT saying which otherwise.
absl::Status CheckPrompt(const ModelConfig& config, const std::vector<int32_t>& prompt);

// The weight selection a POP prefill worker loads for `skipped` layers of an n_layers model.
WeightSelection PrefillSelection(int n_layers, const std::vector<int>& skipped);

// Resident weight bytes of the full model (all layers and the head) on a fresh backend of the
// given precision, for the report beside PrefillEngine::resident_weight_bytes().
absl::StatusOr<size_t> FullModelWeightBytes(const std::string& model_path,
                                            const std::string& precision);

}  // namespace tripod
