#include "scheduler/request_fields.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace tripod::scheduler {
namespace {

using nlohmann::json;

bool IsTrue(const json& v) { return v.is_boolean() && v.get<bool>(); }
bool IsFalse(const json& v) { return v.is_boolean() && !v.get<bool>(); }
bool IsEmptyString(const json& v) { return v.is_string() && v.get<std::string>().empty(); }
bool IsString(const json& v) { return v.is_string(); }
bool IsObject(const json& v) { return v.is_object(); }
bool IsEmptyList(const json& v) { return v.is_array() && v.empty(); }
// The legacy function_call: "none" and "auto" ask for nothing beyond the default.
bool IsNoneOrAuto(const json& v) { return v.is_string() && (v == "none" || v == "auto"); }
bool IsDefaultTier(const json& v) { return v.is_string() && (v == "auto" || v == "default"); }
bool IsTextOnly(const json& v) {
  return v.is_array() && v.size() == 1 && v[0].is_string() && v[0] == "text";
}

constexpr FieldRule kParsed = FieldRule::kParsed;
constexpr FieldRule kNoOp = FieldRule::kNoOp;
constexpr FieldRule kRefused = FieldRule::kRefused;

// One row per field (two where the doors differ).
constexpr RequestField kFields[] = {
    // The input and the output's size.
    {"model", kBothDoors, kParsed},
    {"prompt", kCompletionsDoor, kParsed},
    {"messages", kChatDoor, kParsed},
    {"max_tokens", kBothDoors, kParsed},
    {"max_completion_tokens", kBothDoors, kParsed},
    // Sampling (OpenAI's, then vLLM's).
    {"temperature", kBothDoors, kParsed},
    {"top_p", kBothDoors, kParsed},
    {"presence_penalty", kBothDoors, kParsed},
    {"frequency_penalty", kBothDoors, kParsed},
    {"logit_bias", kBothDoors, kParsed},
    {"seed", kBothDoors, kParsed},
    {"stop", kBothDoors, kParsed},
    {"n", kBothDoors, kParsed},
    {"best_of", kBothDoors, kParsed},
    {"top_k", kBothDoors, kParsed},
    {"min_p", kBothDoors, kParsed},
    {"repetition_penalty", kBothDoors, kParsed},
    {"stop_token_ids", kBothDoors, kParsed},
    {"min_tokens", kBothDoors, kParsed},
    {"ignore_eos", kBothDoors, kParsed},
    // Log-probabilities and echo.
    {"logprobs", kBothDoors, kParsed},
    {"top_logprobs", kChatDoor, kParsed},
    {"echo", kCompletionsDoor, kParsed},
    {"echo", kChatDoor, kNoOp, IsFalse, "only false"},
    {"prompt_logprobs", kBothDoors, kParsed},
    // The answer's form.
    {"stream", kBothDoors, kParsed},
    {"stream_options", kBothDoors, kParsed},
    {"user", kBothDoors, kParsed},
    {"tripod", kBothDoors, kParsed},
    {"suffix", kCompletionsDoor, kNoOp, IsEmptyString, "only empty"},
    {"skip_special_tokens", kBothDoors, kNoOp, IsTrue, "only true: special tokens are skipped"},
    {"include_stop_str_in_output", kBothDoors, kParsed},
    // Tool calling (tool_calls.h); the legacy forms only where they ask for nothing.
    {"tools", kChatDoor, kParsed},
    {"tool_choice", kChatDoor, kParsed},
    {"parallel_tool_calls", kChatDoor, kParsed},
    {"functions", kChatDoor, kNoOp, IsEmptyList, "only empty: its current form 'tools' is"},
    {"function_call", kChatDoor, kNoOp, IsNoneOrAuto,
     "only \"none\" or \"auto\": its current form 'tool_choice' is"},
    // Chat-only OpenAI fields that change nothing without storage.
    {"store", kChatDoor, kNoOp, IsFalse, "only false: nothing is stored"},
    {"metadata", kChatDoor, kNoOp, IsObject, "an object"},
    {"service_tier", kChatDoor, kNoOp, IsDefaultTier, "only \"auto\" or \"default\""},
    {"modalities", kChatDoor, kNoOp, IsTextOnly, "only [\"text\"]"},
    {"prompt_cache_key", kChatDoor, kNoOp, IsString, "a string"},
    {"safety_identifier", kChatDoor, kNoOp, IsString, "a string"},
    // Structured outputs (structured_output.h); the backend vLLM lets a client pick names an
    // implementation, not a different output.
    {"response_format", kBothDoors, kParsed},
    {"guided_choice", kBothDoors, kParsed},
    {"guided_json", kBothDoors, kParsed},
    {"guided_regex", kBothDoors, kParsed},
    {"structured_outputs", kBothDoors, kParsed},
    {"guided_decoding_backend", kBothDoors, kNoOp, IsString, "a string"},
    // Refused whatever the value: the answer would not be what was asked for.
    {"guided_grammar", kBothDoors, kRefused},
    {"guided_whitespace_pattern", kBothDoors, kRefused},
    {"allowed_token_ids", kBothDoors, kRefused},
    {"bad_words", kBothDoors, kRefused},
    {"logits_processors", kBothDoors, kRefused},
    {"use_beam_search", kBothDoors, kRefused},
    {"length_penalty", kBothDoors, kRefused},
    {"truncate_prompt_tokens", kBothDoors, kRefused},
    {"return_tokens_as_token_ids", kBothDoors, kRefused},
    {"spaces_between_special_tokens", kBothDoors, kRefused},
    {"add_special_tokens", kBothDoors, kRefused},
    {"chat_template", kChatDoor, kRefused},
    {"chat_template_kwargs", kChatDoor, kRefused},
    {"add_generation_prompt", kChatDoor, kRefused},
    {"continue_final_message", kChatDoor, kRefused},
    {"reasoning_effort", kChatDoor, kRefused},
    {"prediction", kChatDoor, kRefused},
    {"audio", kChatDoor, kRefused},
    {"web_search_options", kChatDoor, kRefused},
};

unsigned DoorOf(ApiKind kind) {
  return kind == ApiKind::kChatCompletion ? kChatDoor : kCompletionsDoor;
}

const char* DoorPath(ApiKind kind) {
  return kind == ApiKind::kChatCompletion ? "/v1/chat/completions" : "/v1/completions";
}

}  // namespace

std::span<const RequestField> RequestFields() { return kFields; }

std::optional<ApiError> RefuseUnsupportedFields(const json& body, ApiKind kind) {
  const unsigned door = DoorOf(kind);
  for (const auto& [key, value] : body.items()) {
    if (value.is_null()) continue;
    const RequestField* row = nullptr;
    bool other_door = false;
    for (const RequestField& f : kFields) {
      if (f.name != key) continue;
      if ((f.doors & door) != 0) {
        row = &f;
        break;
      }
      other_door = true;
    }
    if (row == nullptr) {
      return InvalidRequest(
          other_door ? absl::StrCat("'", key, "' is not supported on ", DoorPath(kind))
                     : absl::StrCat("'", key.substr(0, 64), "' is not supported by this server"),
          key.substr(0, 64));
    }
    if (row->rule == FieldRule::kRefused) {
      return InvalidRequest(absl::StrCat("'", key, "' is not supported by this server"), key);
    }
    if (row->accepts != nullptr && !row->accepts(value)) {
      return InvalidRequest(
          absl::StrCat("'", key, "' is not supported (", std::string(row->only), ")"), key);
    }
  }
  return std::nullopt;
}

}  // namespace tripod::scheduler
