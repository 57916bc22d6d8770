#include "scheduler/request_preparation.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "scheduler/openai_tokens.h"

namespace tripod::scheduler {

std::optional<ApiError> CheckModelName(const std::string& model, const ServedModel& served) {
  if (model.empty() || model == served.name) return std::nullopt;
  for (const std::string& alias : served.aliases) {
    if (model == alias) return std::nullopt;
  }
  return ApiError{404,
                  absl::StrCat("The model '", model, "' does not exist; this server serves '",
                               served.name, "'"),
                  "invalid_request_error", "model", "model_not_found"};
}

std::optional<ApiError> RefuseUnreadTooLong(const CompletionRequest& request,
                                            const ServedModel& served) {
  const int64_t context = served.max_model_len;
  if (context <= 0 || request.prompt_is_ids) return std::nullopt;
  const bool chat = request.kind == ApiKind::kChatCompletion;
  std::string joined;  // the messages are encoded as one text, the template's between them
  if (chat) {
    for (const ChatMessage& m : request.messages) joined += m.content;
  }
  const std::string_view text = chat ? std::string_view(joined) : request.prompt_text;
  const size_t bytes = text.size();
  const size_t at_least = served.tokenizer->MinTokens(text);
  if (at_least < static_cast<size_t>(context)) return std::nullopt;
  const char* input = chat ? "messages" : "prompt";
  ApiError e = InvalidRequest(
      absl::StrCat("This model's maximum context length is ", context, " tokens. However, your ",
                   input, " of ", bytes, " bytes is at least ", at_least,
                   " tokens, which leaves no room for a completion."),
      input);
  e.code = "context_length_exceeded";
  return e;
}

ApiResult<PreparedRequest> PrepareRequest(const CompletionRequest& request,
                                          const ServedModel& served) {
  if (std::optional<ApiError> e = CheckModelName(request.model, served)) return *e;
  const bool chat = request.kind == ApiKind::kChatCompletion;
  if (chat && !served.chat_template.has_value()) {
    return InvalidRequest(
        absl::StrCat("chat completions are not available: ", served.chat_template_error),
        "messages");
  }
  if (std::optional<ApiError> e = RefuseUnreadTooLong(request, served)) return *e;
  const int32_t vocab = served.tokenizer->vocab_size();
  for (int32_t id : request.stop_token_ids) {
    if (id >= vocab) {
      return InvalidRequest(absl::StrCat("'stop_token_ids' names token ", id,
                                         ", which is not in the vocabulary (", vocab, " tokens)"),
                            "stop_token_ids");
    }
  }
  for (const TokenBias& b : request.sampling.logit_bias) {
    if (b.id >= vocab) {
      return InvalidRequest(absl::StrCat("'logit_bias' names token ", b.id,
                                         ", which is not in the vocabulary (", vocab, " tokens)"),
                            "logit_bias");
    }
  }
  ApiResult<std::vector<int32_t>> ids =
      PromptTokenIds(request, *served.tokenizer, served.chat_template.value_or(ChatTemplate{}));
  if (const ApiError* e = std::get_if<ApiError>(&ids)) return *e;
  PreparedRequest p;
  p.prompt = std::move(std::get<std::vector<int32_t>>(ids));
  const int64_t n = static_cast<int64_t>(p.prompt.size());
  const int64_t context = served.max_model_len;
  const char* input = chat ? "messages" : "prompt";
  if (context > 0 && n >= context) {
    ApiError e = InvalidRequest(
        absl::StrCat("This model's maximum context length is ", context, " tokens. However, your ",
                     chat ? "messages" : "prompt", " resulted in ", n,
                     " tokens, which leaves no room for a completion."),
        input);
    e.code = "context_length_exceeded";
    return e;
  }
  int64_t max_tokens = request.max_tokens;
  if (max_tokens < 0) max_tokens = context > 0 ? context - n : 16;
  if (context > 0 && n + max_tokens > context) {
    ApiError e =
        InvalidRequest(absl::StrCat("This model's maximum context length is ", context,
                                    " tokens. However, you requested ", n + max_tokens, " tokens (",
                                    n, " in the ", chat ? "messages" : "prompt", ", ", max_tokens,
                                    " for the completion). Please reduce the length of the ",
                                    chat ? "messages" : "prompt", " or the completion."),
                       request.max_tokens_param);
    e.code = "context_length_exceeded";
    return e;
  }
  p.max_tokens = static_cast<int>(max_tokens);
  p.sampling = request.sampling;
  if (!request.has_seed) {
    // Each request its own draw, as OpenAI's API without a seed.
    thread_local std::mt19937_64 rng{std::random_device{}()};
    p.sampling.seed = rng();
  }
  p.stop = request.stop;
  p.include_stop_str = request.include_stop_str;
  p.stop_token_ids = request.stop_token_ids;
  if (request.min_tokens > max_tokens) {
    return InvalidRequest(
        absl::StrCat("'min_tokens' (", request.min_tokens,
                     ") must not exceed the completion's maximum of ", max_tokens, " tokens"),
        "min_tokens");
  }
  p.min_tokens = request.min_tokens;
  p.ignore_eos = request.ignore_eos;
  p.output_regex = request.output_regex;
  p.pop = request.pop;
  p.method = request.method;
  p.n = request.best_of;
  p.prompt_logprobs = request.prompt_logprobs;
  return p;
}

}  // namespace tripod::scheduler
