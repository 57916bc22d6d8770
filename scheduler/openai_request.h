// Parsing and validation of completion requests: the HTTP bodies of /v1/completions and
// /v1/chat/completions (as OpenAI's and vLLM's servers accept them) and the gRPC
// tripod.v1.CompletionRequest, into one CompletionRequest. Both doors share one set of range
// checks, so a value refused over HTTP is refused over gRPC with the same message and param.
//
// Accepted fields and limits (docs/openapi.yaml describes the same):
//   model              string, required over HTTP (gRPC: empty = the served model)
//   prompt             (completions) a string, [string], [ids], or [[ids]]; not empty
//   messages           (chat) non-empty list of {role, content}; content a string or a list of
//                      {"type":"text","text"} parts (concatenated); roles system, user, assistant,
//                      developer (-> system), tool (tool_calls.h); function refused
//   tools, tool_choice, parallel_tool_calls   (chat) tool_calls.h
//   max_tokens, max_completion_tokens   1..2^31-1 (both given: max_completion_tokens wins); 0
//                      too with echo (the prompt alone: lm-evaluation-harness's loglikelihood)
//   temperature        [0, 2]
//   top_p              (0, 1] (below the smallest float: that float)
//   top_k              -1..2^31-1 (-1, 0 = off)
//   min_p              [0, 1]
//   repetition_penalty [0.01, 100] (1 = off)
//   presence_penalty, frequency_penalty   [-2, 2]
//   stop               a string or a list of at most kMaxStops strings of 1..kMaxStopBytes bytes
//   seed               an integer in [-2^63, 2^64); negative seeds wrap to uint64. Absent: the
//                      lifecycle draws one (has_seed false)
//   n, best_of         n 1..128, best_of n..128 (choices.h; --max_n lowers both); best_of > 1
//                      not with stream
//   logprobs           completions: 0..20 (top tokens reported); chat: a boolean, with
//                      top_logprobs 0..20 (which needs logprobs true)
//   logit_bias         {"token id": bias in [-100, 100]}, at most 1024 tokens, ids in the
//                      vocabulary (checked with the model)
//   stop_token_ids     vLLM's: up to kMaxStopTokenIds ids in the vocabulary; the completion
//                      stops at any of them (its text kept unless it is a control token)
//   min_tokens         vLLM's: 0..max_tokens; no end-of-generation or stop token before
//                      (stop strings still apply)
//   echo               completions: the prompt's text (and with logprobs its tokens'
//                      log-probabilities) before the completion's; chat: only false
//   prompt_logprobs    vLLM's: 0..20, the prompt tokens' log-probabilities in vLLM's shape.
//                      With echo + logprobs, refused beside tripod.pop on/a ratio > 0, a
//                      pop_variant or a method (they would not be the full model's numbers)
//   include_stop_str_in_output   vLLM's: a matched stop string ends the text
//   response_format, guided_json, guided_regex, guided_choice, structured_outputs
//                      structured outputs, at most one (scheduler/structured_output.h)
//   stream, stream_options.include_usage (stream_options needs stream true), user, ignore_eos
//   tripod             {"pop": "off" | "on" | "" | ratio ("1/3", "0.25", or a number) in [0, 1),
//                       "pop_variant": "" | "pop" | "noboundary" | "nokv" | "shortgpt" (POP's
//                                 controls, common/compute/pop_control.h; a control needs "pop"
//                                 as a ratio and no "method"),
//                       "method": "" | "none" | "speckv" | "specpc" | "draftmap" | "snapkv" |
//                                 "pyramidkv" | "streamingllm" | "keeplast",
//                       "budget": tokens kept (a whole number >= 1) or a fraction of the prompt
//                                 in (0, 1) (0.25 or "1/4"); required with a method, refused
//                                 without one}
// Null counts as absent everywhere. Every other field, no-op and refusal is in the table of
// request_fields.h: a field it does not name is refused (400 naming it), never ignored; so are
// unknown keys of `tripod` and `stream_options`. gRPC takes the same fields (completion.proto)
// but stream_options, max_completion_tokens and structured_outputs (its guided_* equivalents do).
#pragma once

#include <string_view>

#include "scheduler/completion_request.h"
#include "scheduler/openai_json.h"
#include "tripod/v1/completion.pb.h"

namespace tripod::scheduler {

inline constexpr int kMaxStops = 16;
inline constexpr int kMaxStopTokenIds = 64;  // the decode worker's bound too (request.h)
inline constexpr int kMaxStopBytes = 256;
inline constexpr double kMaxTemperature = 2.0;
// vLLM takes any value > 0. Beyond these bounds a seen token is as good as banned (or forced)
// already, and logit / penalty could overflow a float.
inline constexpr double kMinRepetitionPenalty = 0.01;
inline constexpr double kMaxRepetitionPenalty = 100.0;

// An HTTP body of /v1/completions (kCompletion) or /v1/chat/completions (kChatCompletion).
ApiResult<CompletionRequest> ParseCompletionBody(std::string_view body, ApiKind kind);

// A gRPC request. The input oneof decides the kind (messages: chat); `stream` is the RPC's
// choice (Generate). The fields HTTP carries as JSON (messages with their earlier calls, echo,
// structured outputs, tools) are handed to the same parsers as the JSON they stand for, so every
// rule and error is HTTP's.
ApiResult<CompletionRequest> CompletionRequestFromProto(const tripod::v1::CompletionRequest& proto,
                                                        bool stream = false);

// "off", "on", "" (the scheduler's default), or a ratio in [0, 1) as "a" or "a/b".
ApiResult<PopChoice> ParsePopChoice(std::string_view text);

}  // namespace tripod::scheduler
