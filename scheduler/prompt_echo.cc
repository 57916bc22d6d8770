#include "scheduler/prompt_echo.h"

#include <algorithm>
#include <string>
#include <utility>

#include "scheduler/openai_response.h"

namespace tripod::scheduler {

using ojson = nlohmann::ordered_json;

PromptEcho MakePromptEcho(const CompletionRequest& request, std::span<const int32_t> prompt,
                          const Tokenizer& tokenizer) {
  PromptEcho e;
  e.echo = request.kind == ApiKind::kCompletion && request.echo;
  e.echo_logprobs = e.echo && request.logprobs;
  e.vllm_prompt_logprobs = request.vllm_prompt_logprobs;
  e.ids.assign(prompt.begin(), prompt.end());
  if (e.echo) e.text = request.prompt_is_ids ? tokenizer.Decode(prompt) : request.prompt_text;
  return e;
}

ojson EchoLogprobs(const PromptEcho& echo, int top_logprobs, const Tokenizer& tokenizer,
                   int64_t* offset) {
  ojson out = {{"tokens", ojson::array()},
               {"token_logprobs", ojson::array()},
               {"top_logprobs", ojson::array()},
               {"text_offset", ojson::array()}};
  ojson &texts = out["tokens"], &lps = out["token_logprobs"], &tops = out["top_logprobs"],
        &offsets = out["text_offset"];
  int64_t at = 0;
  for (size_t i = 0; i < echo.ids.size(); ++i) {
    const std::string piece = TokenPiece(tokenizer, echo.ids[i]);
    texts.push_back(piece);
    offsets.push_back(at);
    at += CodePoints(piece);
    const PromptLogprob* lp = i == 0 || i > echo.logprobs.size() ? nullptr : &echo.logprobs[i - 1];
    if (lp == nullptr) {
      lps.push_back(nullptr);
      tops.push_back(nullptr);
      continue;
    }
    lps.push_back(FiniteLogprob(lp->logprob));
    ojson top = ojson::object();
    const size_t k = std::min(lp->top.size(), static_cast<size_t>(std::max(top_logprobs, 0)));
    for (size_t j = 0; j < k; ++j) {
      const std::string p = TokenPiece(tokenizer, lp->top[j].id);
      if (!top.contains(p)) top[p] = FiniteLogprob(lp->top[j].logprob);
    }
    // OpenAI's top_logprobs hold the token itself too.
    if (k > 0 && !top.contains(piece)) top[piece] = FiniteLogprob(lp->logprob);
    tops.push_back(std::move(top));
  }
  *offset = CodePoints(echo.text);
  return out;
}

ojson VllmPromptLogprobs(const PromptEcho& echo, const Tokenizer& tokenizer) {
  ojson out = ojson::array();
  if (echo.ids.empty()) return out;
  out.push_back(nullptr);
  auto entry = [&](int32_t id, float logprob, int32_t rank) {
    return ojson{{"logprob", FiniteLogprob(logprob)},
                 {"rank", rank},
                 {"decoded_token", TokenPiece(tokenizer, id)}};
  };
  for (const PromptLogprob& lp : echo.logprobs) {
    ojson pos = ojson::object();
    pos[std::to_string(lp.id)] = entry(lp.id, lp.logprob, lp.rank);
    const size_t k =
        std::min(lp.top.size(), static_cast<size_t>(std::max(echo.vllm_prompt_logprobs, 0)));
    for (size_t j = 0; j < k; ++j) {
      const std::string key = std::to_string(lp.top[j].id);
      if (!pos.contains(key)) {
        pos[key] = entry(lp.top[j].id, lp.top[j].logprob, static_cast<int32_t>(j + 1));
      }
    }
    out.push_back(std::move(pos));
  }
  return out;
}

void AppendLogprobs(ojson more, ojson* into) {
  for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
    for (ojson& v : more[key]) (*into)[key].push_back(std::move(v));
  }
}

}  // namespace tripod::scheduler
