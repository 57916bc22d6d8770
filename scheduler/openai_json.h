// JSON helpers shared by the OpenAI-compatible API's parsers and formatters: typed field getters
// that answer with an ApiError naming the field, the error body, and a dump that never throws.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "nlohmann/json.hpp"
#include "scheduler/completion_request.h"

namespace tripod::scheduler {

// A parse/validation result: the value, or the error to answer with.
template <typename T>
using ApiResult = std::variant<T, ApiError>;

// Deepest nesting of arrays/objects a request body may have. Our fields nest 4 deep at most
// (messages[i].content[j].text); the bound keeps a hostile "[[[[..." body from costing much.
inline constexpr int kMaxJsonDepth = 32;

// 400 invalid_request_error naming `param` (empty: none).
ApiError InvalidRequest(std::string message, std::string param = "");

// Brackets nested deeper than kMaxJsonDepth, outside strings. Scanned before parsing so that a
// hostile text costs one pass over its bytes rather than a deep tree.
bool JsonTooDeep(std::string_view text);

// Parses a request body that must be a JSON object, within kMaxJsonDepth.
ApiResult<nlohmann::json> ParseJsonObject(std::string_view body);

// {"error":{"message","type","param","code"}}; empty param/code are null.
nlohmann::ordered_json ErrorJson(const ApiError& error);
std::string ErrorBody(const ApiError& error);

// Serialises compactly; invalid UTF-8 (a token that splits a character) becomes U+FFFD rather
// than an exception.
std::string DumpJson(const nlohmann::ordered_json& j);

// Typed getters for body[key]. Absent or null leaves *out unset (OpenAI's SDKs send null for
// unset fields); a value of another type is a 400 naming `param` (default: key). Integers accept
// JSON integers and integral floats (5.0, as pydantic does) within int64; numbers must be finite.
std::optional<ApiError> GetBool(const nlohmann::json& obj, const char* key,
                                std::optional<bool>* out, std::string param = "");
std::optional<ApiError> GetInt(const nlohmann::json& obj, const char* key,
                               std::optional<int64_t>* out, std::string param = "");
std::optional<ApiError> GetNumber(const nlohmann::json& obj, const char* key,
                                  std::optional<double>* out, std::string param = "");
std::optional<ApiError> GetString(const nlohmann::json& obj, const char* key,
                                  std::optional<std::string>* out, std::string param = "");

// A JSON value as an int64 (integers, integral floats); false if it is not one.
bool JsonToInt64(const nlohmann::json& v, int64_t* out);

// `messages`: a non-empty list of {role, content}; content a string or a list of
// {"type":"text","text":...} parts (concatenated). Roles are checked by ValidateChatMessages.
std::optional<ApiError> ParseChatMessagesJson(const nlohmann::json& messages,
                                              std::vector<ChatMessage>* out);

// Roles system/user/assistant/tool are kept, developer becomes system (OpenAI's newer name for
// it); the legacy function messages are refused.
std::optional<ApiError> ValidateChatMessages(std::vector<ChatMessage>* messages);

// A completion's `prompt`: a string, a list of one string, a list of token ids, or a list of
// one list of token ids. Ids must be in [0, 2^31); the vocabulary is checked later.
struct PromptInput {
  bool is_ids = false;
  std::string text;
  std::vector<int32_t> ids;
};
std::optional<ApiError> ParsePromptJson(const nlohmann::json& prompt, PromptInput* out);

}  // namespace tripod::scheduler
