// The FLOP count of a prefill under a plan, for the speed-up POP should give: linear layers
// (Q|K|V, output, gate|up, down), attention's QK^T and PV over the causal triangle, and the
// K/V-only projections of skipped layers. Elementwise work (norms, RoPE, SwiGLU, softmax) and
// the embedding lookup are left out; no output head (neither prefill runs one). It is the
// model's arithmetic for the plan, not what a pass runs: a pass that outputs no logits (the
// prefill worker's) stops its last layer after the K/V (Forward), whatever the plan, so against
// such a full pass POP saves one layer less when it skips the last layer.
#pragma once

#include "common/compute/plan.h"
#include "common/model/model_config.h"

namespace tripod {

// FLOPs (multiply and add counted separately) of running n_tokens tokens at positions
// 0..n_tokens-1 through `plan` from an empty cache.
double PrefillFlops(const ModelConfig& config, const ForwardPlan& plan, int n_tokens);

}  // namespace tripod
