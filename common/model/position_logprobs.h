// The model's own log-probabilities at one position, for a token that is already known (a prompt
// token, vLLM's prompt_logprobs and OpenAI's echo): the raw log-softmax of the logits, before any
// logit bias, penalty, temperature or truncation, as vLLM reports prompt log-probabilities. With
// none of those set, the sampler reports the same numbers for the tokens it draws.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/model/sampler.h"

namespace tripod {

struct PositionLogprobs {
  float logprob = 0.0f;  // of the given token
  // 1 + the tokens ranked above it (likelier, or as likely with a lower id): vLLM's rank.
  int32_t rank = 0;
  std::vector<TokenLogprob> top;  // the top_k likeliest, most likely first (ties: lower id)
};

// logits: [vocab] of the position before `token`; token in [0, vocab). NaN logits count as -inf,
// as the sampler counts them. top_k is clamped to [0, vocab].
PositionLogprobs LogprobsAt(std::span<const float> logits, int32_t token, int top_k);

}  // namespace tripod
