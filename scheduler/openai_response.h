// Formatting of answers for the OpenAI-compatible API and the gRPC client API, from the
// lifecycle's GeneratedToken / CompletionEnd (completion_events.h): whole responses
// (text_completion, chat.completion), SSE streams (text_completion and chat.completion.chunk
// chunks, the usage chunk, [DONE], mid-stream errors), logprobs in both of OpenAI's shapes, the
// model list, the gRPC messages, and the ApiError <-> gRPC status mapping.
//
// Conventions:
//  - A GeneratedToken with id < 0 carries text only (text released at the end, e.g. what a
//    possible stop string held back); it adds no logprobs entry and no token id.
//  - Token text in logprobs is the token's decoded piece (TokenPiece); chat's `bytes` are its
//    raw bytes, so a token that splits a UTF-8 character shows U+FFFD in `token` and the true
//    bytes in `bytes`. Non-finite log-probabilities are written as -9999.0 (as vLLM does).
//  - completions' text_offset counts Unicode code points of the text before the token's text
//    (Python's len, as vLLM does); with echo the echoed prompt comes first (prompt_echo.h).
//  - Our `tripod` timing object always has every key; a stage that did not run is null.
//  - Streams: the timing rides on the chunk carrying finish_reason and, with include_usage, on
//    the final usage chunk too. With include_usage every other chunk has "usage": null
//    (OpenAI's shape).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/model/tokenizer.h"
#include "grpcpp/support/status.h"
#include "nlohmann/json.hpp"
#include "scheduler/completion_events.h"
#include "scheduler/completion_request.h"
#include "scheduler/prompt_echo.h"
#include "scheduler/tool_calls.h"
#include "tripod/v1/completion.pb.h"

namespace tripod::scheduler {

// What every piece of one answer repeats.
struct ResponseContext {
  ApiKind kind = ApiKind::kCompletion;
  std::string id;       // "cmpl-..." / "chatcmpl-..."
  std::string model;    // the served model's name
  int64_t created = 0;  // Unix seconds
  bool logprobs = false;
  int top_logprobs = 0;
  bool include_usage = false;
  // Chat with tools (tool_choice not none): the output is read back as tool calls (tool_calls.h);
  // max_tool_calls 1 when parallel_tool_calls is false.
  bool parse_tool_calls = false;
  int max_tool_calls = 0;
};

// "cmpl-" or "chatcmpl-" and 32 random hex digits.
std::string NewResponseId(ApiKind kind);
// From the parsed request; a fresh id.
ResponseContext MakeResponseContext(const CompletionRequest& request, std::string model,
                                    int64_t created_unix_s);

// The text of one token as it appears in decoded output (a SentencePiece word's leading space
// included), raw bytes.
std::string TokenPiece(const Tokenizer& tokenizer, int32_t id);

nlohmann::ordered_json UsageJson(const UsageCounts& usage);
nlohmann::ordered_json TimingJson(const StageTimes& times);

// vLLM writes -inf log-probabilities as -9999.0: JSON has no infinity.
double FiniteLogprob(float logprob);
// Unicode code points of UTF-8 text (Python's len, as vLLM counts text offsets).
int64_t CodePoints(std::string_view text);

// A whole answer: a text_completion or chat.completion object; `echo` (may be null) adds what it
// gives back of the prompt (prompt_echo.h).
std::string CompletionResponseBody(const ResponseContext& ctx,
                                   std::span<const GeneratedToken> tokens, const CompletionEnd& end,
                                   const Tokenizer& tokenizer, const PromptEcho* echo = nullptr);
// The same with several choices (n > 1, choices.h), in the given order, each with its index
// and finish_reason; each completion choice gives the echoed prompt back.
std::string CompletionResponseBody(const ResponseContext& ctx,
                                   std::span<const ChoiceOutput> choices, const CompletionEnd& end,
                                   const Tokenizer& tokenizer, const PromptEcho* echo = nullptr);

// One stream's SSE events ("data: {...}\n\n"), in order: Start, Tokens (any number of times),
// Finish. Keeps each choice's text offset across chunks. Not thread-safe. With n > 1 choices
// each chunk carries one choice's index; a choice that ends gets its FinishChoice chunk, the
// last one Finish's.
class SseStream {
 public:
  SseStream(ResponseContext ctx, const Tokenizer& tokenizer);

  // chat: the chunk with delta {"role":"assistant","content":""} for each of n choices;
  // completions: "" (none).
  std::string Start(int n = 1);
  // The chunks of what the answer gives back of its prompt, one per choice, before the first
  // token's (vLLM sends the echoed prompt first): completions' echoed text (with logprobs its
  // tokens' entries) and prompt_logprobs (chat: beside the choices); "" when none is asked.
  std::string Prompt(const PromptEcho& echo, int n = 1);
  // One chunk for these tokens of choice `index` (several when a front end coalesces); "" when
  // there is nothing to send (no text and no logprobs wanted).
  std::string Tokens(std::span<const GeneratedToken> tokens, int index = 0);
  // A choice's finish_reason chunk while others go on (n > 1).
  std::string FinishChoice(int index, const std::string& finish_reason);
  // The finish_reason chunk (empty delta / text) of the last choice, the usage chunk when
  // include_usage, and "data: [DONE]".
  std::string Finish(const CompletionEnd& end, int index = 0);

  const ResponseContext& context() const { return ctx_; }

 private:
  nlohmann::ordered_json ChunkHeader() const;
  nlohmann::ordered_json FinishChunk(int index, const std::string& finish_reason) const;
  int64_t& TextOffset(int index);
  std::string PromptChunk(const PromptEcho& echo, int index);

  // Chat with tools: the chunk of what choice `index`'s tool-call reader let through ("" when
  // nothing), and its end (finish_reason "tool_calls" after a call).
  std::string ToolCallChunk(const ChoiceToolCallStreams::Piece& piece,
                            std::span<const GeneratedToken> tokens, int index);
  std::string FlushToolCalls(int index, std::string* finish_reason);

  ResponseContext ctx_;
  const Tokenizer* tokenizer_;
  std::vector<int64_t> text_offsets_;  // by choice: code points of its generated text so far
  std::optional<ChoiceToolCallStreams> tool_calls_;  // chat with tools only
};

// "data: <json>\n\n".
std::string SseEvent(const nlohmann::ordered_json& payload);
// A mid-stream error, as vLLM sends it: data: {"error":{...}}\n\n (the stream then ends without
// [DONE]).
std::string SseErrorEvent(const ApiError& error);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

// GET /v1/models.
struct ModelCard {
  std::string id;
  int64_t created = 0;
  int max_model_len = 0;
};
std::string ModelsListBody(std::span<const ModelCard> models);

// gRPC: a chunk of tokens, the final chunk (finish_reason, usage, timing), the whole response.
// Stages that did not run are 0 in StageTiming (proto3 has no null there).
void FillCompletionChunk(const ResponseContext& ctx, std::span<const GeneratedToken> tokens,
                         const Tokenizer& tokenizer, tripod::v1::CompletionChunk* out);
void FillFinalChunk(const ResponseContext& ctx, const CompletionEnd& end,
                    tripod::v1::CompletionChunk* out);
void FillCompletionResponse(const ResponseContext& ctx, std::span<const GeneratedToken> tokens,
                            const CompletionEnd& end, const Tokenizer& tokenizer,
                            tripod::v1::CompletionResponse* out);
// The same with several choices (choices.h's pick made), in the given order; choice 0's fill the
// response's single-choice fields too. `echo` (may be null) as CompletionResponseBody's: each
// completion choice's text begins with the echoed prompt, and the prompt's log-probabilities
// go once into prompt_logprobs.
void FillCompletionResponse(const ResponseContext& ctx, std::span<const ChoiceOutput> choices,
                            const CompletionEnd& end, const Tokenizer& tokenizer,
                            const PromptEcho* echo, tripod::v1::CompletionResponse* out);

// One Generate call's chunks, as SseStream's events: Prompt, Tokens (any number of times),
// FinishChoice (n > 1), Finish. Each chunk carries its choice's index; chat with tools sends
// each call whole with its index in the choice (ChoiceToolCallStreams). Not thread-safe.
class GrpcChunkStream {
 public:
  GrpcChunkStream(ResponseContext ctx, const Tokenizer& tokenizer);

  // What the answer gives back of its prompt, before the first token's chunk: with echo each
  // completion choice's prompt text, and the prompt's log-probabilities on choice 0's chunk.
  // None when nothing is asked.
  std::vector<tripod::v1::CompletionChunk> Prompt(const PromptEcho& echo, int n = 1);
  // These tokens of choice `index`; false when there is nothing to send (chat with tools, text
  // held back and no logprobs wanted).
  bool Tokens(std::span<const GeneratedToken> tokens, int index, tripod::v1::CompletionChunk* out);
  // A choice's end while others go on (n > 1).
  tripod::v1::CompletionChunk FinishChoice(int index, const std::string& finish_reason);
  // The last choice's end, with usage and timing.
  tripod::v1::CompletionChunk Finish(const CompletionEnd& end, int index = 0);

 private:
  ResponseContext ctx_;
  const Tokenizer* tokenizer_;
  std::optional<ChoiceToolCallStreams> tool_calls_;  // chat with tools only
};

// Appends the next chunk of the same choice (text, logprobs, calls) to `into`, as if they had
// come as one.
void MergeChunk(const tripod::v1::CompletionChunk& next, tripod::v1::CompletionChunk* into);

// The table of completion.proto: 400 INVALID_ARGUMENT, 401 UNAUTHENTICATED, 404 NOT_FOUND,
// 413 OUT_OF_RANGE, 429 RESOURCE_EXHAUSTED, 503 UNAVAILABLE, 500 INTERNAL; beyond it 403
// PERMISSION_DENIED, 499 CANCELLED, 504 DEADLINE_EXCEEDED, other 4xx INVALID_ARGUMENT, other
// 5xx INTERNAL.
grpc::StatusCode GrpcCodeForHttpStatus(int http_status);
int HttpStatusForGrpcCode(grpc::StatusCode code);
// OpenAI's error type for a status: invalid_request_error, authentication_error, ...
std::string DefaultErrorType(int http_status);
// The status's message is the JSON error body.
grpc::Status ToGrpcStatus(const ApiError& error);
// Reads the JSON error body back when the message is one; else the message as is, with the
// code's HTTP status and default type.
ApiError FromGrpcStatus(const grpc::Status& status);

}  // namespace tripod::scheduler
