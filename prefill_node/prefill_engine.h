// PrefillEngine: POP prefill of one prompt on a pruned model. It loads only what its plan needs
// (kept layers in full; the skipped layers' norm and K/V weights, stacked into one GEMM; no
// output head) and computes the KV of prompt tokens 0..n-2 for every layer. The last prompt
// token is not prefilled (the boundary rule): whoever decodes runs it through the full model
// first, at position n-1, and its logits give the first output token.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/compute/backend.h"
#include "common/compute/forward.h"
#include "common/compute/model.h"
#include "common/compute/plan.h"
#include "common/kv/kv_snapshot.h"
#include "prefill_node/pop_config.h"

namespace tripod {

struct PrefillOptions {
  std::string model_path;          // empty: BundledModelPath()
  std::string precision = "auto";  // fp32 | bf16 | int8 | int16 | auto (CpuOptionsForPrecision)
  PopConfig pop;
  int chunk = 1024;      // prompt tokens per forward, so that long prompts fit
  bool stack_kv = true;  // the skipped layers' K/V as one GEMM (false: one per layer)
};

struct PrefillResult {
  KvSnapshot kv;  // tokens 0..n-2, all layers; plan_key and token_ids filled
  int32_t last_token = 0;
  int32_t last_position = 0;  // n - 1
  double forward_s = 0;       // the forward passes
  double export_s = 0;        // copying the KV out of the cache into the snapshot
  int chunks = 0;
};

class PrefillEngine {
 public:
  static absl::StatusOr<std::unique_ptr<PrefillEngine>> Create(const PrefillOptions& options);

  // Prefills prompt[0..n-2]; n >= 1 (a one-token prompt gives an empty snapshot).
  absl::StatusOr<PrefillResult> Run(const std::vector<int32_t>& prompt);

  const ForwardPlan& plan() const { return plan_; }
  const std::vector<int>& skipped_layers() const { return skipped_; }
  const LoadedModel& model() const { return *model_; }
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

// The weight selection a POP prefill worker loads for `skipped` layers of an n_layers model.
WeightSelection PrefillSelection(int n_layers, const std::vector<int>& skipped);

// Resident weight bytes of the full model (all layers and the head) on a fresh backend of the
// given precision, for the report beside PrefillEngine::resident_weight_bytes().
absl::StatusOr<size_t> FullModelWeightBytes(const std::string& model_path,
                                            const std::string& precision);

}  // namespace tripod
