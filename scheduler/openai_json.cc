#include "scheduler/openai_json.h"

#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "scheduler/tool_calls.h"

namespace tripod::scheduler {
namespace {

using nlohmann::json;

// "a string", "an object", ...: for messages like "must be an integer, got a string".
std::string Describe(const json& v) {
  switch (v.type()) {
    case json::value_t::string:
      return "a string";
    case json::value_t::boolean:
      return v.get<bool>() ? "true" : "false";
    case json::value_t::array:
      return "a list";
    case json::value_t::object:
      return "an object";
    case json::value_t::null:
      return "null";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float:
      return v.dump();
    default:
      return "an unsupported value";
  }
}

// The value of obj[key], or nullptr when absent or null.
const json* Field(const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

std::string ParamOr(std::string param, const char* key) {
  return param.empty() ? std::string(key) : std::move(param);
}

ApiError TypeError(const std::string& param, absl::string_view expected, const json& got) {
  return InvalidRequest(absl::StrCat("'", param, "' must be ", expected, ", got ", Describe(got)),
                        param);
}

}  // namespace

ApiError InvalidRequest(std::string message, std::string param) {
  ApiError e;
  e.http_status = 400;
  e.type = "invalid_request_error";
  e.message = std::move(message);
  e.param = std::move(param);
  return e;
}

bool JsonTooDeep(std::string_view body) {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (char c : body) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

ApiResult<json> ParseJsonObject(std::string_view body) {
  if (JsonTooDeep(body)) {
    return InvalidRequest(absl::StrCat("the request body nests lists/objects deeper than ",
                                       kMaxJsonDepth, " levels"));
  }
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidRequest("the request body is not valid JSON");
  if (!j.is_object()) {
    return InvalidRequest(
        absl::StrCat("the request body must be a JSON object, got ", Describe(j)));
  }
  return j;
}

nlohmann::ordered_json ErrorJson(const ApiError& error) {
  nlohmann::ordered_json e;
  e["message"] = error.message;
  e["type"] = error.type;
  e["param"] = error.param.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(error.param);
  e["code"] = error.code.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(error.code);
  nlohmann::ordered_json out;
  out["error"] = std::move(e);
  return out;
}

std::string ErrorBody(const ApiError& error) { return DumpJson(ErrorJson(error)); }

std::string DumpJson(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', /*ensure_ascii=*/false, nlohmann::ordered_json::error_handler_t::replace);
}

bool JsonToInt64(const json& v, int64_t* out) {
  if (v.is_number_integer() && !v.is_number_unsigned()) {
    *out = v.get<int64_t>();
    return true;
  }
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = static_cast<int64_t>(u);
    return true;
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    // 2^63 is exactly representable; anything at or above it does not fit.
    if (!std::isfinite(d) || std::trunc(d) != d || d < -9223372036854775808.0 ||
        d >= 9223372036854775808.0) {
      return false;
    }
    *out = static_cast<int64_t>(d);
    return true;
  }
  return false;
}

std::optional<ApiError> GetBool(const json& obj, const char* key, std::optional<bool>* out,
                                std::string param) {
  const json* v = Field(obj, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) return TypeError(ParamOr(std::move(param), key), "a boolean", *v);
  *out = v->get<bool>();
  return std::nullopt;
}

std::optional<ApiError> GetInt(const json& obj, const char* key, std::optional<int64_t>* out,
                               std::string param) {
  const json* v = Field(obj, key);
  if (v == nullptr) return std::nullopt;
  int64_t i = 0;
  if (!JsonToInt64(*v, &i)) {
    param = ParamOr(std::move(param), key);
    if (v->is_number()) {
      return InvalidRequest(
          absl::StrCat("'", param, "' must be an integer within 64 bits, got ", v->dump()), param);
    }
    return TypeError(param, "an integer", *v);
  }
  *out = i;
  return std::nullopt;
}

std::optional<ApiError> GetNumber(const json& obj, const char* key, std::optional<double>* out,
                                  std::string param) {
  const json* v = Field(obj, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) return TypeError(ParamOr(std::move(param), key), "a number", *v);
  const double d = v->get<double>();
  if (!std::isfinite(d)) {  // the parser refuses 1e999 today; this keeps NaN/inf out regardless
    param = ParamOr(std::move(param), key);
    return InvalidRequest(absl::StrCat("'", param, "' must be a finite number"), param);
  }
  *out = d;
  return std::nullopt;
}

std::optional<ApiError> GetString(const json& obj, const char* key, std::optional<std::string>* out,
                                  std::string param) {
  const json* v = Field(obj, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) return TypeError(ParamOr(std::move(param), key), "a string", *v);
  *out = v->get<std::string>();
  return std::nullopt;
}

std::optional<ApiError> ParseChatMessagesJson(const json& messages, std::vector<ChatMessage>* out) {
  if (!messages.is_array()) {
    return TypeError("messages", "a list of {\"role\", \"content\"} objects", messages);
  }
  if (messages.empty()) return InvalidRequest("'messages' must not be empty", "messages");
  out->clear();
  out->reserve(messages.size());
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    const std::string at = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return TypeError(at, "an object with \"role\" and \"content\"", m);
    ChatMessage msg;
    const std::string role_param = at + ".role";
    const json* role = Field(m, "role");
    if (role == nullptr) {
      return InvalidRequest(absl::StrCat("'", role_param, "' is required"), role_param);
    }
    if (!role->is_string()) return TypeError(role_param, "a string", *role);
    msg.role = role->get<std::string>();
    const std::string content_param = at + ".content";
    const json* content = Field(m, "content");
    if (content == nullptr) {
      // An assistant turn may come without content (OpenAI allows it beside tool calls).
      if (msg.role != "assistant") {
        return InvalidRequest(absl::StrCat("'", content_param, "' is required"), content_param);
      }
    } else if (content->is_string()) {
      msg.content = content->get<std::string>();
    } else if (content->is_array()) {
      for (size_t j = 0; j < content->size(); ++j) {
        const json& part = (*content)[j];
        const std::string part_param = absl::StrCat(content_param, "[", j, "]");
        if (!part.is_object()) {
          return TypeError(part_param, "an object {\"type\": \"text\", \"text\": ...}", part);
        }
        const json* type = Field(part, "type");
        if (type == nullptr || !type->is_string() || type->get<std::string>() != "text") {
          return InvalidRequest(
              absl::StrCat("'", part_param, ".type' must be \"text\": only text content parts ",
                           "are supported", type == nullptr ? "" : ", got " + Describe(*type)),
              part_param + ".type");
        }
        const json* text = Field(part, "text");
        if (text == nullptr || !text->is_string()) {
          return TypeError(part_param + ".text", "a string", text == nullptr ? json() : *text);
        }
        msg.content += text->get<std::string>();
      }
    } else {
      return TypeError(content_param, "a string or a list of text parts", *content);
    }
    // An assistant turn's calls go back into the prompt as the template writes them
    // (tool_calls.h); the legacy function_call is refused rather than dropped. null and [] say
    // "no call" and pass.
    if (const json* calls = Field(m, "tool_calls"); calls != nullptr && !calls->empty()) {
      if (msg.role != "assistant") {
        return InvalidRequest(absl::StrCat("'", at, ".tool_calls' belongs to assistant messages"),
                              at + ".tool_calls");
      }
      if (auto e = ParseHistoryToolCalls(*calls, at, &msg.tool_calls)) return e;
    }
    if (const json* call = Field(m, "function_call"); call != nullptr && !call->empty()) {
      return InvalidRequest(absl::StrCat("'", at,
                                         ".function_call' is not supported (the legacy form of "
                                         "tool_calls)"),
                            at + ".function_call");
    }
    out->push_back(std::move(msg));
  }
  return std::nullopt;
}

std::optional<ApiError> ValidateChatMessages(std::vector<ChatMessage>* messages) {
  if (messages->empty()) return InvalidRequest("'messages' must not be empty", "messages");
  for (size_t i = 0; i < messages->size(); ++i) {
    ChatMessage& m = (*messages)[i];
    const std::string param = absl::StrCat("messages[", i, "].role");
    if (m.role == "system" || m.role == "user" || m.role == "assistant") continue;
    if (m.role == "developer") {
      m.role = "system";
      continue;
    }
    if (m.role == "tool") continue;  // a tool's result; the template must have a tool format
    if (m.role == "function") {
      return InvalidRequest(absl::StrCat("'", param,
                                         "' is \"function\": the legacy form of tool messages is "
                                         "not supported (role \"tool\" is)"),
                            param);
    }
    return InvalidRequest(absl::StrCat("'", param,
                                       "' must be one of system, user, assistant, developer, tool; "
                                       "got \"",
                                       m.role, "\""),
                          param);
  }
  return std::nullopt;
}

std::optional<ApiError> ParsePromptJson(const json& prompt, PromptInput* out) {
  constexpr absl::string_view kShapes =
      "a string, a list of one string, a list of token ids, or a list of one list of token ids";
  auto parse_ids = [&](const json& list, const std::string& param) -> std::optional<ApiError> {
    if (list.empty()) return InvalidRequest("'prompt' must not be empty", "prompt");
    out->is_ids = true;
    out->ids.reserve(list.size());
    for (size_t i = 0; i < list.size(); ++i) {
      int64_t id = 0;
      if (!JsonToInt64(list[i], &id) || id < 0 || id > std::numeric_limits<int32_t>::max()) {
        return InvalidRequest(
            absl::StrCat("'", param, "[", i, "]' must be a token id (an integer >= 0), got ",
                         Describe(list[i])),
            "prompt");
      }
      out->ids.push_back(static_cast<int32_t>(id));
    }
    return std::nullopt;
  };
  if (prompt.is_string()) {
    out->text = prompt.get<std::string>();
    if (out->text.empty()) return InvalidRequest("'prompt' must not be empty", "prompt");
    return std::nullopt;
  }
  if (!prompt.is_array()) return TypeError("prompt", kShapes, prompt);
  if (prompt.empty()) return InvalidRequest("'prompt' must not be empty", "prompt");
  const json& first = prompt[0];
  if (first.is_string() || first.is_array()) {
    if (prompt.size() != 1) {
      return InvalidRequest(absl::StrCat("'prompt' holds ", prompt.size(),
                                         " prompts; this server takes one prompt per request"),
                            "prompt");
    }
    if (first.is_string()) {
      out->text = first.get<std::string>();
      if (out->text.empty()) return InvalidRequest("'prompt' must not be empty", "prompt");
      return std::nullopt;
    }
    return parse_ids(first, "prompt[0]");
  }
  if (first.is_number()) return parse_ids(prompt, "prompt");
  return TypeError("prompt", kShapes, prompt);
}

}  // namespace tripod::scheduler
