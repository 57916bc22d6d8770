// Quality of POP (Prefill-Only Pruning, docs/algorithms.md) against the full model, and of its
// controls, on corpus windows: mean next-token KL(full || method) over a teacher-forced
// continuation, greedy agreement over generated tokens, and the continuation's perplexity.
// Drives the shared forward pass with ForwardPlans; needs no prefill engine.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/compute/backend.h"
#include "common/compute/model.h"
#include "common/compute/plan.h"
#include "common/kv/kv_layout.h"
#include "eval/pop/corpus_windows.h"
#include "nlohmann/json.hpp"

namespace tripod {

enum class PopMethodKind : uint8_t {
  kPop,         // skipped layers K/V-only for tokens 0..n-2; the last token and after: full
  kShortGpt,    // the same layers removed in both stages (kSkip everywhere)
  kNoBoundary,  // all n prompt tokens through the pruned plan; first logits from it
  kNoKv,        // skipped layers write no K/V in prefill, and see nothing of the prompt later
};

struct PopMethod {
  PopMethodKind kind = PopMethodKind::kPop;
  double ratio = 0;          // skipped layers: the last floor(L * ratio)
  std::string name() const;  // e.g. "pop@0.333", "shortgpt@0.333"
};

// ratio 0, 0.2, 0.25, 1/3, 0.4, 0.5 under POP, then the three controls at 1/3.
std::vector<PopMethod> DefaultPopMethods();
// "pop:0.25", "shortgpt:1/3", "noboundary:0.333", "nokv:0.4" (comma separated list).
absl::StatusOr<std::vector<PopMethod>> ParsePopMethods(const std::string& spec);

// The last floor(n_layers * ratio) layers (ratio in [0, 1)).
std::vector<int> PopSkippedLayers(int n_layers, double ratio);
// The last k layers.
std::vector<int> PopSkippedLayersCount(int n_layers, int k);

struct PopEvalOptions {
  int generate_tokens = 32;  // greedy agreement over this many generated tokens
  KvDtype kv_dtype = KvDtype::kF16;
};

struct PopMethodResult {
  PopMethod method;
  std::vector<int> skipped;
  // Per prompt: mean KL over the continuation, greedy agreement, mean continuation NLL, and
  // whether the first greedy token matches.
  std::vector<double> kl, agreement, nll;
  std::vector<int> first_token_match;
};

struct PopEvalResult {
  int n_layers = 0;
  std::vector<int> prompt_tokens;  // per prompt
  int continuation_tokens = 0;
  int generate_tokens = 0;
  std::vector<double> full_nll;  // per prompt, the full model's mean continuation NLL
  std::vector<PopMethodResult> methods;
  double seconds = 0;
};

// Evaluates every method on every window (each window's continuation must hold at least one
// token). The full model's run is shared by all methods, and each prompt is prefilled once per
// distinct prefill: the full model's (the reference, POP at 0, ShortGPT, no-K/V: their kept
// layers' K/V are the full model's and their skipped layers' are never read) and POP's at each
// ratio (shared with the no-boundary control). progress(i) is called after window i.
absl::StatusOr<PopEvalResult> EvalPop(const LoadedModel& model, Backend& backend,
                                      const std::vector<CorpusWindow>& windows,
                                      const std::vector<PopMethod>& methods,
                                      const PopEvalOptions& options,
                                      const std::function<void(int)>& progress = nullptr);

// Summary (means, standard errors, perplexity) and per-prompt figures.
nlohmann::json PopEvalToJson(const PopEvalResult& result);

// Puts back together the per-prompt figures of several runs (shards of the prompts, same
// configs) printed by PopEvalToJson; `seconds` adds up.
absl::StatusOr<PopEvalResult> MergePopEvalJson(const std::vector<nlohmann::json>& shards);

}  // namespace tripod
