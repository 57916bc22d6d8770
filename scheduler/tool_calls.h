// Tool calling in the chat API (OpenAI's `tools`, `tool_choice`, `parallel_tool_calls`): the
// request's tool definitions as the chat template renders them, and the model's output read back
// as tool calls. The output format is Qwen2.5's (and Hermes'): each call a JSON object
// {"name": ..., "arguments": {...}} between <tool_call> and </tool_call>, any plain text before
// the first call being the message's content.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "nlohmann/json.hpp"
#include "scheduler/completion_request.h"

namespace tripod::scheduler {

// `tools`: a list of {"type": "function", "function": {"name", "description"?, "parameters"?,
// "strict"?}}, in the order and with the keys the client sent (ordered, so that the rendering
// matches the model's template byte for byte). Fills request->tools_json and tool_names.
std::optional<ApiError> ParseTools(const nlohmann::ordered_json& tools, CompletionRequest* request);

// `tool_choice`: "none", "auto", "required" or {"type": "function", "function": {"name"}}
// naming one of the tools.
std::optional<ApiError> ParseToolChoice(const nlohmann::json& choice, CompletionRequest* request);

// An assistant message's `tool_calls` (history): [{"id"?, "type": "function", "function":
// {"name", "arguments"}}]; arguments a JSON string (OpenAI's shape) or an object. `at` names the
// message for errors ("messages[2]").
std::optional<ApiError> ParseHistoryToolCalls(const nlohmann::json& calls, const std::string& at,
                                              std::vector<ChatToolCall>* out);

struct ToolCall {
  std::string id;  // "call_" and 24 random hex digits
  std::string name;
  std::string arguments;  // JSON text, as Python's json.dumps writes it (vLLM's shape)
};

// "call_..." with 24 random hex digits.
std::string NewToolCallId();

// A whole output: the calls, and the content before the first one (nullopt: none, or only
// white space). Output whose blocks do not all parse is content, with no calls (as vLLM's
// parser does). `max_calls` 1 keeps the first call only (parallel_tool_calls false).
struct ParsedOutput {
  std::optional<std::string> content;
  std::vector<ToolCall> calls;
};
ParsedOutput ParseToolCallOutput(std::string_view text, int max_calls);

// The same for a stream: text in, content deltas and whole calls out. Text that may begin
// "<tool_call>" is held back until it does or cannot; a call is sent once its closing tag
// arrives (an unterminated block at the end is parsed when the stream ends, content if it does
// not parse). White space between and after calls is dropped.
class ToolCallStream {
 public:
  explicit ToolCallStream(int max_calls) : max_calls_(max_calls) {}

  struct Output {
    std::string content;          // may be empty
    std::vector<ToolCall> calls;  // completed calls, in order
  };
  Output Feed(std::string_view text);
  Output Finish();

  int calls_sent() const { return calls_sent_; }

 private:
  void Drain(Output* out, bool at_end);

  const int max_calls_;
  std::string pending_;  // held back: inside a call, or a possible start of one
  bool in_call_ = false;
  bool content_sent_ = false;
  int calls_sent_ = 0;
};

// A choice that stopped on its own after making calls ends "tool_calls" (OpenAI's shape); any
// other end is kept.
std::string FinishReasonAfterCalls(const std::string& finish_reason, bool made_calls);

// The streams of a request's choices (n > 1), each its own ToolCallStream, and the index each
// choice's next call gets (OpenAI numbers a choice's calls from 0). Shared by the SSE and gRPC
// streams. Not thread-safe.
class ChoiceToolCallStreams {
 public:
  explicit ChoiceToolCallStreams(int max_calls) : max_calls_(max_calls) {}

  struct Piece {
    std::string content;
    std::vector<ToolCall> calls;
    int first_index = 0;  // calls[i]'s index in its choice: first_index + i
  };
  Piece Feed(int choice, std::string_view text);
  // The choice's end: what it still held, and *finish_reason as FinishReasonAfterCalls makes it.
  Piece Finish(int choice, std::string* finish_reason);

 private:
  ToolCallStream& Of(int choice);
  Piece Counted(int choice, ToolCallStream::Output out);

  const int max_calls_;
  std::vector<std::unique_ptr<ToolCallStream>> streams_;  // by choice
  std::vector<int> sent_;                                 // by choice: calls passed on
};

}  // namespace tripod::scheduler
