// A client's completion request as the scheduler works with it, whichever door it came in by
// (HTTP /v1/completions, /v1/chat/completions, or gRPC Completion), and the error shape every
// door answers with. Parsing and validation live in openai_request.h; this is the contract
// between the front ends and the request lifecycle.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/compute/pop_control.h"
#include "common/model/chat_template.h"
#include "common/model/sampler.h"

namespace tripod::scheduler {

enum class ApiKind {
  kCompletion,      // /v1/completions: prompt -> text
  kChatCompletion,  // /v1/chat/completions: messages -> assistant message
};

// An OpenAI-shaped error: {"error":{"message","type","param","code"}} with an HTTP status.
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";  // or "authentication_error", "not_found_error",
                                               // "rate_limit_error", "server_error", ...
  std::string param;                           // the offending field; empty: null
  std::string code;                            // short machine-readable code; empty: null
};

// Which POP plan the prefill worker runs (the request's tripod.pop).
struct PopChoice {
  enum class Kind { kDefault, kOff, kOn, kRatio };
  Kind kind = Kind::kDefault;  // kDefault: the scheduler's --pop
  std::string ratio;           // kRatio: "1/3", "0.25" (validated: 0 <= ratio < 1)
  // tripod.pop_variant: one of POP's controls at `ratio` (kRatio only), run by both workers.
  PopVariant variant = PopVariant::kPop;
  bool control() const { return variant != PopVariant::kPop; }
};

// A compression method (docs/algorithms.md), the request's tripod.method.
enum class DraftMethod {
  kNone,
  kSpecKv,    // the draft's lookahead scores the KV on the prefill worker, trimmed per head
  kSpecPc,    // the draft's attention compresses the prompt before prefill
  kDraftMap,  // the draft's kept positions trim the KV, the same in every layer and head
  kSnapKv,    // baselines on the prefill worker, no draft
  kStreamingLlm,
  kPyramidKv,
  kKeepLast,  // prompt compression's baseline: the prompt's last `budget` tokens (no draft)
};

// The method and its budget (tripod.method, tripod.budget).
struct MethodChoice {
  DraftMethod method = DraftMethod::kNone;
  int budget_tokens = 0;       // > 0: tokens kept
  double budget_fraction = 0;  // else this fraction of the prompt, in (0, 1)
};

enum class ToolChoice { kAuto, kNone, kRequired, kNamed };

struct CompletionRequest {
  ApiKind kind = ApiKind::kCompletion;
  std::string model;  // as the client named it (checked against the served names)

  // The input: exactly one is set by the parser.
  std::string prompt_text;          // kCompletion, prompt given as text
  std::vector<int32_t> prompt_ids;  // kCompletion, prompt given as token ids
  bool prompt_is_ids = false;
  std::vector<ChatMessage> messages;  // kChatCompletion

  // Generated tokens at most; -1: not given (the lifecycle uses context - prompt). 0 only with
  // echo: the prompt alone comes back (lm-evaluation-harness scores a prompt this way).
  int max_tokens = -1;
  std::string max_tokens_param = "max_tokens";  // the field it came from, for errors
  SamplingParams sampling;  // temperature default 1 as OpenAI's; top_logprobs below
  bool has_seed = false;    // sampling.seed came from the client; else the lifecycle draws one
  std::vector<std::string> stop;
  bool include_stop_str = false;  // vLLM's include_stop_str_in_output: the stop string is output
  std::vector<int32_t> stop_token_ids;  // sorted, each once (vLLM's)
  int min_tokens = 0;                   // vLLM's
  bool ignore_eos = false;
  // A structured output (response_format, guided_*; scheduler/structured_output.h): the regex
  // the whole output must match, checked. Empty: none.
  std::string output_regex;

  // Choices returned and candidates generated (choices.h): 1 <= n <= best_of.
  int n = 1;
  int best_of = 1;

  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage

  // Log-probabilities: completions' `logprobs: k` or chat's `logprobs: true` + `top_logprobs: k`.
  bool logprobs = false;  // report the sampled token's log-probability (sampling.top_logprobs:
                          // how many alternatives)
  std::string user;

  // Completions' echo: the prompt's text before the completion's; with logprobs, the prompt
  // tokens' log-probabilities before the completion's (OpenAI's shape).
  bool echo = false;
  // vLLM's prompt_logprobs: the prompt tokens' log-probabilities with this many alternatives each,
  // in vLLM's `prompt_logprobs` field; -1: not asked.
  int vllm_prompt_logprobs = -1;
  // What the decode worker computes: the prompt tokens' log-probabilities with this many
  // alternatives (the larger of what echo + logprobs and prompt_logprobs ask); -1: none. Such a
  // request runs the full model over the whole prompt on the decode worker (route_plan.h).
  int prompt_logprobs = -1;

  PopChoice pop;
  MethodChoice method;

  // Chat tool calling (tool_calls.h): each tool's JSON as the template renders it, the names,
  // and the choice; "none" leaves the tools out of the prompt and the output as plain content.
  std::vector<std::string> tools_json;
  std::vector<std::string> tool_names;
  ToolChoice tool_choice = ToolChoice::kAuto;
  std::string tool_choice_name;  // kNamed
  bool parallel_tool_calls = true;
  bool ParsesToolCalls() const { return !tools_json.empty() && tool_choice != ToolChoice::kNone; }
};

}  // namespace tripod::scheduler
