// Chat templates: detection by marker tokens, the default system message read out of the
// template's literal text, and rendering that reproduces the Jinja output byte for byte.
#include "common/model/chat_template.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/model/tokenizer_bpe.h"

namespace tripod {
namespace {

constexpr std::string_view kImStartSystem = "<|im_start|>system";
constexpr std::string_view kImEnd = "<|im_end|>";

bool Contains(std::string_view haystack, std::string_view needle) {
  return haystack.find(needle) != std::string_view::npos;
}

// The literal after "<|im_start|>system" + newline up to "<|im_end|>", if it is plain text
// inside one Jinja string literal (no expression, no closing quote), with escapes undone.
// Templates write the newline either raw or as the escape "\n".
bool ReadSystemLiteral(std::string_view rest, std::string* out) {
  if (rest.starts_with("\n")) {
    rest.remove_prefix(1);
  } else if (rest.starts_with("\\n")) {
    rest.remove_prefix(2);
  } else {
    return false;
  }
  out->clear();
  for (size_t i = 0; i < rest.size(); ++i) {
    if (rest.substr(i).starts_with(kImEnd)) return !out->empty();
    const char c = rest[i];
    if (c == '\'' || c == '"' || c == '{' || c == '}') return false;
    if (c == '\\' && i + 1 < rest.size()) {
      const char e = rest[++i];
      out->push_back(e == 'n' ? '\n' : e == 't' ? '\t' : e);
      continue;
    }
    out->push_back(c);
  }
  return false;
}

// Python's str.strip(), which Jinja's trim filter is: Unicode white space at both ends.
bool IsPythonSpace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

std::string_view PythonStrip(std::string_view s) {
  size_t begin = 0;
  while (begin < s.size()) {
    uint32_t cp;
    const size_t n = tok::NextUtf8(s, begin, &cp);
    if (!IsPythonSpace(cp)) break;
    begin += n;
  }
  size_t end = s.size();
  while (end > begin) {
    // Step back to the start of the last character.
    size_t start = end - 1;
    while (start > begin && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80 && end - start < 4) {
      --start;
    }
    uint32_t cp;
    const size_t n = tok::NextUtf8(s, start, &cp);
    if (start + n != end || !IsPythonSpace(cp)) break;
    end = start;
  }
  return s.substr(begin, end - begin);
}

// Qwen2.5's template (tokenizer.chat_template of its GGUF files) without the generation prompt:
// with tools, a system turn that lists them (the client's system message or the default one in
// front); an assistant turn with calls writes each as a <tool_call> block; consecutive tool
// results share one user turn. Roles the template does not know render nothing, as there.
template <typename Templ, typename Content>
void RenderQwenTools(const ChatTemplate& tmpl, std::span<const ChatMessage> messages,
                     std::span<const std::string> tools, Templ& templ, Content& content) {
  const bool first_system = !messages.empty() && messages[0].role == "system";
  if (!tools.empty()) {
    templ("<|im_start|>system\n");
    if (first_system) {
      content(messages[0].content);
    } else {
      templ(tmpl.default_system);
    }
    templ(
        "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>");
    for (const std::string& tool : tools) {
      templ("\n");
      content(tool);
    }
    templ(
        "\n</tools>\n\nFor each function call, return a json object with function name and "
        "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
        "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n");
  } else if (first_system) {
    templ("<|im_start|>system\n");
    content(messages[0].content);
    templ("<|im_end|>\n");
  } else if (!tmpl.default_system.empty()) {
    templ(absl::StrCat("<|im_start|>system\n", tmpl.default_system, "<|im_end|>\n"));
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user" || (m.role == "system" && i > 0) ||
        (m.role == "assistant" && m.tool_calls.empty())) {
      templ(absl::StrCat("<|im_start|>", m.role, "\n"));
      content(m.content);
      templ("<|im_end|>\n");
    } else if (m.role == "assistant") {
      templ("<|im_start|>assistant");
      if (!m.content.empty()) {
        templ("\n");
        content(m.content);
      }
      for (const ChatToolCall& call : m.tool_calls) {
        templ("\n<tool_call>\n{\"name\": \"");
        content(call.name);
        templ("\", \"arguments\": ");
        content(call.arguments);
        templ("}\n</tool_call>");
      }
      templ("<|im_end|>\n");
    } else if (m.role == "tool") {
      if (i == 0 || messages[i - 1].role != "tool") templ("<|im_start|>user");
      templ("\n<tool_response>\n");
      content(m.content);
      templ("\n</tool_response>");
      if (i + 1 == messages.size() || messages[i + 1].role != "tool") templ("<|im_end|>\n");
    }
  }
}

}  // namespace

absl::StatusOr<ChatTemplate> DetectChatTemplate(std::string_view text) {
  if (text.empty()) {
    return absl::NotFoundError("chat template: the model has no tokenizer.chat_template");
  }
  ChatTemplate tmpl;
  if (Contains(text, "<|im_start|>")) {
    tmpl.kind = ChatTemplateKind::kChatML;
    // Only a template that tests for a missing system message inserts a default one.
    const bool conditional = Contains(text, "!= 'system'") || Contains(text, "!= \"system\"") ||
                             Contains(text, "== 'system'") || Contains(text, "== \"system\"");
    std::string literal;
    for (size_t at = text.find(kImStartSystem); conditional && at != std::string_view::npos;
         at = text.find(kImStartSystem, at + 1)) {
      if (ReadSystemLiteral(text.substr(at + kImStartSystem.size()), &literal)) {
        tmpl.default_system = literal;
        break;
      }
    }
    tmpl.qwen_tools = Contains(text, "<tools>") && Contains(text, "<tool_call>") &&
                      Contains(text, "<tool_response>");
    return tmpl;
  }
  if (Contains(text, "<|start_header_id|>") && Contains(text, "<|eot_id|>")) {
    tmpl.kind = ChatTemplateKind::kLlama3;
    return tmpl;
  }
  constexpr size_t kShown = 80;
  return absl::UnimplementedError(absl::StrCat(
      "chat template: unsupported template (known: ChatML with <|im_start|>, Llama 3 with "
      "<|start_header_id|>); it begins: ",
      std::string(text.substr(0, kShown)), text.size() > kShown ? "..." : ""));
}

absl::StatusOr<ChatTemplate> ChatTemplateByName(std::string_view name) {
  if (name == "chatml") return ChatTemplate{ChatTemplateKind::kChatML, ""};
  if (name == "llama3") return ChatTemplate{ChatTemplateKind::kLlama3, ""};
  return absl::InvalidArgumentError(absl::StrCat("chat template: unknown name '", std::string(name),
                                                 "' (known: chatml, llama3)"));
}

std::vector<ChatSegment> RenderChatSegments(const ChatTemplate& tmpl,
                                            std::span<const ChatMessage> messages,
                                            bool add_generation_prompt,
                                            std::span<const std::string> tools) {
  std::vector<ChatSegment> out;
  auto templ = [&out](std::string text) {
    if (!out.empty() && !out.back().is_content) {
      out.back().text += text;
    } else {
      out.push_back({std::move(text), false});
    }
  };
  auto content = [&out](std::string_view text) {
    if (!text.empty()) out.push_back({std::string(text), true});
  };
  const bool needs_default =
      !tmpl.default_system.empty() && !messages.empty() && messages[0].role != "system";
  switch (tmpl.kind) {
    case ChatTemplateKind::kChatML:
      if (tmpl.qwen_tools) {
        RenderQwenTools(tmpl, messages, tools, templ, content);
      } else {
        if (needs_default) {
          templ(absl::StrCat("<|im_start|>system\n", tmpl.default_system, "<|im_end|>\n"));
        }
        for (const ChatMessage& m : messages) {
          templ(absl::StrCat("<|im_start|>", m.role, "\n"));
          content(m.content);
          templ("<|im_end|>\n");
        }
      }
      if (add_generation_prompt) templ("<|im_start|>assistant\n");
      break;
    case ChatTemplateKind::kLlama3:
      // The template writes bos_token in front of the first message only.
      if (!messages.empty()) templ("<|begin_of_text|>");
      if (needs_default) {
        templ(absl::StrCat("<|start_header_id|>system<|end_header_id|>\n\n",
                           std::string(PythonStrip(tmpl.default_system)), "<|eot_id|>"));
      }
      for (const ChatMessage& m : messages) {
        templ(absl::StrCat("<|start_header_id|>", m.role, "<|end_header_id|>\n\n"));
        content(PythonStrip(m.content));
        templ("<|eot_id|>");
      }
      if (add_generation_prompt) templ("<|start_header_id|>assistant<|end_header_id|>\n\n");
      break;
  }
  return out;
}

std::string RenderChat(const ChatTemplate& tmpl, std::span<const ChatMessage> messages,
                       bool add_generation_prompt, std::span<const std::string> tools) {
  std::string out;
  for (const ChatSegment& s : RenderChatSegments(tmpl, messages, add_generation_prompt, tools)) {
    out += s.text;
  }
  return out;
}

std::vector<int32_t> EncodeChat(const Tokenizer& tokenizer, std::span<const ChatSegment> segments,
                                bool parse_special_in_content) {
  std::vector<TextSegment> parts;
  parts.reserve(segments.size());
  for (const ChatSegment& s : segments) {
    parts.push_back({s.text, !s.is_content || parse_special_in_content});
  }
  std::vector<int32_t> ids = tokenizer.EncodeSegments(parts);
  if (tokenizer.add_bos() && tokenizer.bos_id() >= 0 &&
      (ids.empty() || ids.front() != tokenizer.bos_id())) {
    ids.insert(ids.begin(), tokenizer.bos_id());
  }
  return ids;
}

}  // namespace tripod
