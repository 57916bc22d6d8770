// Stage-aware layer importance for POP (docs/algorithms.md, "Importance"): per layer, how much the
// loss on self-generated answers depends on the layer's branches at prefill-stage positions
// (prompt tokens 0..n-2) and at decode-stage positions (the last prompt token and the answer).
// I = E[(dLoss/dg)^2], the derivative a central finite difference in a branch gate g (ForwardPlan
// gates); beside it the plain ablations (loss rise with the gate at 0).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "common/compute/backend.h"
#include "common/compute/model.h"
#include "common/kv/kv_layout.h"
#include "nlohmann/json.hpp"

namespace tripod {

struct PopImportanceOptions {
  int answer_tokens = 32;  // sampled from the model itself (temperature 1, no truncation)
  double eps = 0.05;       // gates 1 +- eps
  uint64_t seed = 1;       // answer i is sampled with seed + i
  KvDtype kv_dtype = KvDtype::kF32;
  std::vector<int> layers;  // the layers to analyse; empty = all
};

struct LayerImportance {
  // Per sample: dLoss/dg for the prefill-stage and decode-stage gate, and the loss rise with
  // that gate at 0.
  std::vector<double> d_prefill, d_decode, ablate_prefill, ablate_decode;
};

struct PopImportanceResult {
  int n_layers = 0;
  std::vector<int> prompt_tokens;
  std::vector<double> base_loss;  // per sample: mean NLL of the answer, all gates 1
  std::vector<LayerImportance> layers;
  PopImportanceOptions options;
  double seconds = 0;
};

// Runs the analysis over `prompts` (each >= 2 tokens). progress(i) after sample i.
absl::StatusOr<PopImportanceResult> PopImportance(
    const LoadedModel& model, Backend& backend, const std::vector<std::vector<int32_t>>& prompts,
    const PopImportanceOptions& options, const std::function<void(int)>& progress = nullptr);

// Per layer: importance (mean squared derivative) per stage with standard errors, mean signed
// derivative, mean ablation rise; plus the per-sample data.
nlohmann::json PopImportanceToJson(const PopImportanceResult& result);

// A plain-text table of the same (one line per layer).
std::string PopImportanceTable(const PopImportanceResult& result);

}  // namespace tripod
