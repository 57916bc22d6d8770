#include "scheduler/openai_response.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/utf8.h"
#include "scheduler/openai_json.h"

namespace tripod::scheduler {
namespace {

using ojson = nlohmann::ordered_json;

ojson Bytes(std::string_view s) {
  ojson a = ojson::array();
  for (unsigned char c : s) a.push_back(static_cast<int>(c));
  return a;
}

ojson NullIfNegative(double v) { return v < 0 ? ojson() : ojson(v); }

bool HasToken(const GeneratedToken& t) { return t.id >= 0; }

size_t TopCount(const ResponseContext& ctx, const GeneratedToken& t) {
  return std::min(t.top.size(), static_cast<size_t>(std::max(ctx.top_logprobs, 0)));
}

// Completions' logprobs object for these tokens; *offset advances over their text.
ojson CompletionLogprobs(const ResponseContext& ctx, std::span<const GeneratedToken> tokens,
                         const Tokenizer& tokenizer, int64_t* offset) {
  ojson texts = ojson::array(), lps = ojson::array(), tops = ojson::array(),
        offsets = ojson::array();
  for (const GeneratedToken& t : tokens) {
    if (HasToken(t)) {
      texts.push_back(TokenPiece(tokenizer, t.id));
      lps.push_back(FiniteLogprob(t.logprob));
      ojson top = ojson::object();
      for (size_t i = 0; i < TopCount(ctx, t); ++i) {
        // Two ids may decode alike; the likelier (first) keeps the key.
        const std::string piece = TokenPiece(tokenizer, t.top[i].id);
        if (!top.contains(piece)) top[piece] = FiniteLogprob(t.top[i].logprob);
      }
      tops.push_back(std::move(top));
      offsets.push_back(*offset);
    }
    *offset += CodePoints(t.text);
  }
  ojson out;
  out["tokens"] = std::move(texts);
  out["token_logprobs"] = std::move(lps);
  out["top_logprobs"] = std::move(tops);
  out["text_offset"] = std::move(offsets);
  return out;
}

ojson ChatLogprobEntry(const std::string& piece, float logprob) {
  ojson e;
  e["token"] = piece;
  e["logprob"] = FiniteLogprob(logprob);
  e["bytes"] = Bytes(piece);
  return e;
}

ojson ChatLogprobs(const ResponseContext& ctx, std::span<const GeneratedToken> tokens,
                   const Tokenizer& tokenizer) {
  ojson content = ojson::array();
  for (const GeneratedToken& t : tokens) {
    if (!HasToken(t)) continue;
    ojson e = ChatLogprobEntry(TokenPiece(tokenizer, t.id), t.logprob);
    ojson top = ojson::array();
    for (size_t i = 0; i < TopCount(ctx, t); ++i) {
      top.push_back(ChatLogprobEntry(TokenPiece(tokenizer, t.top[i].id), t.top[i].logprob));
    }
    e["top_logprobs"] = std::move(top);
    content.push_back(std::move(e));
  }
  ojson out;
  out["content"] = std::move(content);
  return out;
}

std::string JoinText(std::span<const GeneratedToken> tokens) {
  std::string text;
  for (const GeneratedToken& t : tokens) text += t.text;
  return text;
}

void FillProtoLogprobs(const ResponseContext& ctx, std::span<const GeneratedToken> tokens,
                       const Tokenizer& tokenizer,
                       google::protobuf::RepeatedPtrField<tripod::v1::TokenLogprob>* out) {
  if (!ctx.logprobs) return;
  for (const GeneratedToken& t : tokens) {
    if (!HasToken(t)) continue;
    tripod::v1::TokenLogprob* lp = out->Add();
    lp->set_token(ToValidUtf8(TokenPiece(tokenizer, t.id)));
    lp->set_id(t.id);
    lp->set_logprob(t.logprob);
    for (size_t i = 0; i < TopCount(ctx, t); ++i) {
      tripod::v1::TopTokenLogprob* top = lp->add_top();
      top->set_token(ToValidUtf8(TokenPiece(tokenizer, t.top[i].id)));
      top->set_id(t.top[i].id);
      top->set_logprob(t.top[i].logprob);
    }
  }
}

void FillProtoUsage(const UsageCounts& u, tripod::v1::CompletionUsage* out) {
  out->set_prompt_tokens(u.prompt_tokens);
  out->set_completion_tokens(u.completion_tokens);
  out->set_total_tokens(u.prompt_tokens + u.completion_tokens);
  out->set_cached_tokens(u.cached_tokens);
}

void FillProtoTiming(const StageTimes& t, tripod::v1::StageTiming* out) {
  auto zero_if_absent = [](double v) { return v < 0 ? 0.0 : v; };
  out->set_queue_s(zero_if_absent(t.queue_s));
  out->set_draft_s(zero_if_absent(t.draft_s));
  out->set_prefill_s(zero_if_absent(t.prefill_s));
  out->set_transfer_s(zero_if_absent(t.transfer_s));
  out->set_first_token_s(zero_if_absent(t.first_token_s));
  out->set_decode_s(zero_if_absent(t.decode_s));
  out->set_total_s(zero_if_absent(t.total_s));
  out->set_route(t.route);
  if (!t.method.name.empty()) {
    v1::MethodOutcome* m = out->mutable_method();
    m->set_name(t.method.name);
    m->set_budget(t.method.budget);
    m->set_applied(t.method.applied);
    m->set_fallback(t.method.fallback);
    m->set_prompt_tokens(t.method.prompt_tokens);
    m->set_kv_entries(t.method.kv_entries);
    m->set_kv_bytes_saved(t.method.kv_bytes_saved);
  }
}

void FillProtoToolCalls(std::span<const ToolCall> calls, int first_index,
                        google::protobuf::RepeatedPtrField<tripod::v1::ToolCall>* out) {
  for (size_t i = 0; i < calls.size(); ++i) {
    tripod::v1::ToolCall* c = out->Add();
    c->set_id(calls[i].id);
    c->set_name(ToValidUtf8(calls[i].name));
    c->set_arguments(ToValidUtf8(calls[i].arguments));
    c->set_index(first_index + static_cast<int>(i));
  }
}

// The prompt's tokens with their log-probabilities (the first has none), when echo + logprobs
// or prompt_logprobs asked for them; the larger of the two alternative counts.
void FillProtoPromptLogprobs(
    const ResponseContext& ctx, const PromptEcho& echo, const Tokenizer& tokenizer,
    google::protobuf::RepeatedPtrField<tripod::v1::PromptTokenLogprob>* out) {
  if (!echo.echo_logprobs && echo.vllm_prompt_logprobs < 0) return;
  const int top = std::max(echo.echo_logprobs ? ctx.top_logprobs : 0, echo.vllm_prompt_logprobs);
  for (size_t i = 0; i < echo.ids.size(); ++i) {
    tripod::v1::PromptTokenLogprob* e = out->Add();
    e->set_token(ToValidUtf8(TokenPiece(tokenizer, echo.ids[i])));
    e->set_id(echo.ids[i]);
    if (i == 0 || i > echo.logprobs.size()) continue;
    const PromptLogprob& lp = echo.logprobs[i - 1];
    e->set_logprob(lp.logprob);
    e->set_rank(lp.rank);
    const size_t k = std::min(lp.top.size(), static_cast<size_t>(std::max(top, 0)));
    for (size_t j = 0; j < k; ++j) {
      tripod::v1::TopTokenLogprob* t = e->add_top();
      t->set_token(ToValidUtf8(TokenPiece(tokenizer, lp.top[j].id)));
      t->set_id(lp.top[j].id);
      t->set_logprob(lp.top[j].logprob);
    }
  }
}

// OpenAI's tool_calls list; in a stream each call carries its index (first_index and on; -1:
// none, a whole answer).
ojson ToolCallsJson(std::span<const ToolCall> calls, int first_index) {
  ojson out = ojson::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    ojson c;
    if (first_index >= 0) c["index"] = first_index + static_cast<int>(i);
    c["id"] = calls[i].id;
    c["type"] = "function";
    c["function"] = {{"name", calls[i].name}, {"arguments", calls[i].arguments}};
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace

double FiniteLogprob(float lp) { return std::isfinite(lp) ? static_cast<double>(lp) : -9999.0; }

int64_t CodePoints(std::string_view s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

std::string NewResponseId(ApiKind kind) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = kind == ApiKind::kChatCompletion ? "chatcmpl-" : "cmpl-";
  for (int half = 0; half < 2; ++half) {
    uint64_t bits = rng();
    for (int i = 0; i < 16; ++i, bits >>= 4) id.push_back(kHex[bits & 0xF]);
  }
  return id;
}

ResponseContext MakeResponseContext(const CompletionRequest& request, std::string model,
                                    int64_t created_unix_s) {
  ResponseContext ctx;
  ctx.kind = request.kind;
  ctx.id = NewResponseId(request.kind);
  ctx.model = std::move(model);
  ctx.created = created_unix_s;
  ctx.logprobs = request.logprobs;
  ctx.top_logprobs = request.sampling.top_logprobs;
  ctx.include_usage = request.include_usage;
  ctx.parse_tool_calls = request.ParsesToolCalls();
  ctx.max_tool_calls = request.parallel_tool_calls ? std::numeric_limits<int>::max() : 1;
  return ctx;
}

std::string TokenPiece(const Tokenizer& tokenizer, int32_t id) {
  const int32_t ids[1] = {id};
  std::string one = tokenizer.Decode(ids);
  if (tokenizer.kind() != TokenizerKind::kSentencePieceBpe) return one;
  // Decode drops the leading space of the text's first piece; behind a copy of itself the piece
  // keeps it, so the second copy is the piece as it appears mid-text.
  const int32_t twice[2] = {id, id};
  std::string two = tokenizer.Decode(twice);
  return two.substr(std::min(one.size(), two.size()));
}

ojson UsageJson(const UsageCounts& usage) {
  ojson u;
  u["prompt_tokens"] = usage.prompt_tokens;
  u["completion_tokens"] = usage.completion_tokens;
  u["total_tokens"] = usage.prompt_tokens + usage.completion_tokens;
  u["prompt_tokens_details"] = {{"cached_tokens", usage.cached_tokens}};
  return u;
}

ojson TimingJson(const StageTimes& t) {
  ojson j;
  j["queue_s"] = NullIfNegative(t.queue_s);
  j["draft_s"] = NullIfNegative(t.draft_s);
  j["prefill_s"] = NullIfNegative(t.prefill_s);
  j["transfer_s"] = NullIfNegative(t.transfer_s);
  j["first_token_s"] = NullIfNegative(t.first_token_s);
  j["decode_s"] = NullIfNegative(t.decode_s);
  j["total_s"] = NullIfNegative(t.total_s);
  j["route"] = t.route.empty() ? ojson() : ojson(t.route);
  if (t.method.name.empty()) {
    j["method"] = ojson();
  } else {
    const MethodReport& m = t.method;
    j["method"] = {{"name", m.name},
                   {"budget", m.budget},
                   {"applied", m.applied},
                   {"fallback", m.fallback.empty() ? ojson() : ojson(m.fallback)},
                   {"prompt_tokens", m.prompt_tokens},
                   {"kv_entries", m.kv_entries > 0 ? ojson(m.kv_entries) : ojson()},
                   {"kv_bytes_saved", m.kv_bytes_saved}};
  }
  return j;
}

std::string CompletionResponseBody(const ResponseContext& ctx,
                                   std::span<const GeneratedToken> tokens, const CompletionEnd& end,
                                   const Tokenizer& tokenizer, const PromptEcho* echo) {
  ChoiceOutput one;
  one.tokens.assign(tokens.begin(), tokens.end());
  one.finish_reason = end.finish_reason;
  return CompletionResponseBody(ctx, std::span<const ChoiceOutput>(&one, 1), end, tokenizer, echo);
}

std::string CompletionResponseBody(const ResponseContext& ctx,
                                   std::span<const ChoiceOutput> choices, const CompletionEnd& end,
                                   const Tokenizer& tokenizer, const PromptEcho* echo) {
  const bool chat = ctx.kind == ApiKind::kChatCompletion;
  ojson all = ojson::array();
  for (const ChoiceOutput& c : choices) {
    const std::span<const GeneratedToken> tokens = c.tokens;
    ojson choice;
    choice["index"] = c.index;
    std::string finish = c.finish_reason;
    if (chat && ctx.parse_tool_calls) {
      ParsedOutput parsed = ParseToolCallOutput(JoinText(tokens), ctx.max_tool_calls);
      choice["message"] = {{"role", "assistant"},
                           {"content", parsed.content ? ojson(*parsed.content) : ojson()}};
      if (!parsed.calls.empty()) {
        choice["message"]["tool_calls"] = ToolCallsJson(parsed.calls, /*first_index=*/-1);
      }
      finish = FinishReasonAfterCalls(finish, !parsed.calls.empty());
      choice["logprobs"] = ctx.logprobs ? ChatLogprobs(ctx, tokens, tokenizer) : ojson();
    } else if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", JoinText(tokens)}};
      choice["logprobs"] = ctx.logprobs ? ChatLogprobs(ctx, tokens, tokenizer) : ojson();
    } else {
      // Each choice gives the prompt back (vLLM's echo with n > 1).
      const bool echoed = echo != nullptr && echo->echo;
      choice["text"] = echoed ? echo->text + JoinText(tokens) : JoinText(tokens);
      int64_t offset = 0;
      if (!ctx.logprobs) {
        choice["logprobs"] = ojson();
      } else if (echoed) {
        ojson lps = EchoLogprobs(*echo, ctx.top_logprobs, tokenizer, &offset);
        AppendLogprobs(CompletionLogprobs(ctx, tokens, tokenizer, &offset), &lps);
        choice["logprobs"] = std::move(lps);
      } else {
        choice["logprobs"] = CompletionLogprobs(ctx, tokens, tokenizer, &offset);
      }
      if (echo != nullptr && echo->vllm_prompt_logprobs >= 0) {
        choice["prompt_logprobs"] = VllmPromptLogprobs(*echo, tokenizer);
      }
    }
    choice["finish_reason"] = finish.empty() ? ojson() : ojson(finish);
    all.push_back(std::move(choice));
  }
  ojson body;
  body["id"] = ctx.id;
  body["object"] = chat ? "chat.completion" : "text_completion";
  body["created"] = ctx.created;
  body["model"] = ctx.model;
  body["choices"] = std::move(all);
  // vLLM's chat answer carries them beside the choices.
  if (chat && echo != nullptr && echo->vllm_prompt_logprobs >= 0) {
    body["prompt_logprobs"] = VllmPromptLogprobs(*echo, tokenizer);
  }
  body["usage"] = UsageJson(end.usage);
  body["tripod"] = TimingJson(end.times);
  return DumpJson(body);
}

SseStream::SseStream(ResponseContext ctx, const Tokenizer& tokenizer)
    : ctx_(std::move(ctx)), tokenizer_(&tokenizer) {
  if (ctx_.kind == ApiKind::kChatCompletion && ctx_.parse_tool_calls) {
    tool_calls_.emplace(ctx_.max_tool_calls);
  }
}

ojson SseStream::ChunkHeader() const {
  ojson c;
  c["id"] = ctx_.id;
  c["object"] = ctx_.kind == ApiKind::kChatCompletion ? "chat.completion.chunk" : "text_completion";
  c["created"] = ctx_.created;
  c["model"] = ctx_.model;
  return c;
}

std::string SseStream::Start(int n) {
  if (ctx_.kind != ApiKind::kChatCompletion) return "";
  std::string out;
  for (int i = 0; i < n; ++i) {
    ojson choice;
    choice["index"] = i;
    choice["delta"] = {{"role", "assistant"}, {"content", ""}};
    choice["logprobs"] = nullptr;
    choice["finish_reason"] = nullptr;
    ojson c = ChunkHeader();
    c["choices"] = ojson::array({std::move(choice)});
    if (ctx_.include_usage) c["usage"] = nullptr;
    out += SseEvent(c);
  }
  return out;
}

int64_t& SseStream::TextOffset(int index) {
  if (text_offsets_.size() <= static_cast<size_t>(index)) text_offsets_.resize(index + 1, 0);
  return text_offsets_[index];
}

std::string SseStream::Prompt(const PromptEcho& echo, int n) {
  if (!echo.any()) return "";
  std::string out;
  for (int i = 0; i < n; ++i) out += PromptChunk(echo, i);
  return out;
}

std::string SseStream::PromptChunk(const PromptEcho& echo, int index) {
  // Chat gives no prompt text back; its prompt_logprobs go once, beside the choices.
  if (ctx_.kind == ApiKind::kChatCompletion && index > 0) return "";
  int64_t& text_offset = TextOffset(index);
  ojson choice;
  choice["index"] = index;
  ojson c = ChunkHeader();
  if (ctx_.kind == ApiKind::kChatCompletion) {
    choice["delta"] = ojson::object();
    choice["logprobs"] = nullptr;
  } else {
    choice["text"] = echo.echo ? echo.text : "";
    if (echo.echo_logprobs) {
      choice["logprobs"] = EchoLogprobs(echo, ctx_.top_logprobs, *tokenizer_, &text_offset);
    } else {
      choice["logprobs"] = nullptr;
      text_offset += echo.echo ? CodePoints(echo.text) : 0;
    }
    if (echo.vllm_prompt_logprobs >= 0) {
      choice["prompt_logprobs"] = VllmPromptLogprobs(echo, *tokenizer_);
    }
  }
  choice["finish_reason"] = nullptr;
  c["choices"] = ojson::array({std::move(choice)});
  if (ctx_.kind == ApiKind::kChatCompletion && echo.vllm_prompt_logprobs >= 0) {
    c["prompt_logprobs"] = VllmPromptLogprobs(echo, *tokenizer_);
  }
  if (ctx_.include_usage) c["usage"] = nullptr;
  return SseEvent(c);
}

std::string SseStream::ToolCallChunk(const ChoiceToolCallStreams::Piece& piece,
                                     std::span<const GeneratedToken> tokens, int index) {
  const bool any_token = std::any_of(tokens.begin(), tokens.end(), HasToken);
  if (piece.content.empty() && piece.calls.empty() && !(ctx_.logprobs && any_token)) return "";
  ojson delta = ojson::object();
  if (!piece.content.empty()) delta["content"] = piece.content;
  if (!piece.calls.empty()) delta["tool_calls"] = ToolCallsJson(piece.calls, piece.first_index);
  ojson choice;
  choice["index"] = index;
  choice["delta"] = std::move(delta);
  choice["logprobs"] = ctx_.logprobs ? ChatLogprobs(ctx_, tokens, *tokenizer_) : ojson();
  choice["finish_reason"] = nullptr;
  ojson c = ChunkHeader();
  c["choices"] = ojson::array({std::move(choice)});
  if (ctx_.include_usage) c["usage"] = nullptr;
  return SseEvent(c);
}

std::string SseStream::Tokens(std::span<const GeneratedToken> tokens, int index) {
  const std::string text = JoinText(tokens);
  if (tool_calls_.has_value()) return ToolCallChunk(tool_calls_->Feed(index, text), tokens, index);
  const bool any_token = std::any_of(tokens.begin(), tokens.end(), HasToken);
  if (text.empty() && !(ctx_.logprobs && any_token)) return "";
  int64_t& text_offset = TextOffset(index);
  ojson choice;
  choice["index"] = index;
  if (ctx_.kind == ApiKind::kChatCompletion) {
    choice["delta"] = {{"content", text}};
    choice["logprobs"] = ctx_.logprobs ? ChatLogprobs(ctx_, tokens, *tokenizer_) : ojson();
  } else {
    choice["text"] = text;
    if (ctx_.logprobs) {
      choice["logprobs"] = CompletionLogprobs(ctx_, tokens, *tokenizer_, &text_offset);
    } else {
      choice["logprobs"] = nullptr;
      text_offset += CodePoints(text);
    }
  }
  choice["finish_reason"] = nullptr;
  ojson c = ChunkHeader();
  c["choices"] = ojson::array({std::move(choice)});
  if (ctx_.include_usage) c["usage"] = nullptr;
  return SseEvent(c);
}

ojson SseStream::FinishChunk(int index, const std::string& finish_reason) const {
  ojson choice;
  choice["index"] = index;
  if (ctx_.kind == ApiKind::kChatCompletion) {
    choice["delta"] = ojson::object();
  } else {
    choice["text"] = "";
  }
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = finish_reason.empty() ? ojson() : ojson(finish_reason);
  ojson c = ChunkHeader();
  c["choices"] = ojson::array({std::move(choice)});
  if (ctx_.include_usage) c["usage"] = nullptr;
  return c;
}

std::string SseStream::FlushToolCalls(int index, std::string* finish_reason) {
  if (!tool_calls_.has_value()) return "";
  return ToolCallChunk(tool_calls_->Finish(index, finish_reason), {}, index);
}

std::string SseStream::FinishChoice(int index, const std::string& finish_reason) {
  std::string finish = finish_reason;
  std::string out = FlushToolCalls(index, &finish);
  return out + SseEvent(FinishChunk(index, finish));
}

std::string SseStream::Finish(const CompletionEnd& end, int index) {
  std::string finish = end.finish_reason;
  std::string out = FlushToolCalls(index, &finish);
  ojson c = FinishChunk(index, finish);
  c["tripod"] = TimingJson(end.times);
  out += SseEvent(c);
  if (ctx_.include_usage) {
    ojson u = ChunkHeader();
    u["choices"] = ojson::array();
    u["usage"] = UsageJson(end.usage);
    u["tripod"] = TimingJson(end.times);
    out += SseEvent(u);
  }
  out += kSseDone;
  return out;
}

std::string SseEvent(const ojson& payload) {
  return absl::StrCat("data: ", DumpJson(payload), "\n\n");
}

std::string SseErrorEvent(const ApiError& error) { return SseEvent(ErrorJson(error)); }

std::string ModelsListBody(std::span<const ModelCard> models) {
  ojson data = ojson::array();
  for (const ModelCard& m : models) {
    ojson card;
    card["id"] = m.id;
    card["object"] = "model";
    card["created"] = m.created;
    card["owned_by"] = "tripod";
    card["root"] = m.id;
    card["parent"] = nullptr;
    card["max_model_len"] = m.max_model_len;
    data.push_back(std::move(card));
  }
  ojson body;
  body["object"] = "list";
  body["data"] = std::move(data);
  return DumpJson(body);
}

void FillCompletionChunk(const ResponseContext& ctx, std::span<const GeneratedToken> tokens,
                         const Tokenizer& tokenizer, tripod::v1::CompletionChunk* out) {
  out->set_id(ctx.id);
  out->set_text(ToValidUtf8(JoinText(tokens)));
  FillProtoLogprobs(ctx, tokens, tokenizer, out->mutable_logprobs());
}

void FillFinalChunk(const ResponseContext& ctx, const CompletionEnd& end,
                    tripod::v1::CompletionChunk* out) {
  out->set_id(ctx.id);
  out->set_finish_reason(end.finish_reason);
  FillProtoUsage(end.usage, out->mutable_usage());
  FillProtoTiming(end.times, out->mutable_timing());
}

void FillCompletionResponse(const ResponseContext& ctx, std::span<const GeneratedToken> tokens,
                            const CompletionEnd& end, const Tokenizer& tokenizer,
                            tripod::v1::CompletionResponse* out) {
  ChoiceOutput one;
  one.tokens.assign(tokens.begin(), tokens.end());
  one.finish_reason = end.finish_reason;
  FillCompletionResponse(ctx, std::span<const ChoiceOutput>(&one, 1), end, tokenizer, nullptr, out);
}

void FillCompletionResponse(const ResponseContext& ctx, std::span<const ChoiceOutput> choices,
                            const CompletionEnd& end, const Tokenizer& tokenizer,
                            const PromptEcho* echo, tripod::v1::CompletionResponse* out) {
  const bool chat = ctx.kind == ApiKind::kChatCompletion;
  out->set_id(ctx.id);
  out->set_model(ctx.model);
  out->set_created(ctx.created);
  for (const ChoiceOutput& c : choices) {
    tripod::v1::Choice* choice = out->add_choices();
    choice->set_index(c.index);
    std::string text = JoinText(c.tokens);
    std::string finish = c.finish_reason;
    if (chat && ctx.parse_tool_calls) {
      ParsedOutput parsed = ParseToolCallOutput(text, ctx.max_tool_calls);
      text = parsed.content.value_or("");
      FillProtoToolCalls(parsed.calls, /*first_index=*/0, choice->mutable_tool_calls());
      finish = FinishReasonAfterCalls(finish, !parsed.calls.empty());
    } else if (echo != nullptr && echo->echo) {
      text = echo->text + text;  // each choice gives the prompt back, as over HTTP
    }
    choice->set_text(ToValidUtf8(text));
    for (const GeneratedToken& t : c.tokens) {
      if (HasToken(t)) choice->add_token_ids(t.id);
    }
    FillProtoLogprobs(ctx, c.tokens, tokenizer, choice->mutable_logprobs());
    choice->set_finish_reason(finish);
  }
  if (!choices.empty()) {
    const tripod::v1::Choice& first = out->choices(0);
    out->set_text(first.text());
    *out->mutable_token_ids() = first.token_ids();
    *out->mutable_logprobs() = first.logprobs();
    out->set_finish_reason(first.finish_reason());
  }
  if (echo != nullptr)
    FillProtoPromptLogprobs(ctx, *echo, tokenizer, out->mutable_prompt_logprobs());
  FillProtoUsage(end.usage, out->mutable_usage());
  FillProtoTiming(end.times, out->mutable_timing());
}

GrpcChunkStream::GrpcChunkStream(ResponseContext ctx, const Tokenizer& tokenizer)
    : ctx_(std::move(ctx)), tokenizer_(&tokenizer) {
  if (ctx_.kind == ApiKind::kChatCompletion && ctx_.parse_tool_calls) {
    tool_calls_.emplace(ctx_.max_tool_calls);
  }
}

std::vector<tripod::v1::CompletionChunk> GrpcChunkStream::Prompt(const PromptEcho& echo, int n) {
  std::vector<tripod::v1::CompletionChunk> out;
  if (!echo.any()) return out;
  // Chat gives no prompt text back: its log-probabilities go once, on choice 0's chunk.
  const int chunks = ctx_.kind == ApiKind::kChatCompletion ? 1 : n;
  for (int i = 0; i < chunks; ++i) {
    tripod::v1::CompletionChunk& c = out.emplace_back();
    c.set_id(ctx_.id);
    c.set_index(i);
    if (echo.echo) c.set_text(ToValidUtf8(echo.text));
    if (i == 0) FillProtoPromptLogprobs(ctx_, echo, *tokenizer_, c.mutable_prompt_logprobs());
  }
  return out;
}

bool GrpcChunkStream::Tokens(std::span<const GeneratedToken> tokens, int index,
                             tripod::v1::CompletionChunk* out) {
  out->set_index(index);
  if (!tool_calls_.has_value()) {
    FillCompletionChunk(ctx_, tokens, *tokenizer_, out);
    return true;
  }
  const ChoiceToolCallStreams::Piece piece = tool_calls_->Feed(index, JoinText(tokens));
  const bool any_token = std::any_of(tokens.begin(), tokens.end(), HasToken);
  if (piece.content.empty() && piece.calls.empty() && !(ctx_.logprobs && any_token)) return false;
  out->set_id(ctx_.id);
  out->set_text(ToValidUtf8(piece.content));
  FillProtoToolCalls(piece.calls, piece.first_index, out->mutable_tool_calls());
  FillProtoLogprobs(ctx_, tokens, *tokenizer_, out->mutable_logprobs());
  return true;
}

tripod::v1::CompletionChunk GrpcChunkStream::FinishChoice(int index,
                                                          const std::string& finish_reason) {
  tripod::v1::CompletionChunk c;
  c.set_id(ctx_.id);
  c.set_index(index);
  std::string finish = finish_reason;
  if (tool_calls_.has_value()) {
    // What the choice still held goes with its end.
    const ChoiceToolCallStreams::Piece piece = tool_calls_->Finish(index, &finish);
    c.set_text(ToValidUtf8(piece.content));
    FillProtoToolCalls(piece.calls, piece.first_index, c.mutable_tool_calls());
  }
  c.set_finish_reason(finish);
  return c;
}

tripod::v1::CompletionChunk GrpcChunkStream::Finish(const CompletionEnd& end, int index) {
  tripod::v1::CompletionChunk c = FinishChoice(index, end.finish_reason);
  FillProtoUsage(end.usage, c.mutable_usage());
  FillProtoTiming(end.times, c.mutable_timing());
  return c;
}

void MergeChunk(const tripod::v1::CompletionChunk& next, tripod::v1::CompletionChunk* into) {
  into->mutable_text()->append(next.text());
  into->mutable_logprobs()->MergeFrom(next.logprobs());
  into->mutable_tool_calls()->MergeFrom(next.tool_calls());
}

grpc::StatusCode GrpcCodeForHttpStatus(int http_status) {
  switch (http_status) {
    case 200:
      return grpc::StatusCode::OK;
    case 400:
      return grpc::StatusCode::INVALID_ARGUMENT;
    case 401:
      return grpc::StatusCode::UNAUTHENTICATED;
    case 403:
      return grpc::StatusCode::PERMISSION_DENIED;
    case 404:
      return grpc::StatusCode::NOT_FOUND;
    case 413:
      return grpc::StatusCode::OUT_OF_RANGE;
    case 429:
      return grpc::StatusCode::RESOURCE_EXHAUSTED;
    case 499:
      return grpc::StatusCode::CANCELLED;
    case 503:
      return grpc::StatusCode::UNAVAILABLE;
    case 504:
      return grpc::StatusCode::DEADLINE_EXCEEDED;
    default:
      return http_status >= 400 && http_status < 500 ? grpc::StatusCode::INVALID_ARGUMENT
                                                     : grpc::StatusCode::INTERNAL;
  }
}

int HttpStatusForGrpcCode(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return 200;
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::FAILED_PRECONDITION:
      return 400;
    case grpc::StatusCode::UNAUTHENTICATED:
      return 401;
    case grpc::StatusCode::PERMISSION_DENIED:
      return 403;
    case grpc::StatusCode::NOT_FOUND:
      return 404;
    case grpc::StatusCode::OUT_OF_RANGE:
      return 413;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return 429;
    case grpc::StatusCode::CANCELLED:
      return 499;
    case grpc::StatusCode::UNAVAILABLE:
      return 503;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return 504;
    default:
      return 500;
  }
}

std::string DefaultErrorType(int http_status) {
  switch (http_status) {
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 429:
      return "rate_limit_error";
    default:
      return http_status >= 500 ? "server_error" : "invalid_request_error";
  }
}

grpc::Status ToGrpcStatus(const ApiError& error) {
  return grpc::Status(GrpcCodeForHttpStatus(error.http_status), ErrorBody(error));
}

ApiError FromGrpcStatus(const grpc::Status& status) {
  ApiError e;
  e.http_status = HttpStatusForGrpcCode(status.error_code());
  e.type = DefaultErrorType(e.http_status);
  e.message = status.error_message();
  const nlohmann::json j =
      nlohmann::json::parse(status.error_message(), nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("error") && j["error"].is_object()) {
    const nlohmann::json& err = j["error"];
    auto str = [&](const char* key, std::string* out) {
      auto it = err.find(key);
      if (it != err.end() && it->is_string()) *out = it->get<std::string>();
    };
    str("message", &e.message);
    str("type", &e.type);
    str("param", &e.param);
    str("code", &e.code);
  }
  return e;
}

}  // namespace tripod::scheduler
