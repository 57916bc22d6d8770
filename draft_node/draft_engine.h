// The draft worker's engine: a small model (a separate GGUF with the target's vocabulary, or a
// self-draft: the target's first N layers with its final norm and head) runs the prompt once,
// recording its attention over the prompt from the last window of queries (ForwardPlan's
// capture), and then generates lookahead tokens greedily. What it returns is the importance map
// the scheduler applies per request: SpecPC's token scores and kept positions, and SpecKV's
// lookahead. Its KV lives here only for the request. Knows nothing of gRPC.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/compute/backend.h"
#include "common/compute/forward.h"
#include "common/compute/model.h"
#include "common/kv/contiguous_kv_cache.h"
#include "common/util/cancel_token.h"
#include "common/util/mutex.h"
#include "draft_node/specpc.h"

namespace tripod {

struct DraftEngineOptions {
  std::string model_path;  // empty: the bundled model
  // > 0: a self-draft, the first `self_draft_layers` layers of model_path (no second file);
  // 0: model_path is the draft model itself, run in full.
  int self_draft_layers = 0;
  // A self-draft's layers for SpecKV's lookahead (the prompt's pass runs this deep when a request
  // asks for lookahead tokens; the map still comes from the first self_draft_layers, unchanged):
  // 0, the self-draft's depth; kAllLayers, the whole model (its greedy tokens are the target's
  // own); else in [self_draft_layers, the model's layers]. Why deeper: on the bundled 135M model
  // only the full depth's lookahead matches the target's answer often enough for SpecKV to keep
  // its accuracy (docs/draft.md). A separate draft model runs in full either way.
  int lookahead_layers = 0;
  // A target model whose vocabulary the draft must share (checked at load; empty: not checked).
  std::string target_model_path;
  std::string backend = "cpu";     // cpu | cuda (MakeBackend)
  std::string precision = "auto";  // the CPU's: CpuOptionsForPrecision
  int prefill_chunk = 512;
  int context_tokens = 0;  // prompt + lookahead capacity; 0: the model's context length
};

struct DraftRequest {
  std::vector<int32_t> prompt;
  SpecPcParams specpc;   // budget (0: no kept set), window, pool, neighbourhood
  int first_layer = -1;  // l_0; -1: the default for the draft's depth (DefaultFirstLayer)
  int lookahead = 0;     // greedy draft tokens after the prompt (SpecKV)
};

struct DraftResult {
  // Per prompt position: max over draft layers >= l_0, KV heads and the ramp-weighted window
  // queries of the attention probability (SpecPC steps 1-3, before pooling).
  std::vector<float> token_scores;
  std::vector<int32_t> keep;       // SpecPC's kept positions (empty when specpc.budget is 0)
  std::vector<int32_t> lookahead;  // greedy tokens
  int first_layer = 0;
  double prefill_s = 0, lookahead_s = 0;
};

inline constexpr int kAllLayers = -1;

// "all" (kAllLayers) or a positive layer count: tripod-draft's --lookahead_layers.
absl::StatusOr<int> ParseLookaheadLayers(const std::string& text);

// l_0 for a draft of `depth` layers: 8, or depth / 2 for drafts under 16 layers.
int DefaultFirstLayer(int depth);

class DraftEngine {
 public:
  // On the backend options.backend names (draft_engine_create.cc: MakeBackend).
  static absl::StatusOr<std::unique_ptr<DraftEngine>> Create(const DraftEngineOptions& options);
  // On a backend the caller made (options.backend and options.precision unused), its K/V stored
  // as `kv`. A separate definition from the one above, so that a program giving its own backend
  // (bench/gpu_check) links no other.
  static absl::StatusOr<std::unique_ptr<DraftEngine>> Create(const DraftEngineOptions& options,
                                                             std::unique_ptr<Backend> backend,
                                                             KvDtype kv);

  // Layers the draft runs (its depth) and the vocabulary it scores in.
  int depth() const { return depth_; }
  // Layers that generate the lookahead (>= depth()).
  int lookahead_depth() const { return lookahead_depth_; }
  const LoadedModel& model() const { return *model_; }

  // One request at a time (the compute uses every core); concurrent callers wait. `cancel` (may
  // be null) is polled between prompt chunks and lookahead tokens: CANCELLED once it is set, so
  // that work nobody waits for any more (the scheduler's deadline passed) frees the engine.
  absl::StatusOr<DraftResult> Score(const DraftRequest& request,
                                    const CancelToken* cancel = nullptr);

 private:
  DraftEngine() = default;
  DraftEngineOptions options_;
  int depth_ = 0;
  int lookahead_depth_ = 0;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<LoadedModel> model_;
  KvLayout kv_layout_;  // the draft's KV, made per request (ContiguousKvCache) and freed with it
  int context_ = 0;     // prompt + lookahead tokens at most
  std::unique_ptr<ForwardWorkspace> ws_;
  ForwardPlan plan_;            // depth_ layers: the map alone
  ForwardPlan lookahead_plan_;  // lookahead_depth_ layers: the prompt's pass and the lookahead
  Mutex mu_;
};

}  // namespace tripod
