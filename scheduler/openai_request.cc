#include "scheduler/openai_request.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/structured/json_schema_regex.h"
#include "scheduler/choices.h"
#include "scheduler/draft_methods.h"
#include "scheduler/request_fields.h"
#include "scheduler/structured_output.h"
#include "scheduler/tool_calls.h"

namespace tripod::scheduler {
namespace {

using nlohmann::json;

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// Every request field as it arrived (unset: absent or null), before any range check. The JSON
// and proto paths each fill one (checking types, which only JSON needs); BuildRequest then checks
// ranges and cross-field rules once for both.
struct RawRequest {
  ApiKind kind = ApiKind::kCompletion;
  bool model_required = true;
  std::string model;
  bool has_input = false;
  PromptInput prompt;
  std::string prompt_param = "prompt";
  std::vector<ChatMessage> messages;
  std::optional<int64_t> max_tokens;
  std::string max_tokens_param = "max_tokens";
  std::optional<double> temperature, top_p, min_p, repetition_penalty, presence_penalty,
      frequency_penalty;
  std::optional<int64_t> top_k, n, best_of;
  std::optional<double> budget;  // tokens (>= 1, whole) or a fraction of the prompt (0, 1)
  std::string budget_text;       // as the client wrote it, for the error message
  std::vector<std::string> stop;
  std::optional<uint64_t> seed;
  std::vector<std::pair<int64_t, double>> logit_bias;  // token id, bias; as given
  std::vector<int64_t> stop_token_ids;                 // as given
  std::optional<int64_t> min_tokens;
  bool logprobs = false;
  std::optional<int64_t> top_logprobs;
  std::string top_logprobs_param = "logprobs";
  bool ignore_eos = false;
  bool stream = false;
  bool include_usage = false;
  std::string user;
  bool echo = false;
  bool include_stop_str = false;
  std::optional<int64_t> prompt_logprobs;  // vLLM's
  std::string pop;
  std::string pop_variant;
  std::string method;
};

#define API_RETURN_IF_ERROR(expr)                        \
  do {                                                   \
    std::optional<ApiError> api_err = (expr);            \
    if (api_err.has_value()) return *std::move(api_err); \
  } while (0)

// A range as people write it: [lo, hi], (lo, hi], ...
struct Range {
  double lo;
  bool lo_closed;
  double hi;
  bool hi_closed;
};

std::string FormatNumber(double v) { return absl::StrCat(v); }

std::optional<ApiError> CheckRange(const std::string& param, const std::optional<double>& v,
                                   Range r) {
  if (!v.has_value()) return std::nullopt;
  const double x = *v;
  // Bounds are checked on the double; every bound but 0.01 is a float, so rounding to the
  // sampler's float cannot cross one (top_p's underflow to 0 is handled by the caller).
  if (std::isfinite(x) && (r.lo_closed ? x >= r.lo : x > r.lo) &&
      (r.hi_closed ? x <= r.hi : x < r.hi)) {
    return std::nullopt;
  }
  return InvalidRequest(
      absl::StrCat("'", param, "' must be in ", r.lo_closed ? "[" : "(", FormatNumber(r.lo), ", ",
                   FormatNumber(r.hi), r.hi_closed ? "]" : ")", ", got ", FormatNumber(x)),
      param);
}

std::optional<ApiError> CheckIntRange(const std::string& param, const std::optional<int64_t>& v,
                                      int64_t lo, int64_t hi) {
  if (!v.has_value() || (*v >= lo && *v <= hi)) return std::nullopt;
  return InvalidRequest(
      absl::StrCat("'", param, "' must be an integer in [", lo, ", ", hi, "], got ", *v), param);
}

// Checked and sorted by id; the vocabulary's size is checked with the model (PrepareRequest).
std::optional<ApiError> BuildLogitBias(std::vector<std::pair<int64_t, double>> given,
                                       std::vector<TokenBias>* out) {
  if (given.size() > SamplingParams::kMaxLogitBias) {
    return InvalidRequest(absl::StrCat("'logit_bias' holds ", given.size(), " tokens; at most ",
                                       SamplingParams::kMaxLogitBias, " are allowed"),
                          "logit_bias");
  }
  std::sort(given.begin(), given.end());
  for (size_t i = 0; i < given.size(); ++i) {
    const auto [id, bias] = given[i];
    if (id < 0 || id > kInt32Max) {
      return InvalidRequest(
          absl::StrCat("'logit_bias' keys must be token ids (integers >= 0), got ", id),
          "logit_bias");
    }
    if (i > 0 && given[i - 1].first == id) {
      return InvalidRequest(absl::StrCat("'logit_bias' names token ", id, " twice"), "logit_bias");
    }
    const double lim = SamplingParams::kMaxAbsBias;
    if (!(std::isfinite(bias) && bias >= -lim && bias <= lim)) {
      return InvalidRequest(absl::StrCat("'logit_bias' values must be in [-100, 100], got ",
                                         FormatNumber(bias), " for token ", id),
                            "logit_bias");
    }
    out->push_back({static_cast<int32_t>(id), static_cast<float>(bias)});
  }
  return std::nullopt;
}

// A ratio ParsePopChoice took ("a" or "a/b") as a number.
double PopRatioValue(std::string_view text) {
  const std::vector<absl::string_view> parts =
      absl::StrSplit(absl::StripAsciiWhitespace(absl::string_view(text.data(), text.size())), '/');
  double num = 0, den = 1;
  if (!absl::SimpleAtod(parts[0], &num)) return -1;
  if (parts.size() == 2 && !absl::SimpleAtod(parts[1], &den)) return -1;
  return den == 0 ? -1 : num / den;
}

// Prompt log-probabilities come from the full model over the whole prompt (route_plan.h):
// a request that also asks for a pruned prefill, a POP control or a compression method would get
// numbers from another model or another prompt, so it is refused rather than approximated.
std::optional<ApiError> RefuseApproximatePromptLogprobs(const CompletionRequest& req,
                                                        bool by_echo) {
  if (req.prompt_logprobs < 0) return std::nullopt;
  const std::string asked = by_echo && req.vllm_prompt_logprobs < 0
                                ? "'echo' with 'logprobs' (the prompt's log-probabilities)"
                                : "'prompt_logprobs'";
  const std::string why = absl::StrCat(
      asked, " needs the full model over the whole prompt, which cannot be combined with ");
  if (req.pop.control()) {
    return InvalidRequest(
        absl::StrCat(why, "'tripod.pop_variant' (a POP control runs a pruned model)"),
        "tripod.pop_variant");
  }
  const bool pruned =
      req.pop.kind == PopChoice::Kind::kOn ||
      (req.pop.kind == PopChoice::Kind::kRatio && PopRatioValue(req.pop.ratio) != 0);
  if (pruned) {
    return InvalidRequest(
        absl::StrCat(
            why, "'tripod.pop' \"", req.pop.kind == PopChoice::Kind::kOn ? "on" : req.pop.ratio,
            "\" (POP prefills the prompt with a pruned model); leave it out or use \"off\""),
        "tripod.pop");
  }
  if (req.method.method != DraftMethod::kNone) {
    return InvalidRequest(
        absl::StrCat(why, "'tripod.method' \"", DraftMethodName(req.method.method),
                     "\" (it compresses the prompt or its KV)"),
        "tripod.method");
  }
  return std::nullopt;
}

ApiResult<CompletionRequest> BuildRequest(RawRequest raw) {
  CompletionRequest req;
  req.kind = raw.kind;
  if (raw.model_required && raw.model.empty()) {
    return InvalidRequest("you must provide a model parameter ('model')", "model");
  }
  req.model = std::move(raw.model);

  if (raw.kind == ApiKind::kChatCompletion) {
    if (!raw.has_input) return InvalidRequest("'messages' is required", "messages");
    API_RETURN_IF_ERROR(ValidateChatMessages(&raw.messages));
    req.messages = std::move(raw.messages);
  } else {
    if (!raw.has_input) return InvalidRequest("'prompt' is required", "prompt");
    if (raw.prompt.is_ids) {
      if (raw.prompt.ids.empty()) {
        return InvalidRequest(absl::StrCat("'", raw.prompt_param, "' must not be empty"),
                              raw.prompt_param);
      }
      for (size_t i = 0; i < raw.prompt.ids.size(); ++i) {
        if (raw.prompt.ids[i] < 0) {
          return InvalidRequest(
              absl::StrCat("'", raw.prompt_param, "[", i,
                           "]' must be a token id (an integer >= 0), got ", raw.prompt.ids[i]),
              raw.prompt_param);
        }
      }
      req.prompt_is_ids = true;
      req.prompt_ids = std::move(raw.prompt.ids);
    } else {
      if (raw.prompt.text.empty()) {
        return InvalidRequest(absl::StrCat("'", raw.prompt_param, "' must not be empty"),
                              raw.prompt_param);
      }
      req.prompt_text = std::move(raw.prompt.text);
    }
  }

  // max_tokens 0 with echo: the prompt alone, as vLLM answers lm-evaluation-harness.
  API_RETURN_IF_ERROR(
      CheckIntRange(raw.max_tokens_param, raw.max_tokens, raw.echo ? 0 : 1, kInt32Max));
  req.max_tokens = raw.max_tokens.has_value() ? static_cast<int>(*raw.max_tokens) : -1;
  req.max_tokens_param = raw.max_tokens_param;

  API_RETURN_IF_ERROR(CheckRange("temperature", raw.temperature, {0, true, kMaxTemperature, true}));
  // A positive top_p below the smallest float still means "keep the likeliest token"; rounding
  // it to 0 would make it invalid.
  if (raw.top_p && *raw.top_p > 0 && static_cast<float>(*raw.top_p) == 0.0f) {
    raw.top_p = std::numeric_limits<float>::denorm_min();
  }
  API_RETURN_IF_ERROR(CheckRange("top_p", raw.top_p, {0, false, 1, true}));
  API_RETURN_IF_ERROR(CheckIntRange("top_k", raw.top_k, -1, kInt32Max));
  API_RETURN_IF_ERROR(CheckRange("min_p", raw.min_p, {0, true, 1, true}));
  API_RETURN_IF_ERROR(CheckRange("repetition_penalty", raw.repetition_penalty,
                                 {kMinRepetitionPenalty, true, kMaxRepetitionPenalty, true}));
  API_RETURN_IF_ERROR(CheckRange("presence_penalty", raw.presence_penalty, {-2, true, 2, true}));
  API_RETURN_IF_ERROR(CheckRange("frequency_penalty", raw.frequency_penalty, {-2, true, 2, true}));
  API_RETURN_IF_ERROR(ParseChoiceCounts(raw.n, raw.best_of, raw.stream, &req));
  API_RETURN_IF_ERROR(
      CheckIntRange(raw.top_logprobs_param, raw.top_logprobs, 0, SamplingParams::kMaxTopLogprobs));

  SamplingParams& s = req.sampling;
  if (raw.temperature) s.temperature = static_cast<float>(*raw.temperature);
  if (raw.top_p) s.top_p = static_cast<float>(*raw.top_p);
  if (raw.top_k) s.top_k = *raw.top_k <= 0 ? 0 : static_cast<int>(*raw.top_k);  // -1, 0: off
  if (raw.min_p) s.min_p = static_cast<float>(*raw.min_p);
  if (raw.repetition_penalty) s.repetition_penalty = static_cast<float>(*raw.repetition_penalty);
  if (raw.presence_penalty) s.presence_penalty = static_cast<float>(*raw.presence_penalty);
  if (raw.frequency_penalty) s.frequency_penalty = static_cast<float>(*raw.frequency_penalty);
  if (raw.seed) {
    s.seed = *raw.seed;
    req.has_seed = true;
  }
  req.logprobs = raw.logprobs;
  if (raw.logprobs && raw.top_logprobs) s.top_logprobs = static_cast<int>(*raw.top_logprobs);
  API_RETURN_IF_ERROR(
      CheckIntRange("prompt_logprobs", raw.prompt_logprobs, 0, SamplingParams::kMaxTopLogprobs));
  req.echo = raw.echo;
  req.vllm_prompt_logprobs = static_cast<int>(raw.prompt_logprobs.value_or(-1));
  req.prompt_logprobs =
      std::max(req.vllm_prompt_logprobs, req.echo && req.logprobs ? s.top_logprobs : -1);
  API_RETURN_IF_ERROR(BuildLogitBias(raw.logit_bias, &s.logit_bias));
  API_RETURN_IF_ERROR(CheckIntRange("min_tokens", raw.min_tokens, 0, kInt32Max));
  req.min_tokens = static_cast<int>(raw.min_tokens.value_or(0));
  if (raw.stop_token_ids.size() > static_cast<size_t>(kMaxStopTokenIds)) {
    return InvalidRequest(absl::StrCat("'stop_token_ids' holds ", raw.stop_token_ids.size(),
                                       " tokens; at most ", kMaxStopTokenIds, " are allowed"),
                          "stop_token_ids");
  }
  for (int64_t id : raw.stop_token_ids) {
    if (id < 0 || id > kInt32Max) {
      return InvalidRequest(
          absl::StrCat("'stop_token_ids' must hold token ids (integers >= 0), got ", id),
          "stop_token_ids");
    }
    req.stop_token_ids.push_back(static_cast<int32_t>(id));
  }
  std::sort(req.stop_token_ids.begin(), req.stop_token_ids.end());
  req.stop_token_ids.erase(std::unique(req.stop_token_ids.begin(), req.stop_token_ids.end()),
                           req.stop_token_ids.end());
  // A backstop: the checks above are at least as strict as Validate's.
  if (absl::Status st = s.Validate(); !st.ok()) return InvalidRequest(std::string(st.message()));

  if (raw.stop.size() > static_cast<size_t>(kMaxStops)) {
    return InvalidRequest(absl::StrCat("'stop' holds ", raw.stop.size(), " sequences; at most ",
                                       kMaxStops, " are allowed"),
                          "stop");
  }
  for (size_t i = 0; i < raw.stop.size(); ++i) {
    const size_t len = raw.stop[i].size();
    if (len == 0 || len > static_cast<size_t>(kMaxStopBytes)) {
      return InvalidRequest(
          absl::StrCat("'stop[", i, "]' must be 1 to ", kMaxStopBytes, " bytes long, got ", len),
          "stop");
    }
  }
  req.stop = std::move(raw.stop);
  req.include_stop_str = raw.include_stop_str;
  req.ignore_eos = raw.ignore_eos;
  req.stream = raw.stream;
  req.include_usage = raw.include_usage;
  req.user = std::move(raw.user);

  ApiResult<PopChoice> pop = ParsePopChoice(raw.pop);
  if (auto* e = std::get_if<ApiError>(&pop)) return *std::move(e);
  req.pop = std::get<PopChoice>(std::move(pop));
  const std::string variant(absl::StripAsciiWhitespace(raw.pop_variant));
  if (!variant.empty()) {
    const std::optional<PopVariant> v = ParsePopVariant(variant);
    if (!v.has_value()) {
      return InvalidRequest(absl::StrCat("'tripod.pop_variant' must be \"pop\", \"noboundary\", "
                                         "\"nokv\" or \"shortgpt\", got \"",
                                         variant, "\""),
                            "tripod.pop_variant");
    }
    req.pop.variant = *v;
    if (req.pop.control() && req.pop.kind != PopChoice::Kind::kRatio) {
      return InvalidRequest(
          "'tripod.pop_variant' needs 'tripod.pop' as a ratio (\"1/3\", \"0.25\"): a control "
          "runs on that ratio's layers",
          "tripod.pop_variant");
    }
  }
  const std::string method(absl::StripAsciiWhitespace(raw.method));
  const std::optional<DraftMethod> m = ParseDraftMethod(method);
  if (!m.has_value()) {
    return InvalidRequest(absl::StrCat("'tripod.method' must be one of \"speckv\", \"specpc\", "
                                       "\"draftmap\", \"snapkv\", \"pyramidkv\", "
                                       "\"streamingllm\", \"keeplast\", \"none\", got \"",
                                       method, "\""),
                          "tripod.method");
  }
  req.method.method = *m;
  if (req.pop.control() && *m != DraftMethod::kNone) {
    return InvalidRequest(
        "'tripod.pop_variant' (a POP control) cannot be combined with "
        "'tripod.method': the controls run on untrimmed KV",
        "tripod.pop_variant");
  }
  API_RETURN_IF_ERROR(RefuseApproximatePromptLogprobs(req, raw.echo && raw.logprobs));
  const double budget = raw.budget.value_or(0);
  if (budget != 0) {
    const bool tokens =
        budget >= 1 && budget <= static_cast<double>(kInt32Max) && budget == std::floor(budget);
    const bool fraction = budget > 0 && budget < 1;
    if (!tokens && !fraction) {
      return InvalidRequest(
          absl::StrCat("'tripod.budget' must be a whole number of tokens in [1, 2^31) or a "
                       "fraction of the prompt in (0, 1) (0.25 or \"1/4\"), got ",
                       raw.budget_text),
          "tripod.budget");
    }
    if (*m == DraftMethod::kNone) {
      return InvalidRequest("'tripod.budget' needs a 'tripod.method'", "tripod.budget");
    }
    if (tokens) {
      req.method.budget_tokens = static_cast<int>(budget);
    } else {
      req.method.budget_fraction = budget;
    }
  } else if (*m != DraftMethod::kNone) {
    return InvalidRequest(absl::StrCat("'tripod.method' \"", method,
                                       "\" needs a 'tripod.budget': tokens kept, or a fraction "
                                       "of the prompt"),
                          "tripod.budget");
  }
  return req;
}

// {"50256": -100, ...}: OpenAI's shape, token ids as the keys' decimal text.
std::optional<ApiError> ParseLogitBias(const json& body,
                                       std::vector<std::pair<int64_t, double>>* out) {
  auto it = body.find("logit_bias");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_object()) {
    return InvalidRequest("'logit_bias' must be an object of token ids to biases", "logit_bias");
  }
  for (const auto& [key, value] : it->items()) {
    int64_t id = 0;
    if (!absl::SimpleAtoi(key, &id)) {
      return InvalidRequest(
          absl::StrCat("'logit_bias' keys must be token ids (integers >= 0), got \"",
                       key.substr(0, 32), "\""),
          "logit_bias");
    }
    if (!value.is_number()) {
      return InvalidRequest(absl::StrCat("'logit_bias' values must be numbers (token ", id, ")"),
                            "logit_bias");
    }
    out->emplace_back(id, value.get<double>());
  }
  return std::nullopt;
}

std::optional<ApiError> ParseStopTokenIds(const json& body, std::vector<int64_t>* out) {
  auto it = body.find("stop_token_ids");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_array()) {
    return InvalidRequest("'stop_token_ids' must be a list of token ids", "stop_token_ids");
  }
  for (const json& v : *it) {
    int64_t id = 0;
    if (!JsonToInt64(v, &id)) {
      return InvalidRequest(
          absl::StrCat("'stop_token_ids' must hold integers, got ", v.dump().substr(0, 32)),
          "stop_token_ids");
    }
    out->push_back(id);
  }
  return std::nullopt;
}

std::optional<ApiError> ParseStop(const json& body, std::vector<std::string>* out) {
  auto it = body.find("stop");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) {
    out->push_back(it->get<std::string>());
    return std::nullopt;
  }
  if (it->is_array()) {
    for (size_t i = 0; i < it->size(); ++i) {
      const json& s = (*it)[i];
      if (!s.is_string()) {
        return InvalidRequest(absl::StrCat("'stop[", i, "]' must be a string"), "stop");
      }
      out->push_back(s.get<std::string>());
    }
    return std::nullopt;
  }
  return InvalidRequest("'stop' must be a string or a list of strings", "stop");
}

std::optional<ApiError> ParseSeed(const json& body, std::optional<uint64_t>* out) {
  auto it = body.find("seed");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (it->is_number_unsigned()) {
    *out = it->get<uint64_t>();
    return std::nullopt;
  }
  int64_t v = 0;
  if (!JsonToInt64(*it, &v)) {
    return InvalidRequest(absl::StrCat("'seed' must be an integer in [-2^63, 2^64), got ",
                                       it->is_number() ? it->dump() : it->type_name()),
                          "seed");
  }
  *out = static_cast<uint64_t>(v);  // negative seeds wrap: any 64 bits make a seed
  return std::nullopt;
}

std::optional<ApiError> ParseTripodObject(const json& body, RawRequest* raw) {
  auto it = body.find("tripod");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_object()) return InvalidRequest("'tripod' must be an object", "tripod");
  const json& t = *it;
  for (const auto& [key, value] : t.items()) {
    if (value.is_null() || key == "pop" || key == "pop_variant" || key == "method" ||
        key == "budget") {
      continue;
    }
    const std::string param = absl::StrCat("tripod.", key.substr(0, 64));
    return InvalidRequest(absl::StrCat("'", param, "' is not supported by this server"), param);
  }
  auto pop = t.find("pop");
  if (pop != t.end() && !pop->is_null()) {
    if (pop->is_string()) {
      raw->pop = pop->get<std::string>();
    } else if (pop->is_number() && !pop->is_boolean()) {
      // The shortest text that reads back as the same double ("0.25"), which the prefill worker
      // parses like any ratio string.
      const double r = pop->get<double>();
      if (!std::isfinite(r)) {
        return InvalidRequest("'tripod.pop' must be a finite number", "tripod.pop");
      }
      raw->pop = pop->dump();
    } else {
      return InvalidRequest(
          "'tripod.pop' must be \"off\", \"on\", or a ratio in [0, 1) (\"1/3\", \"0.25\" or a "
          "number)",
          "tripod.pop");
    }
  }
  std::optional<std::string> pop_variant;
  API_RETURN_IF_ERROR(GetString(t, "pop_variant", &pop_variant, "tripod.pop_variant"));
  raw->pop_variant = pop_variant.value_or("");
  std::optional<std::string> method;
  API_RETURN_IF_ERROR(GetString(t, "method", &method, "tripod.method"));
  raw->method = method.value_or("");
  auto budget = t.find("budget");
  if (budget != t.end() && !budget->is_null()) {
    double b = 0;
    if (budget->is_number() && !budget->is_boolean()) {
      b = budget->get<double>();
      raw->budget_text = budget->dump();
    } else if (budget->is_string()) {
      // "1/4" as the pop ratios are written; "0.25" and "256" too.
      raw->budget_text = absl::StrCat("\"", budget->get<std::string>(), "\"");
      const std::vector<absl::string_view> parts = absl::StrSplit(budget->get<std::string>(), '/');
      double num = 0, den = 1;
      const bool parsed = parts.size() <= 2 && absl::SimpleAtod(parts[0], &num) &&
                          (parts.size() == 1 || absl::SimpleAtod(parts[1], &den));
      b = parsed && den != 0 ? num / den : std::nan("");
      if (parsed && den != 0 && parts.size() == 2 && !(b > 0 && b < 1)) b = std::nan("");
    } else {
      return InvalidRequest(
          absl::StrCat("'tripod.budget' must be a number or a string like \"1/4\", got ",
                       budget->type_name()),
          "tripod.budget");
    }
    if (!std::isfinite(b)) b = -1;  // refused with the text in BuildRequest
    raw->budget = b;
  }
  return std::nullopt;
}

std::optional<ApiError> FillFromJson(const json& body, ApiKind kind, RawRequest* raw) {
  raw->kind = kind;
  API_RETURN_IF_ERROR(RefuseUnsupportedFields(body, kind));
  std::optional<std::string> model;
  API_RETURN_IF_ERROR(GetString(body, "model", &model));
  raw->model = model.value_or("");

  if (kind == ApiKind::kChatCompletion) {
    auto it = body.find("messages");
    if (it != body.end() && !it->is_null()) {
      API_RETURN_IF_ERROR(ParseChatMessagesJson(*it, &raw->messages));
      raw->has_input = true;
    }
  } else {
    auto it = body.find("prompt");
    if (it != body.end() && !it->is_null()) {
      API_RETURN_IF_ERROR(ParsePromptJson(*it, &raw->prompt));
      raw->has_input = true;
    }
  }

  std::optional<int64_t> max_tokens, max_completion_tokens;
  API_RETURN_IF_ERROR(GetInt(body, "max_tokens", &max_tokens));
  API_RETURN_IF_ERROR(GetInt(body, "max_completion_tokens", &max_completion_tokens));
  if (max_completion_tokens) {  // OpenAI: the newer name wins
    raw->max_tokens = max_completion_tokens;
    raw->max_tokens_param = "max_completion_tokens";
  } else {
    raw->max_tokens = max_tokens;
  }

  API_RETURN_IF_ERROR(GetNumber(body, "temperature", &raw->temperature));
  API_RETURN_IF_ERROR(GetNumber(body, "top_p", &raw->top_p));
  API_RETURN_IF_ERROR(GetInt(body, "top_k", &raw->top_k));
  API_RETURN_IF_ERROR(GetNumber(body, "min_p", &raw->min_p));
  API_RETURN_IF_ERROR(GetNumber(body, "repetition_penalty", &raw->repetition_penalty));
  API_RETURN_IF_ERROR(GetNumber(body, "presence_penalty", &raw->presence_penalty));
  API_RETURN_IF_ERROR(GetNumber(body, "frequency_penalty", &raw->frequency_penalty));
  API_RETURN_IF_ERROR(ParseStop(body, &raw->stop));
  API_RETURN_IF_ERROR(ParseSeed(body, &raw->seed));
  API_RETURN_IF_ERROR(ParseLogitBias(body, &raw->logit_bias));
  API_RETURN_IF_ERROR(ParseStopTokenIds(body, &raw->stop_token_ids));
  API_RETURN_IF_ERROR(GetInt(body, "min_tokens", &raw->min_tokens));
  API_RETURN_IF_ERROR(GetInt(body, "n", &raw->n));
  API_RETURN_IF_ERROR(GetInt(body, "best_of", &raw->best_of));

  if (kind == ApiKind::kChatCompletion) {
    std::optional<bool> logprobs;
    API_RETURN_IF_ERROR(GetBool(body, "logprobs", &logprobs));
    raw->logprobs = logprobs.value_or(false);
    API_RETURN_IF_ERROR(GetInt(body, "top_logprobs", &raw->top_logprobs));
    raw->top_logprobs_param = "top_logprobs";
    if (raw->top_logprobs.value_or(0) > 0 && !raw->logprobs) {
      return InvalidRequest("'top_logprobs' needs 'logprobs' set to true", "top_logprobs");
    }
  } else {
    API_RETURN_IF_ERROR(GetInt(body, "logprobs", &raw->top_logprobs));
    raw->logprobs = raw->top_logprobs.has_value();
  }

  std::optional<bool> flag;
  API_RETURN_IF_ERROR(GetBool(body, "ignore_eos", &flag));
  raw->ignore_eos = flag.value_or(false);
  flag.reset();
  API_RETURN_IF_ERROR(GetBool(body, "stream", &flag));
  raw->stream = flag.value_or(false);
  auto so = body.find("stream_options");
  if (so != body.end() && !so->is_null()) {
    if (!so->is_object())
      return InvalidRequest("'stream_options' must be an object", "stream_options");
    if (!raw->stream) {
      return InvalidRequest("'stream_options' is only allowed when 'stream' is true",
                            "stream_options");
    }
    for (const auto& [key, value] : so->items()) {
      if (value.is_null() || key == "include_usage") continue;
      const std::string param = absl::StrCat("stream_options.", key.substr(0, 64));
      return InvalidRequest(absl::StrCat("'", param, "' is not supported by this server"), param);
    }
    flag.reset();
    API_RETURN_IF_ERROR(GetBool(*so, "include_usage", &flag, "stream_options.include_usage"));
    raw->include_usage = flag.value_or(false);
  }
  std::optional<std::string> user;
  API_RETURN_IF_ERROR(GetString(body, "user", &user));
  raw->user = user.value_or("");
  if (kind == ApiKind::kCompletion) {
    flag.reset();
    API_RETURN_IF_ERROR(GetBool(body, "echo", &flag));
    raw->echo = flag.value_or(false);
  }
  API_RETURN_IF_ERROR(GetInt(body, "prompt_logprobs", &raw->prompt_logprobs));
  flag.reset();
  API_RETURN_IF_ERROR(GetBool(body, "include_stop_str_in_output", &flag));
  raw->include_stop_str = flag.value_or(false);
  return ParseTripodObject(body, raw);
}

}  // namespace

ApiResult<PopChoice> ParsePopChoice(std::string_view raw_text) {
  PopChoice p;
  const absl::string_view text =
      absl::StripAsciiWhitespace(absl::string_view(raw_text.data(), raw_text.size()));
  if (text.empty()) return p;
  if (text == "off") {
    p.kind = PopChoice::Kind::kOff;
    return p;
  }
  if (text == "on") {
    p.kind = PopChoice::Kind::kOn;
    return p;
  }
  const std::vector<absl::string_view> parts = absl::StrSplit(text, '/');
  double num = 0, den = 1;
  const bool parsed = parts.size() <= 2 && absl::SimpleAtod(parts[0], &num) &&
                      (parts.size() == 1 || absl::SimpleAtod(parts[1], &den));
  const double r = num / den;
  if (!parsed || !std::isfinite(num) || !std::isfinite(den) || den == 0 || !(r >= 0 && r < 1)) {
    return InvalidRequest(
        absl::StrCat("'tripod.pop' must be \"off\", \"on\", or a ratio in [0, 1) ",
                     "like \"1/3\" or \"0.25\", got \"", text, "\""),
        "tripod.pop");
  }
  p.kind = PopChoice::Kind::kRatio;
  p.ratio = std::string(text);
  return p;
}

// tools, tool_choice and parallel_tool_calls (tool_calls.h). The tools are read again from the
// text in their own key order, which the template's rendering keeps.
std::optional<ApiError> ParseToolFields(const json& body, std::string_view text,
                                        CompletionRequest* request) {
  const bool chat = request->kind == ApiKind::kChatCompletion;
  nlohmann::ordered_json ordered;  // the tools in the client's key order
  if (auto it = body.find("tools"); it != body.end() && !it->is_null()) {
    if (!chat && !it->empty()) {
      return InvalidRequest("'tools' is for /v1/chat/completions", "tools");
    }
    ordered = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false)["tools"];
    API_RETURN_IF_ERROR(ParseTools(ordered, request));
  }
  if (auto it = body.find("tool_choice"); it != body.end()) {
    API_RETURN_IF_ERROR(ParseToolChoice(*it, request));
  }
  std::optional<bool> parallel;
  API_RETURN_IF_ERROR(GetBool(body, "parallel_tool_calls", &parallel));
  request->parallel_tool_calls = parallel.value_or(true);
  if (request->tool_choice != ToolChoice::kRequired && request->tool_choice != ToolChoice::kNamed) {
    return std::nullopt;
  }
  // A forced call: the output is constrained to Qwen2.5's call blocks, each naming an allowed
  // tool with arguments that match its parameters' schema (common/structured).
  if (!request->output_regex.empty()) {
    return InvalidRequest(
        "'tool_choice' \"required\" or a named function constrains the output already; it "
        "cannot be combined with a structured output",
        "tool_choice");
  }
  std::vector<std::string> calls;
  for (size_t i = 0; i < request->tool_names.size(); ++i) {
    const std::string& name = request->tool_names[i];
    if (request->tool_choice == ToolChoice::kNamed && name != request->tool_choice_name) continue;
    const nlohmann::ordered_json& fn = ordered[i]["function"];
    std::string args = structured::JsonObjectRegex();
    if (fn.contains("parameters") && !fn["parameters"].is_null()) {
      absl::StatusOr<std::string> r = structured::JsonSchemaToRegex(fn["parameters"]);
      if (!r.ok()) {
        return InvalidRequest(absl::StrCat("'tools[", i, "].function.parameters': ",
                                           r.status().message(), " (a forced call needs it)"),
                              absl::StrCat("tools[", i, "].function.parameters"));
      }
      args = *std::move(r);
    }
    calls.push_back(absl::StrCat(
        structured::ChoiceRegex({absl::StrCat("{\"name\": \"", name, "\", \"arguments\": ")}), "(",
        args, ")", structured::ChoiceRegex({"}"})));
  }
  const std::string one =
      absl::StrCat(structured::ChoiceRegex({"<tool_call>\n"}), "(", absl::StrJoin(calls, "|"), ")",
                   structured::ChoiceRegex({"\n</tool_call>"}));
  std::string regex = one;
  if (request->parallel_tool_calls) {
    absl::StrAppend(&regex, "(", structured::ChoiceRegex({"\n"}), one, ")*");
  }
  ApiResult<std::string> checked = CheckOutputRegex(regex, "tool_choice");
  if (auto* e = std::get_if<ApiError>(&checked)) return *std::move(e);
  request->output_regex = std::get<std::string>(std::move(checked));
  return std::nullopt;
}

namespace {

// BuildRequest with the fields whose values are JSON documents (structured outputs, tools), read
// from `body` and, keeping its key order, from its `text`: HTTP's whole body, or gRPC's fields as
// the JSON they stand for. One path for both doors.
ApiResult<CompletionRequest> BuildWithJsonFields(RawRequest raw, const json& body,
                                                 std::string_view text) {
  std::string output_regex;
  if (HasStructuredOutput(body)) {
    // Parsed again keeping the key order, which a schema's properties are generated in.
    ApiResult<std::string> r = ParseStructuredOutput(nlohmann::ordered_json::parse(text));
    if (auto* e = std::get_if<ApiError>(&r)) return *std::move(e);
    output_regex = std::get<std::string>(std::move(r));
  }
  ApiResult<CompletionRequest> req = BuildRequest(std::move(raw));
  if (auto* r = std::get_if<CompletionRequest>(&req)) {
    r->output_regex = std::move(output_regex);
    API_RETURN_IF_ERROR(ParseToolFields(body, text, r));
  }
  return req;
}

// A proto tool as OpenAI's JSON, keys in the order a client writes them (the template renders
// them so).
ApiResult<nlohmann::ordered_json> ToolJson(const tripod::v1::Tool& tool, int i) {
  nlohmann::ordered_json fn;
  fn["name"] = tool.name();
  if (!tool.description().empty()) fn["description"] = tool.description();
  if (!tool.parameters().empty()) {
    const std::string param = absl::StrCat("tools[", i, "].function.parameters");
    if (JsonTooDeep(tool.parameters())) {
      return InvalidRequest(
          absl::StrCat("'", param, "' nests lists/objects deeper than ", kMaxJsonDepth, " levels"),
          param);
    }
    nlohmann::ordered_json params =
        nlohmann::ordered_json::parse(tool.parameters(), nullptr, /*allow_exceptions=*/false);
    if (params.is_discarded()) {
      return InvalidRequest(absl::StrCat("'", param, "' is not valid JSON"), param);
    }
    fn["parameters"] = std::move(params);
  }
  if (tool.has_strict()) fn["strict"] = tool.strict();
  return nlohmann::ordered_json{{"type", "function"}, {"function", std::move(fn)}};
}

// gRPC's fields that HTTP carries as JSON, as the HTTP body would hold them: the messages (with
// their earlier tool calls), echo, structured outputs, tools. Only those given.
ApiResult<nlohmann::ordered_json> JsonFieldsOf(const tripod::v1::CompletionRequest& p) {
  using OJson = nlohmann::ordered_json;
  OJson body = OJson::object();
  if (p.has_messages()) {
    OJson messages = OJson::array();
    for (const tripod::v1::ChatMessage& m : p.messages().messages()) {
      OJson msg = {{"role", m.role()}, {"content", m.content()}};
      if (m.tool_calls_size() > 0) {
        OJson calls = OJson::array();
        for (const tripod::v1::ToolCall& c : m.tool_calls()) {
          calls.push_back({{"id", c.id()},
                           {"type", "function"},
                           {"function", {{"name", c.name()}, {"arguments", c.arguments()}}}});
        }
        msg["tool_calls"] = std::move(calls);
      }
      messages.push_back(std::move(msg));
    }
    body["messages"] = std::move(messages);
  }
  if (p.echo()) body["echo"] = true;
  switch (p.structured_output_case()) {
    case tripod::v1::CompletionRequest::kResponseFormat: {
      const tripod::v1::ResponseFormat& rf = p.response_format();
      OJson j = {{"type", rf.type()}};
      if (rf.type() == "json_schema") {
        OJson js = OJson::object();
        if (!rf.name().empty()) js["name"] = rf.name();
        // As JSON text, which the structured-output parser reads (and refuses) as HTTP's.
        if (!rf.schema().empty()) js["schema"] = rf.schema();
        if (rf.has_strict()) js["strict"] = rf.strict();
        j["json_schema"] = std::move(js);
      }
      body["response_format"] = std::move(j);
      break;
    }
    case tripod::v1::CompletionRequest::kGuidedJson:
      body["guided_json"] = p.guided_json();
      break;
    case tripod::v1::CompletionRequest::kGuidedRegex:
      body["guided_regex"] = p.guided_regex();
      break;
    case tripod::v1::CompletionRequest::kGuidedChoice: {
      OJson choices = OJson::array();
      for (const std::string& c : p.guided_choice().choices()) choices.push_back(c);
      body["guided_choice"] = std::move(choices);
      break;
    }
    case tripod::v1::CompletionRequest::STRUCTURED_OUTPUT_NOT_SET:
      break;
  }
  if (p.tools_size() > 0) {
    OJson tools = OJson::array();
    for (int i = 0; i < p.tools_size(); ++i) {
      ApiResult<OJson> t = ToolJson(p.tools(i), i);
      if (auto* e = std::get_if<ApiError>(&t)) return *std::move(e);
      tools.push_back(std::get<OJson>(std::move(t)));
    }
    body["tools"] = std::move(tools);
  }
  switch (p.tool_choice().choice_case()) {
    case tripod::v1::ToolChoice::kMode:
      body["tool_choice"] = p.tool_choice().mode();
      break;
    case tripod::v1::ToolChoice::kFunction:
      body["tool_choice"] = {{"type", "function"},
                             {"function", {{"name", p.tool_choice().function()}}}};
      break;
    case tripod::v1::ToolChoice::CHOICE_NOT_SET:
      break;
  }
  if (p.has_parallel_tool_calls()) body["parallel_tool_calls"] = p.parallel_tool_calls();
  return body;
}

}  // namespace

ApiResult<CompletionRequest> ParseCompletionBody(std::string_view body, ApiKind kind) {
  ApiResult<json> parsed = ParseJsonObject(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *std::move(e);
  RawRequest raw;
  API_RETURN_IF_ERROR(FillFromJson(std::get<json>(parsed), kind, &raw));
  return BuildWithJsonFields(std::move(raw), std::get<json>(parsed), body);
}

ApiResult<CompletionRequest> CompletionRequestFromProto(const tripod::v1::CompletionRequest& p,
                                                        bool stream) {
  using Proto = tripod::v1::CompletionRequest;
  RawRequest raw;
  raw.stream = stream;
  ApiResult<nlohmann::ordered_json> json_fields = JsonFieldsOf(p);
  if (auto* e = std::get_if<ApiError>(&json_fields)) return *std::move(e);
  const std::string text = DumpJson(std::get<nlohmann::ordered_json>(json_fields));
  const json body = json::parse(text);
  raw.model_required = false;  // gRPC: empty is the served model
  raw.model = p.model();
  switch (p.input_case()) {
    case Proto::kPrompt:
      raw.kind = ApiKind::kCompletion;
      raw.prompt.text = p.prompt();
      raw.has_input = true;
      break;
    case Proto::kPromptIds:
      raw.kind = ApiKind::kCompletion;
      raw.prompt.is_ids = true;
      raw.prompt.ids.assign(p.prompt_ids().ids().begin(), p.prompt_ids().ids().end());
      raw.prompt_param = "prompt_ids";
      raw.has_input = true;
      break;
    case Proto::kMessages:
      raw.kind = ApiKind::kChatCompletion;
      API_RETURN_IF_ERROR(ParseChatMessagesJson(body["messages"], &raw.messages));
      raw.has_input = true;
      break;
    case Proto::INPUT_NOT_SET:
      return InvalidRequest("one of 'prompt', 'prompt_ids' or 'messages' is required", "prompt");
  }
  // The door's rules (echo only for completions, tools only for chat), as HTTP's table has them.
  API_RETURN_IF_ERROR(RefuseUnsupportedFields(body, raw.kind));
  if (p.has_max_tokens()) raw.max_tokens = p.max_tokens();
  if (p.has_temperature()) raw.temperature = p.temperature();
  if (p.has_top_p()) raw.top_p = p.top_p();
  if (p.has_top_k()) raw.top_k = p.top_k();
  if (p.has_min_p()) raw.min_p = p.min_p();
  if (p.has_repetition_penalty()) raw.repetition_penalty = p.repetition_penalty();
  if (p.has_presence_penalty()) raw.presence_penalty = p.presence_penalty();
  if (p.has_frequency_penalty()) raw.frequency_penalty = p.frequency_penalty();
  raw.stop.assign(p.stop().begin(), p.stop().end());
  if (p.has_seed()) raw.seed = p.seed();
  for (const auto& [id, bias] : p.logit_bias()) raw.logit_bias.emplace_back(id, bias);
  raw.stop_token_ids.assign(p.stop_token_ids().begin(), p.stop_token_ids().end());
  if (p.has_min_tokens()) raw.min_tokens = p.min_tokens();
  if (p.has_n()) raw.n = p.n();
  if (p.has_best_of()) raw.best_of = p.best_of();
  raw.echo = p.echo();
  if (p.has_prompt_logprobs()) raw.prompt_logprobs = p.prompt_logprobs();
  raw.include_stop_str = p.include_stop_str_in_output();
  if (p.has_logprobs()) {
    raw.logprobs = true;
    raw.top_logprobs = p.logprobs();
  }
  raw.ignore_eos = p.ignore_eos();
  raw.user = p.user();
  raw.pop = p.tripod().pop();
  raw.pop_variant = p.tripod().pop_variant();
  raw.method = p.tripod().method();
  if (p.tripod().budget() != 0) {
    raw.budget = p.tripod().budget();
    raw.budget_text = absl::StrCat(p.tripod().budget());
  } else if (p.tripod().budget_fraction() != 0) {
    const double f = p.tripod().budget_fraction();
    // A fraction must stay one: 1.0 or 2.0 would read as a token count.
    raw.budget = std::isfinite(f) && f > 0 && f < 1 ? f : -1;
    raw.budget_text = absl::StrCat(f, " (budget_fraction)");
  }
  return BuildWithJsonFields(std::move(raw), body, text);
}

}  // namespace tripod::scheduler
