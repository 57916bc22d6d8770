#include "scheduler/tool_calls.h"

#include <random>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/model/python_json.h"
#include "scheduler/openai_json.h"

namespace tripod::scheduler {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kClose = "</tool_call>";

// OpenAI's rule for function names: a-z, A-Z, 0-9, underscores and dashes, at most 64.
bool GoodFunctionName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (const char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') return false;
  }
  return true;
}

template <typename J>
std::string Kind(const J& v) {
  return v.type_name();
}

// One block's JSON: {"name": string, "arguments": object} ("parameters" is accepted for
// "arguments", as vLLM's Hermes parser does).
std::optional<ToolCall> ParseCallJson(std::string_view body) {
  ordered_json j = ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get<std::string>().empty()) {
    return std::nullopt;
  }
  auto args = j.find("arguments");
  if (args == j.end()) args = j.find("parameters");
  ordered_json arguments = args == j.end() ? ordered_json::object() : *args;
  if (arguments.is_string()) {  // a model that wrote the arguments as a JSON string
    ordered_json inner =
        ordered_json::parse(arguments.get<std::string>(), nullptr, /*allow_exceptions=*/false);
    if (!inner.is_discarded()) arguments = std::move(inner);
  }
  return ToolCall{NewToolCallId(), name->get<std::string>(), PythonJsonDumps(arguments)};
}

bool IsBlank(std::string_view s) {
  for (const char c : s) {
    if (!absl::ascii_isspace(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// The length of the longest suffix of `s` that is a proper prefix of `tag`.
size_t PartialTagAtEnd(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n) {
    if (tag.substr(0, n) == s.substr(s.size() - n)) return n;
  }
  return 0;
}

}  // namespace

std::string NewToolCallId() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = "call_";
  uint64_t bits = rng();
  for (int i = 0; i < 24; ++i) {
    if (i == 16) bits = rng();
    id.push_back(kHex[bits & 0xF]);
    bits >>= 4;
  }
  return id;
}

std::optional<ApiError> ParseTools(const ordered_json& tools, CompletionRequest* request) {
  if (tools.is_null()) return std::nullopt;
  if (!tools.is_array()) {
    return InvalidRequest(absl::StrCat("'tools' must be a list of {\"type\": \"function\", "
                                       "\"function\": {...}} objects, got ",
                                       Kind(tools)),
                          "tools");
  }
  for (size_t i = 0; i < tools.size(); ++i) {
    const ordered_json& t = tools[i];
    const std::string at = absl::StrCat("tools[", i, "]");
    if (!t.is_object()) {
      return InvalidRequest(absl::StrCat("'", at, "' must be an object, got ", Kind(t)), at);
    }
    auto type = t.find("type");
    if (type == t.end() || !type->is_string() || *type != "function") {
      return InvalidRequest(absl::StrCat("'", at, ".type' must be \"function\""), at + ".type");
    }
    auto fn = t.find("function");
    if (fn == t.end() || !fn->is_object()) {
      return InvalidRequest(absl::StrCat("'", at, ".function' must be an object"),
                            at + ".function");
    }
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string() || !GoodFunctionName(name->get<std::string>())) {
      return InvalidRequest(absl::StrCat("'", at,
                                         ".function.name' must be a string of 1-64 letters, "
                                         "digits, underscores or dashes"),
                            at + ".function.name");
    }
    for (const char* key : {"description"}) {
      auto v = fn->find(key);
      if (v != fn->end() && !v->is_string() && !v->is_null()) {
        return InvalidRequest(absl::StrCat("'", at, ".function.", key, "' must be a string"),
                              absl::StrCat(at, ".function.", key));
      }
    }
    auto params = fn->find("parameters");
    if (params != fn->end() && !params->is_object() && !params->is_null()) {
      return InvalidRequest(
          absl::StrCat("'", at, ".function.parameters' must be a JSON Schema object"),
          at + ".function.parameters");
    }
    const std::string n = name->get<std::string>();
    for (const std::string& seen : request->tool_names) {
      if (seen == n) {
        return InvalidRequest(
            absl::StrCat("'", at, ".function.name' \"", n, "\" names an earlier tool too"),
            at + ".function.name");
      }
    }
    request->tool_names.push_back(n);
    request->tools_json.push_back(PythonJsonDumps(t));
  }
  return std::nullopt;
}

std::optional<ApiError> ParseToolChoice(const json& choice, CompletionRequest* request) {
  if (choice.is_null()) return std::nullopt;
  if (choice.is_string()) {
    const std::string c = choice.get<std::string>();
    if (c == "none") {
      request->tool_choice = ToolChoice::kNone;
    } else if (c == "auto") {
      request->tool_choice = ToolChoice::kAuto;
    } else if (c == "required") {
      request->tool_choice = ToolChoice::kRequired;
    } else {
      return InvalidRequest(absl::StrCat("'tool_choice' must be \"none\", \"auto\", \"required\" "
                                         "or {\"type\": \"function\", \"function\": {\"name\": "
                                         "...}}, got \"",
                                         c.substr(0, 32), "\""),
                            "tool_choice");
    }
  } else if (choice.is_object() && choice.contains("function") && choice["function"].is_object() &&
             choice["function"].contains("name") && choice["function"]["name"].is_string()) {
    request->tool_choice = ToolChoice::kNamed;
    request->tool_choice_name = choice["function"]["name"].get<std::string>();
  } else {
    return InvalidRequest(
        "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
        "\"function\": {\"name\": ...}}",
        "tool_choice");
  }
  if (request->tool_choice == ToolChoice::kNone || request->tool_choice == ToolChoice::kAuto) {
    return std::nullopt;
  }
  if (request->tools_json.empty()) {
    return InvalidRequest("'tool_choice' asks for a tool call but 'tools' is empty", "tool_choice");
  }
  if (request->tool_choice == ToolChoice::kNamed) {
    bool known = false;
    for (const std::string& n : request->tool_names) known |= n == request->tool_choice_name;
    if (!known) {
      return InvalidRequest(absl::StrCat("'tool_choice' names \"", request->tool_choice_name,
                                         "\", which is not among 'tools'"),
                            "tool_choice");
    }
  }
  return std::nullopt;
}

std::optional<ApiError> ParseHistoryToolCalls(const json& calls, const std::string& at,
                                              std::vector<ChatToolCall>* out) {
  const std::string param = at + ".tool_calls";
  if (calls.is_null()) return std::nullopt;
  if (!calls.is_array()) {
    return InvalidRequest(absl::StrCat("'", param, "' must be a list of tool calls"), param);
  }
  for (size_t i = 0; i < calls.size(); ++i) {
    const json& c = calls[i];
    const std::string p = absl::StrCat(param, "[", i, "]");
    if (!c.is_object() || !c.contains("function") || !c["function"].is_object()) {
      return InvalidRequest(absl::StrCat("'", p,
                                         "' must be {\"type\": \"function\", \"function\": "
                                         "{\"name\", \"arguments\"}}"),
                            p);
    }
    const json& fn = c["function"];
    if (!fn.contains("name") || !fn["name"].is_string() || fn["name"].get<std::string>().empty()) {
      return InvalidRequest(absl::StrCat("'", p, ".function.name' must be a non-empty string"),
                            p + ".function.name");
    }
    ChatToolCall call;
    call.name = fn["name"].get<std::string>();
    const json args = fn.contains("arguments") ? fn["arguments"] : json::object();
    if (args.is_string()) {
      // OpenAI's shape: JSON text. The template writes it as the object it holds (vLLM parses it
      // before rendering); text that is not JSON is written as a string.
      ordered_json parsed =
          ordered_json::parse(args.get<std::string>(), nullptr, /*allow_exceptions=*/false);
      call.arguments =
          PythonJsonDumps(parsed.is_discarded() ? ordered_json(args.get<std::string>()) : parsed);
    } else if (args.is_object()) {
      call.arguments = PythonJsonDumps(ordered_json::parse(args.dump()));
    } else {
      return InvalidRequest(
          absl::StrCat("'", p, ".function.arguments' must be a JSON string or an object"),
          p + ".function.arguments");
    }
    out->push_back(std::move(call));
  }
  return std::nullopt;
}

ParsedOutput ParseToolCallOutput(std::string_view text, int max_calls) {
  ParsedOutput out;
  const size_t first = text.find(kOpen);
  if (first == std::string_view::npos) {
    if (!text.empty()) out.content = std::string(text);
    return out;
  }
  size_t at = first;
  while (at != std::string_view::npos) {
    const size_t body = at + kOpen.size();
    const size_t close = text.find(kClose, body);
    std::optional<ToolCall> call = ParseCallJson(
        text.substr(body, close == std::string_view::npos ? std::string_view::npos : close - body));
    if (!call) {  // not all blocks parse: it is all content, as vLLM's parser answers
      out.calls.clear();
      out.content = std::string(text);
      return out;
    }
    if (static_cast<int>(out.calls.size()) < max_calls) out.calls.push_back(std::move(*call));
    if (close == std::string_view::npos) break;
    at = text.find(kOpen, close + kClose.size());
  }
  const std::string_view before = text.substr(0, first);
  if (!IsBlank(before)) out.content = std::string(before);
  return out;
}

ToolCallStream::Output ToolCallStream::Feed(std::string_view text) {
  pending_ += text;
  Output out;
  Drain(&out, /*at_end=*/false);
  return out;
}

ToolCallStream::Output ToolCallStream::Finish() {
  Output out;
  Drain(&out, /*at_end=*/true);
  return out;
}

void ToolCallStream::Drain(Output* out, bool at_end) {
  while (!pending_.empty()) {
    if (!in_call_) {
      const size_t open = pending_.find(kOpen);
      if (open == std::string::npos) {
        // Keep what may be the start of a tag; after a call, keep white space too (dropped if a
        // call or the end follows).
        const size_t keep = at_end ? 0 : PartialTagAtEnd(pending_, kOpen);
        const std::string_view send(pending_.data(), pending_.size() - keep);
        if (IsBlank(send) && (calls_sent_ > 0 || !content_sent_)) {
          // White space before a first call or after a call: held, dropped if a call or the end
          // follows.
          if (at_end) pending_.clear();
          return;
        }
        out->content += send;
        content_sent_ = true;
        pending_.erase(0, send.size());
        return;
      }
      const std::string_view before(pending_.data(), open);
      if (!IsBlank(before)) {
        out->content += before;
        content_sent_ = true;
      }
      pending_.erase(0, open + kOpen.size());
      in_call_ = true;
      continue;
    }
    const size_t close = pending_.find(kClose);
    if (close == std::string::npos && !at_end) return;
    const std::string_view body(pending_.data(),
                                close == std::string::npos ? pending_.size() : close);
    std::optional<ToolCall> call = ParseCallJson(body);
    if (call) {
      if (calls_sent_ < max_calls_) out->calls.push_back(std::move(*call));
      ++calls_sent_;
    } else {
      // Sent as it came: the content can no longer be taken back.
      out->content += kOpen;
      out->content += body;
      if (close != std::string::npos) out->content += kClose;
    }
    pending_.erase(0, close == std::string::npos ? pending_.size() : close + kClose.size());
    in_call_ = false;
  }
}

std::string FinishReasonAfterCalls(const std::string& finish_reason, bool made_calls) {
  return made_calls && finish_reason == "stop" ? "tool_calls" : finish_reason;
}

ChoiceToolCallStreams::Piece ChoiceToolCallStreams::Counted(int choice,
                                                            ToolCallStream::Output out) {
  Piece p;
  p.content = std::move(out.content);
  p.calls = std::move(out.calls);
  p.first_index = sent_[choice];
  sent_[choice] += static_cast<int>(p.calls.size());
  return p;
}

ToolCallStream& ChoiceToolCallStreams::Of(int choice) {
  while (streams_.size() <= static_cast<size_t>(choice)) {
    streams_.push_back(std::make_unique<ToolCallStream>(max_calls_));
    sent_.push_back(0);
  }
  return *streams_[choice];
}

ChoiceToolCallStreams::Piece ChoiceToolCallStreams::Feed(int choice, std::string_view text) {
  return Counted(choice, Of(choice).Feed(text));
}

ChoiceToolCallStreams::Piece ChoiceToolCallStreams::Finish(int choice, std::string* finish_reason) {
  Piece p = Counted(choice, Of(choice).Finish());
  *finish_reason = FinishReasonAfterCalls(*finish_reason, sent_[choice] > 0);
  return p;
}

}  // namespace tripod::scheduler
