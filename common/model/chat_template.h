// Chat templates: recognises the GGUF `tokenizer.chat_template` of the model families we serve
// (ChatML: SmolLM2, Qwen2; Llama 3) and renders messages the way that Jinja template does.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/tokenizer.h"

namespace tripod {

enum class ChatTemplateKind { kChatML, kLlama3 };

// A call an earlier assistant turn made: rendered back into the prompt by templates with a tool
// format.
struct ChatToolCall {
  std::string name;
  std::string arguments;  // JSON text as the template's tojson writes it (python_json.h)
};

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", "tool", ...
  std::string content;
  std::vector<ChatToolCall> tool_calls;  // assistant turns only
};

struct ChatTemplate {
  ChatTemplateKind kind = ChatTemplateKind::kChatML;
  // Inserted as a system message when the first message is not one (SmolLM2, Qwen2); empty: none.
  std::string default_system;
  // The template has Qwen2.5's tool format: the tools listed in the system turn inside <tools>,
  // calls written as <tool_call> blocks, tool results as <tool_response> blocks in a user turn.
  bool qwen_tools = false;
};

// Recognises a Jinja chat template by its markers and reads its default system message, if
// any. An empty or unrecognised template is an error that says so.
absl::StatusOr<ChatTemplate> DetectChatTemplate(std::string_view gguf_template_text);
// "chatml" or "llama3" (no default system message).
absl::StatusOr<ChatTemplate> ChatTemplateByName(std::string_view name);

// One piece of a rendered chat: template text (may hold special tokens) or message content.
struct ChatSegment {
  std::string text;
  bool is_content = false;
};

// The prompt text, exactly as the model's template renders it (ChatML:
// "<|im_start|>role\ncontent<|im_end|>\n" per message; Llama 3: "<|begin_of_text|>" then
// "<|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>", content trimmed).
// `tools`: each tool definition as JSON text (the template's tojson of the request's object);
// only a template with a tool format (qwen_tools) renders tools, tool calls and tool messages, the
// caller refuses them for the others.
std::string RenderChat(const ChatTemplate& tmpl, std::span<const ChatMessage> messages,
                       bool add_generation_prompt, std::span<const std::string> tools = {});
// The same text cut into template and content segments (their concatenation is RenderChat's).
// Tool definitions, names and arguments are content: what a client sends never becomes a special
// token.
std::vector<ChatSegment> RenderChatSegments(const ChatTemplate& tmpl,
                                            std::span<const ChatMessage> messages,
                                            bool add_generation_prompt,
                                            std::span<const std::string> tools = {});

// Tokenizes a rendered chat: template segments with special tokens parsed, content segments
// either way per `parse_special_in_content` (false keeps users from injecting control tokens).
// Prepends BOS when the tokenizer asks for it and the template did not already render it.
std::vector<int32_t> EncodeChat(const Tokenizer& tokenizer, std::span<const ChatSegment> segments,
                                bool parse_special_in_content);

}  // namespace tripod
