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

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", ...
  std::string content;
};

struct ChatTemplate {
  ChatTemplateKind kind = ChatTemplateKind::kChatML;
  // Inserted as a system message when the first message is not one (SmolLM2, Qwen2); empty: none.
  std::string default_system;
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
std::string RenderChat(const ChatTemplate& tmpl, std::span<const ChatMessage> messages,
                       bool add_generation_prompt);
// The same text cut into template and content segments (their concatenation is RenderChat's).
std::vector<ChatSegment> RenderChatSegments(const ChatTemplate& tmpl,
                                            std::span<const ChatMessage> messages,
                                            bool add_generation_prompt);

// Tokenizes a rendered chat: template segments with special tokens parsed, content segments
// either way per `parse_special_in_content` (false keeps users from injecting control tokens).
// Prepends BOS when the tokenizer asks for it and the template did not already render it.
std::vector<int32_t> EncodeChat(const Tokenizer& tokenizer, std::span<const ChatSegment> segments,
                                bool parse_special_in_content);

}  // namespace tripod
