#include "scheduler/openai_tokens.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "scheduler/tool_calls.h"

namespace tripod::scheduler {
namespace {

using nlohmann::json;

std::vector<int32_t> EncodeTextPrompt(const Tokenizer& tokenizer, std::string_view text,
                                      bool add_bos) {
  std::vector<int32_t> ids = tokenizer.Encode(text, /*parse_special=*/true);
  if (add_bos && tokenizer.add_bos() && tokenizer.bos_id() >= 0 &&
      (ids.empty() || ids.front() != tokenizer.bos_id())) {
    ids.insert(ids.begin(), tokenizer.bos_id());
  }
  return ids;
}

std::vector<int32_t> EncodeMessages(const Tokenizer& tokenizer, const ChatTemplate& tmpl,
                                    std::span<const ChatMessage> messages,
                                    bool add_generation_prompt,
                                    std::span<const std::string> tools) {
  const std::vector<ChatSegment> segments =
      RenderChatSegments(tmpl, messages, add_generation_prompt, tools);
  return EncodeChat(tokenizer, segments, /*parse_special_in_content=*/false);
}

std::optional<ApiError> CheckVocabulary(std::span<const int32_t> ids, int32_t vocab_size,
                                        const char* param) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size) {
      return InvalidRequest(absl::StrCat("'", param, "[", i, "]' is token id ", ids[i],
                                         ", outside the vocabulary [0, ", vocab_size, ")"),
                            param);
    }
  }
  return std::nullopt;
}

// Tools, calls and tool results need a template that writes them; with any other they would be
// left out of the prompt, so they are refused.
std::optional<ApiError> CheckToolFormat(std::span<const ChatMessage> messages,
                                        std::span<const std::string> tools,
                                        const ChatTemplate& chat_template) {
  const bool tool_turns = std::any_of(messages.begin(), messages.end(), [](const ChatMessage& m) {
    return m.role == "tool" || !m.tool_calls.empty();
  });
  if ((tools.empty() && !tool_turns) || chat_template.qwen_tools) return std::nullopt;
  return InvalidRequest(
      "this model's chat template has no tool format: 'tools', tool calls and tool messages are "
      "not supported for it",
      tools.empty() ? "messages" : "tools");
}

}  // namespace

ApiResult<std::vector<int32_t>> PromptTokenIds(const CompletionRequest& request,
                                               const Tokenizer& tokenizer,
                                               const ChatTemplate& chat_template) {
  std::vector<int32_t> ids;
  const char* param = "prompt";
  if (request.kind == ApiKind::kChatCompletion) {
    param = "messages";
    // tool_choice "none" leaves the tools out of the prompt.
    const std::span<const std::string> tools =
        request.ParsesToolCalls() ? std::span<const std::string>(request.tools_json)
                                  : std::span<const std::string>();
    if (auto e = CheckToolFormat(request.messages, tools, chat_template)) return *e;
    ids = EncodeMessages(tokenizer, chat_template, request.messages, true, tools);
  } else if (request.prompt_is_ids) {
    if (auto e = CheckVocabulary(request.prompt_ids, tokenizer.vocab_size(), param)) return *e;
    ids = request.prompt_ids;
  } else {
    ids = EncodeTextPrompt(tokenizer, request.prompt_text, /*add_bos=*/true);
  }
  if (ids.empty()) {
    return InvalidRequest(
        absl::StrCat("'", param, "' gives no tokens; the prompt must not be empty"), param);
  }
  return ids;
}

ApiResult<TokenizeRequest> ParseTokenizeBody(std::string_view body) {
  ApiResult<json> parsed = ParseJsonObject(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *std::move(e);
  const json& j = std::get<json>(parsed);
  TokenizeRequest req;
  std::optional<std::string> model;
  if (auto e = GetString(j, "model", &model)) return *e;
  req.model = model.value_or("");
  const bool has_messages = j.contains("messages") && !j["messages"].is_null();
  const bool has_prompt = j.contains("prompt") && !j["prompt"].is_null();
  if (has_messages && has_prompt) {
    return InvalidRequest("give 'prompt' or 'messages', not both", "messages");
  }
  if (has_messages) {
    req.is_chat = true;
    if (auto e = ParseChatMessagesJson(j["messages"], &req.messages)) return *e;
    if (auto e = ValidateChatMessages(&req.messages)) return *e;
    if (j.contains("tools") && !j["tools"].is_null()) {
      CompletionRequest tools;
      const nlohmann::ordered_json ordered =
          nlohmann::ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
      if (auto e = ParseTools(ordered["tools"], &tools)) return *e;
      req.tools_json = std::move(tools.tools_json);
    }
  } else if (has_prompt) {
    std::optional<std::string> prompt;
    if (auto e = GetString(j, "prompt", &prompt)) return *e;
    req.prompt = *std::move(prompt);
  } else {
    return InvalidRequest("'prompt' or 'messages' is required", "prompt");
  }
  std::optional<bool> flag;
  if (auto e = GetBool(j, "add_special_tokens", &flag)) return *e;
  req.add_special_tokens = flag.value_or(true);
  flag.reset();
  if (auto e = GetBool(j, "add_generation_prompt", &flag)) return *e;
  req.add_generation_prompt = flag.value_or(true);
  return req;
}

ApiResult<std::vector<int32_t>> Tokenize(const TokenizeRequest& request, const Tokenizer& tokenizer,
                                         const ChatTemplate& chat_template) {
  if (request.is_chat) {
    if (auto e = CheckToolFormat(request.messages, request.tools_json, chat_template)) return *e;
    return EncodeMessages(tokenizer, chat_template, request.messages, request.add_generation_prompt,
                          request.tools_json);
  }
  return EncodeTextPrompt(tokenizer, request.prompt, request.add_special_tokens);
}

std::string TokenizeResponseBody(std::span<const int32_t> tokens, int max_model_len) {
  nlohmann::ordered_json body;
  body["tokens"] = tokens;
  body["count"] = tokens.size();
  body["max_model_len"] = max_model_len;
  return DumpJson(body);
}

ApiResult<DetokenizeRequest> ParseDetokenizeBody(std::string_view body, int32_t vocab_size) {
  ApiResult<json> parsed = ParseJsonObject(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *std::move(e);
  const json& j = std::get<json>(parsed);
  DetokenizeRequest req;
  std::optional<std::string> model;
  if (auto e = GetString(j, "model", &model)) return *e;
  req.model = model.value_or("");
  auto it = j.find("tokens");
  if (it == j.end() || it->is_null()) return InvalidRequest("'tokens' is required", "tokens");
  if (!it->is_array()) return InvalidRequest("'tokens' must be a list of token ids", "tokens");
  req.tokens.reserve(it->size());
  for (size_t i = 0; i < it->size(); ++i) {
    int64_t id = 0;
    if (!JsonToInt64((*it)[i], &id) || id < 0 || id >= vocab_size) {
      return InvalidRequest(absl::StrCat("'tokens[", i, "]' must be a token id in [0, ", vocab_size,
                                         "), got ", (*it)[i].dump()),
                            "tokens");
    }
    req.tokens.push_back(static_cast<int32_t>(id));
  }
  return req;
}

std::string DetokenizeResponseBody(const DetokenizeRequest& request, const Tokenizer& tokenizer) {
  nlohmann::ordered_json body;
  body["prompt"] = tokenizer.Decode(request.tokens);
  return DumpJson(body);
}

std::string TokenizerInfoBody(const Tokenizer& tokenizer, int64_t max_model_len) {
  const auto token_text = [&tokenizer](int32_t id) -> nlohmann::ordered_json {
    if (id < 0 || id >= tokenizer.vocab_size()) return nullptr;
    return std::string(tokenizer.TokenText(id));
  };
  nlohmann::ordered_json body;
  body["tokenizer_class"] = tokenizer.kind() == TokenizerKind::kByteLevelBpe ? "gpt2" : "llama";
  body["bos_token"] = token_text(tokenizer.bos_id());
  body["eos_token"] = token_text(tokenizer.eos_id());
  body["pad_token"] = nullptr;
  body["add_bos_token"] = tokenizer.add_bos() && tokenizer.bos_id() >= 0;
  body["model_max_length"] =
      max_model_len > 0 ? nlohmann::ordered_json(max_model_len) : nlohmann::ordered_json();
  body["vocab_size"] = tokenizer.vocab_size();
  return DumpJson(body);
}

}  // namespace tripod::scheduler
