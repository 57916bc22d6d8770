// What flows back to a front end while a request runs: generated tokens (with their final text),
// then the end (finish reason, usage, the stages' timing). The request lifecycle produces these
// from the decode worker's stream; the front ends (HTTP/SSE, gRPC) format them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/model/sampler.h"

namespace tripod::scheduler {

struct GeneratedToken {
  int32_t id = -1;
  std::string text;  // new final text this token released (may be empty: an incomplete UTF-8
                     // sequence or a possible stop string held back)
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;  // most likely first
  int choice = 0;                 // which of the request's choices (n, best_of; choices.h)
};

// One choice of a whole answer: its tokens and how it ended.
struct ChoiceOutput {
  int index = 0;
  std::vector<GeneratedToken> tokens;
  std::string finish_reason;  // "stop", "length"
};

// A prompt token's log-probability under the full model (raw: before bias and penalties), for
// echo with logprobs and vLLM's prompt_logprobs. Prompt token 0 has none.
struct PromptLogprob {
  int position = 0;  // 1..n-1
  int32_t id = -1;
  float logprob = 0.0f;
  int32_t rank = 0;               // 1 + the tokens likelier than it
  std::vector<TokenLogprob> top;  // most likely first
};

struct UsageCounts {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;  // prompt tokens whose KV came from a prefix cache
};

// What became of the request's compression method (tripod.method).
struct MethodReport {
  std::string name;  // empty: none asked
  int budget = 0;    // tokens, resolved against the prompt
  bool applied = false;
  std::string fallback;   // why it was not applied (the request ran without it)
  int prompt_tokens = 0;  // the prompt the workers saw (SpecPC: the kept tokens)
  int kv_entries = 0;     // KV entries per layer and head transferred when trimmed
  int64_t kv_bytes_saved = 0;
};

// Each stage measured inside one process; -1 where a stage did not run.
struct StageTimes {
  double queue_s = 0;         // scheduler: accepted -> sent to the workers
  double draft_s = -1;        // draft worker
  double prefill_s = -1;      // prefill worker: queue + compute
  double transfer_s = -1;     // prefill worker: transfer time not hidden under compute
  double first_token_s = -1;  // decode worker: Generate accepted -> first token
  double decode_s = -1;       // decode worker: first token -> last token
  double total_s = 0;         // scheduler: accepted -> last token
  std::string route;          // "disaggregated", "decode_only", "retried_prefill", "local_fallback"
  MethodReport method;
};

// How a request ended: "stop", "length", or (stream cut short by the server) "cancelled".
struct CompletionEnd {
  std::string finish_reason;
  UsageCounts usage;
  StageTimes times;
};

}  // namespace tripod::scheduler
