// What an answer gives back of its prompt: completions' echo (the prompt's text before the
// completion's; with logprobs its tokens' entries first in OpenAI's logprobs object) and vLLM's
// prompt_logprobs field. The log-probabilities come from the decode worker, which prefilled the
// whole prompt with the full model for them (route_plan.h); the formatters here shape them.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/model/tokenizer.h"
#include "nlohmann/json.hpp"
#include "scheduler/completion_events.h"
#include "scheduler/completion_request.h"

namespace tripod::scheduler {

struct PromptEcho {
  bool echo = false;                    // completions' echo
  bool echo_logprobs = false;           // echo with logprobs: the prompt's entries in `logprobs`
  int vllm_prompt_logprobs = -1;        // the prompt_logprobs field's alternatives; -1: no field
  std::string text;                     // the prompt as text (a token-id prompt decoded)
  std::vector<int32_t> ids;             // the prompt's tokens
  std::vector<PromptLogprob> logprobs;  // positions 1.. as they came, in order

  bool any() const { return echo || vllm_prompt_logprobs >= 0; }
};

// For `request`, whose prompt tokenized to `prompt`.
PromptEcho MakePromptEcho(const CompletionRequest& request, std::span<const int32_t> prompt,
                          const Tokenizer& tokenizer);

// OpenAI's completions logprobs for the prompt's tokens: their pieces, token_logprobs and
// top_logprobs (null for the first token, which has no logits before it), text_offset (code
// points of the pieces before each, from 0, as vLLM counts them). *offset is then the echoed
// text's length in code points, where the completion's offsets go on.
nlohmann::ordered_json EchoLogprobs(const PromptEcho& echo, int top_logprobs,
                                    const Tokenizer& tokenizer, int64_t* offset);

// vLLM's prompt_logprobs: null for the first token, then per token {"<id>": {"logprob", "rank",
// "decoded_token"}} for the token itself and the vllm_prompt_logprobs likeliest.
nlohmann::ordered_json VllmPromptLogprobs(const PromptEcho& echo, const Tokenizer& tokenizer);

// Appends the arrays of `more` (a completions logprobs object) to those of `*into`.
void AppendLogprobs(nlohmann::ordered_json more, nlohmann::ordered_json* into);

}  // namespace tripod::scheduler
