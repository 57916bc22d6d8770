// What bench/gpu_check (on the GPU) and bench/gpu_reference (on the CPU) share: the prompt and
// the greedy loop both run, through the one forward pass on whichever backend.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/compute/forward.h"
#include "common/compute/model.h"
#include "common/kv/contiguous_kv_cache.h"
#include "common/util/status_macros.h"
#include "draft_node/draft_engine.h"

namespace tripod::gpu_check {

inline constexpr char kPrompt[] =
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
    "combined movable metal type, an oil-based ink and a wooden press adapted from those used "
    "for wine. Within fifty years printing shops had spread to more than two hundred cities "
    "across Europe, and the cost of books fell sharply. Explain in a few sentences why the "
    "printing press changed how ideas travelled:";
inline constexpr int kGreedyTokens = 32;

// The draft worker's engine on both sides: an 8-layer self-draft scoring the prompt for SpecPC
// (keep 32 tokens, window 16, small pools for a short prompt) and 8 lookahead tokens.
inline DraftEngineOptions DraftOptions(const std::string& model) {
  DraftEngineOptions o;
  o.model_path = model;
  o.self_draft_layers = 8;
  o.context_tokens = 512;
  return o;
}
inline DraftRequest DraftRequestFor(const std::vector<int32_t>& prompt) {
  DraftRequest r;
  r.prompt = prompt;
  r.specpc.budget = 32;
  r.specpc.window = 16;
  r.specpc.pool_kernel = 7;
  r.specpc.neighbourhood = 4;
  r.lookahead = 8;
  return r;
}

struct GreedyRun {
  std::vector<float> first_logits;  // after the prompt: [vocab]
  std::vector<int32_t> tokens;      // greedy continuation
  double prefill_s = 0;
};

inline int32_t Argmax(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// Prefills `prompt` in one batch and decodes n greedy tokens one at a time (f16 KV).
template <class Clock>
absl::StatusOr<GreedyRun> RunGreedy(const LoadedModel& m, Backend& backend,
                                    const std::vector<int32_t>& prompt, int n, KvDtype kv_dtype) {
  const ModelConfig& c = m.config;
  KvLayout layout{c.n_layers, c.n_kv_heads, c.head_dim, kv_dtype};
  ASSIGN_OR_RETURN(std::unique_ptr<ContiguousKvCache> kv,
                   ContiguousKvCache::Create(layout, 1, static_cast<int>(prompt.size()) + n + 16,
                                             backend.DeviceKvMemory()));
  ForwardWorkspace ws(backend);
  const ForwardPlan plan = ForwardPlan::Full(c.n_layers);
  GreedyRun run;
  std::vector<float> logits;
  StepBatch batch;
  batch.AddSequence(0, prompt.data(), static_cast<int>(prompt.size()), 0, 0, true);
  const auto t0 = Clock::now();
  RETURN_IF_ERROR(Forward(m, backend, plan, batch, *kv, ws, &logits));
  run.prefill_s = std::chrono::duration<double>(Clock::now() - t0).count();
  run.first_logits = logits;
  int32_t pos = static_cast<int32_t>(prompt.size());
  for (int i = 0; i < n; ++i) {
    const int32_t next = Argmax(logits);
    run.tokens.push_back(next);
    if (i + 1 == n) break;
    StepBatch step;
    step.AddSequence(0, &next, 1, pos, pos, true);
    RETURN_IF_ERROR(Forward(m, backend, plan, step, *kv, ws, &logits));
    ++pos;
  }
  return run;
}

}  // namespace tripod::gpu_check
