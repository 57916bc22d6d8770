#include "scheduler/http_api.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "boost/asio/post.hpp"
#include "boost/asio/thread_pool.hpp"
#include "nlohmann/json.hpp"
#include "scheduler/choices.h"
#include "scheduler/openai_json.h"
#include "scheduler/openai_request.h"
#include "scheduler/openai_response.h"
#include "scheduler/openai_tokens.h"
#include "scheduler/prompt_echo.h"
#include "scheduler/request_preparation.h"
#include "scheduler/request_status.h"

namespace tripod::scheduler {
namespace {

using http::HttpExchange;
using http::HttpResponse;

HttpResponse ErrorResponse(const ApiError& e, int retry_after_s = 0) {
  HttpResponse r;
  r.status = e.http_status;
  r.body = ErrorBody(e);
  if (e.http_status == 429 || (e.http_status == 503 && retry_after_s > 0)) {
    r.headers.emplace_back("Retry-After", absl::StrCat(std::max(1, retry_after_s)));
  }
  if (e.http_status == 401) r.headers.emplace_back("WWW-Authenticate", "Bearer");
  return r;
}

void RespondError(HttpExchange& ex, const ApiError& e, int retry_after_s = 0) {
  ex.Respond(ErrorResponse(e, retry_after_s));
}

HttpResponse JsonResponse(std::string body) {
  HttpResponse r;
  r.body = std::move(body);
  return r;
}

// One completion's answer in progress. The dispatcher's callbacks for a request come one at a
// time, from gRPC's threads (or the handler's own, for a request that ends at once).
struct Answer {
  std::shared_ptr<HttpExchange> exchange;
  ResponseContext context;
  const Tokenizer* tokenizer = nullptr;
  bool stream = false;
  int n = 1;  // choices returned (of request.best_of candidates, choices.h)
  std::unique_ptr<SseStream> sse;
  Mutex mu;
  bool headers_sent ABSL_GUARDED_BY(mu) = false;
  // Not streamed: the whole answer, by candidate.
  std::optional<Candidates> candidates ABSL_GUARDED_BY(mu);
  int choices_ended ABSL_GUARDED_BY(mu) = 0;  // streamed with n > 1
  int last_choice ABSL_GUARDED_BY(mu) = 0;    // the choice whose end Finish sends
  PromptEcho echo ABSL_GUARDED_BY(mu);        // what the answer gives back of its prompt
  bool echo_sent ABSL_GUARDED_BY(mu) = false;

  // Streams: the headers and the role chunk go with the first piece, then the echoed prompt.
  void SendPiece(std::string piece) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (!headers_sent) {
      headers_sent = true;
      exchange->StartStream();
      exchange->Send(sse->Start(n));
    }
    if (!echo_sent) {
      echo_sent = true;
      exchange->Send(sse->Prompt(echo, n));
    }
    exchange->Send(std::move(piece));
  }

  void OnPromptLogprobs(std::span<const PromptLogprob> lps) {
    MutexLock l(&mu);
    echo.logprobs.insert(echo.logprobs.end(), lps.begin(), lps.end());
  }

  void OnToken(const GeneratedToken& t) {
    MutexLock l(&mu);
    if (!stream) return candidates->AddToken(t);
    const GeneratedToken one[] = {t};
    std::string piece = sse->Tokens(one, t.choice);
    if (!piece.empty()) SendPiece(std::move(piece));
  }

  // n > 1: a choice ended. Streamed, its finish chunk goes out now, but the last one's waits
  // for OnEnd, which sends it with the timing.
  void OnChoiceEnd(int choice, const std::string& finish_reason) {
    MutexLock l(&mu);
    if (!stream) return candidates->EndChoice(choice, finish_reason);
    if (++choices_ended < n) {
      SendPiece(sse->FinishChoice(choice, finish_reason));
    } else {
      last_choice = choice;
    }
  }

  void OnEnd(const CompletionEnd& end) {
    MutexLock l(&mu);
    if (!stream) {
      const std::vector<ChoiceOutput> best = std::move(*candidates).Best(end, n);
      exchange->Respond(
          JsonResponse(CompletionResponseBody(context, best, end, *tokenizer, &echo)));
      return;
    }
    SendPiece(sse->Finish(end, last_choice));
    exchange->End();
  }

  void OnError(const ApiError& e) {
    MutexLock l(&mu);
    if (!stream || !headers_sent) {
      RespondError(*exchange, e);
      return;
    }
    exchange->Send(SseErrorEvent(e));
    exchange->End();
  }
};

}  // namespace

struct HttpApi::WorkThreads {
  explicit WorkThreads(int n) : pool(static_cast<size_t>(std::max(1, n))) {}
  boost::asio::thread_pool pool;
};

HttpApi::HttpApi(HttpApiConfig config)
    : config_(config),
      admission_(config.admission),
      work_(std::make_unique<WorkThreads>(config.work_threads)) {}

HttpApi::~HttpApi() { work_->pool.join(); }

void HttpApi::OffIo(std::shared_ptr<HttpExchange> ex,
                    void (HttpApi::*fn)(std::shared_ptr<HttpExchange>)) {
  AdmissionRefusal refusal{};
  std::optional<AdmissionTicket> ticket = Admit(admission_, ex->request().body.size(), &refusal);
  if (!ticket.has_value()) {
    const bool requests = refusal == AdmissionRefusal::kRequests;
    RespondError(*ex,
                 ApiError{429,
                          absl::StrCat("the server is busy: ",
                                       requests ? "too many requests" : "too many request bytes",
                                       " are waiting to be processed; retry later"),
                          "rate_limit_error", "", "server_busy"},
                 config_.retry_after_s);
    return;
  }
  // The ticket lives as long as the task and so holds the body's share until the task has run
  // (or the pool drops it), whatever the task does.
  boost::asio::post(work_->pool,
                    [this, ex = std::move(ex), fn, ticket = std::move(ticket)]() mutable {
                      // A client that hung up while its request waited here: nothing to answer.
                      if (!ex->closed()) (this->*fn)(std::move(ex));
                    });
}

std::string HttpApi::HealthBody(bool* ready, bool detail) const {
  nlohmann::ordered_json j;
  int decode_ok = 0, prefill_ok = 0, draft_ok = 0;
  nlohmann::ordered_json workers = nlohmann::ordered_json::array();
  for (const auto& w : config_.dispatcher->registry().All()) {
    const v1::HealthResponse h = w->last_health();
    nlohmann::ordered_json wj;
    wj["address"] = w->address();
    wj["role"] = w->role() == v1::ROLE_PREFILL ? "prefill"
                 : w->role() == v1::ROLE_DRAFT ? "draft"
                                               : "decode";
    wj["healthy"] = w->healthy();
    if (!w->healthy()) wj["error"] = w->last_error();
    wj["running"] = h.running();
    wj["queued"] = h.queued();
    if (w->role() == v1::ROLE_DECODE) {
      wj["free_kv_blocks"] = h.free_kv_blocks();
      wj["total_kv_blocks"] = h.total_kv_blocks();
    }
    wj["inflight"] = w->inflight();
    workers.push_back(std::move(wj));
    if (w->healthy()) {
      (w->role() == v1::ROLE_DECODE  ? decode_ok
       : w->role() == v1::ROLE_DRAFT ? draft_ok
                                     : prefill_ok)++;
    }
  }
  const bool draining = config_.dispatcher->draining();
  *ready = decode_ok > 0 && !draining;
  j["status"] = draining ? "draining" : (*ready ? "ok" : "no_decode_worker");
  if (!detail) return DumpJson(j);
  j["model"] = config_.model->name;
  j["running"] = config_.dispatcher->running();
  j["waiting"] = config_.dispatcher->waiting();
  j["healthy_prefill_workers"] = prefill_ok;
  j["healthy_decode_workers"] = decode_ok;
  j["healthy_draft_workers"] = draft_ok;
  j["workers"] = std::move(workers);
  return DumpJson(j);
}

void HttpApi::Handle(std::shared_ptr<HttpExchange> ex) {
  const http::HttpRequest& req = ex->request();
  const std::string& path = req.path;
  struct Route {
    const char* path;
    const char* method;
  };
  static constexpr Route kRoutes[] = {
      {"/health", "GET"},
      {"/metrics", "GET"},
      {"/v1/models", "GET"},
      {"/v1/completions", "POST"},
      {"/v1/chat/completions", "POST"},
      {"/tokenize", "POST"},
      {"/detokenize", "POST"},
      {"/tokenizer_info", "GET"},
  };
  const Route* route = nullptr;
  for (const Route& r : kRoutes) {
    if (path == r.path) route = &r;
  }
  if (route == nullptr) {
    RespondError(*ex, ApiError{404, absl::StrCat("no such endpoint: ", req.method, " ", path),
                               "invalid_request_error", "", "not_found"});
    return;
  }
  if (req.method != route->method) {
    HttpResponse r = ErrorResponse(ApiError{
        405,
        absl::StrCat("method ", req.method, " is not allowed on ", path, "; use ", route->method),
        "invalid_request_error", "", "method_not_allowed"});
    r.headers.emplace_back("Allow", route->method);
    ex->Respond(std::move(r));
    return;
  }
  if (path == "/health") {
    // Probes get the status without a key; worker addresses and errors need one (when keys
    // are configured at all).
    const bool detail = !config_.keys->Check(req.Header("authorization")).has_value();
    bool ready = false;
    HttpResponse r = JsonResponse(HealthBody(&ready, detail));
    r.status = ready ? 200 : 503;
    ex->Respond(std::move(r));
    return;
  }
  if (path == "/metrics") {
    HttpResponse r;
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    r.body = config_.registry->Exposition();
    ex->Respond(std::move(r));
    return;
  }
  if (std::optional<ApiError> denied = config_.keys->Check(req.Header("authorization"))) {
    RespondError(*ex, *denied);
    return;
  }
  if (path == "/v1/models") {
    const ModelCard card{config_.model->name, config_.model->created,
                         static_cast<int>(config_.model->max_model_len)};
    ex->Respond(JsonResponse(ModelsListBody({&card, 1})));
  } else if (path == "/v1/completions") {
    OffIo(std::move(ex), &HttpApi::TextCompletion);
  } else if (path == "/v1/chat/completions") {
    OffIo(std::move(ex), &HttpApi::ChatCompletion);
  } else if (path == "/tokenize") {
    OffIo(std::move(ex), &HttpApi::Tokenize);
  } else if (path == "/detokenize") {
    OffIo(std::move(ex), &HttpApi::Detokenize);
  } else if (path == "/tokenizer_info") {
    ex->Respond(
        JsonResponse(TokenizerInfoBody(*config_.model->tokenizer, config_.model->max_model_len)));
  }
}

void HttpApi::TextCompletion(std::shared_ptr<HttpExchange> ex) {
  const int64_t received = ex->received_unix_s();
  Completion(std::move(ex), ApiKind::kCompletion, received);
}

void HttpApi::ChatCompletion(std::shared_ptr<HttpExchange> ex) {
  const int64_t received = ex->received_unix_s();
  Completion(std::move(ex), ApiKind::kChatCompletion, received);
}

void HttpApi::Completion(std::shared_ptr<HttpExchange> ex, ApiKind kind, int64_t received_unix_s) {
  ApiResult<CompletionRequest> parsed = ParseCompletionBody(ex->request().body, kind);
  if (const ApiError* e = std::get_if<ApiError>(&parsed)) return RespondError(*ex, *e);
  const CompletionRequest& request = std::get<CompletionRequest>(parsed);
  if (std::optional<ApiError> e = CheckChoiceLimit(request, config_.dispatcher->options().max_n)) {
    return RespondError(*ex, *e);
  }
  ApiResult<PreparedRequest> prepared = PrepareRequest(request, *config_.model);
  if (const ApiError* e = std::get_if<ApiError>(&prepared)) return RespondError(*ex, *e);

  auto answer = std::make_shared<Answer>();
  {
    MutexLock l(&answer->mu);
    answer->echo = MakePromptEcho(request, std::get<PreparedRequest>(prepared).prompt,
                                  *config_.model->tokenizer);
  }
  answer->exchange = ex;
  answer->context = MakeResponseContext(request, config_.model->name, received_unix_s);
  answer->tokenizer = config_.model->tokenizer.get();
  answer->stream = request.stream;
  answer->n = request.n;
  {
    MutexLock l(&answer->mu);
    answer->candidates.emplace(request.best_of);
  }
  if (request.stream)
    answer->sse = std::make_unique<SseStream>(answer->context, *answer->tokenizer);

  RequestCallbacks callbacks;
  callbacks.on_prompt_logprobs = [answer](std::span<const PromptLogprob> lps) {
    answer->OnPromptLogprobs(lps);
  };
  callbacks.on_token = [answer](const GeneratedToken& t) { answer->OnToken(t); };
  callbacks.on_end = [answer](const CompletionEnd& e) { answer->OnEnd(e); };
  if (request.best_of > 1) {
    callbacks.on_choice_end = [answer](int choice, const std::string& finish) {
      answer->OnChoiceEnd(choice, finish);
    };
  }
  callbacks.on_error = [answer](const absl::Status& e) { answer->OnError(ToApiError(e)); };
  absl::Status refused;
  std::shared_ptr<RequestHandle> handle = config_.dispatcher->Submit(
      std::get<PreparedRequest>(std::move(prepared)), std::move(callbacks), &refused);
  if (handle == nullptr) {
    return RespondError(*ex, ToApiError(refused), config_.dispatcher->options().retry_after_s);
  }
  // A client that hangs up (before or during the answer) cancels the request everywhere.
  ex->OnClose([handle] { handle->Cancel(); });
}

void HttpApi::Tokenize(std::shared_ptr<HttpExchange> ex) {
  ApiResult<TokenizeRequest> parsed = ParseTokenizeBody(ex->request().body);
  if (const ApiError* e = std::get_if<ApiError>(&parsed)) return RespondError(*ex, *e);
  const TokenizeRequest& r = std::get<TokenizeRequest>(parsed);
  if (std::optional<ApiError> e = CheckModelName(r.model, *config_.model)) {
    return RespondError(*ex, *e);
  }
  if (r.is_chat && !config_.model->chat_template.has_value()) {
    return RespondError(*ex, InvalidRequest(config_.model->chat_template_error, "messages"));
  }
  ApiResult<std::vector<int32_t>> ids = scheduler::Tokenize(
      r, *config_.model->tokenizer, config_.model->chat_template.value_or(ChatTemplate{}));
  if (const ApiError* e = std::get_if<ApiError>(&ids)) return RespondError(*ex, *e);
  ex->Respond(JsonResponse(
      TokenizeResponseBody(std::get<std::vector<int32_t>>(ids), config_.model->max_model_len)));
}

void HttpApi::Detokenize(std::shared_ptr<HttpExchange> ex) {
  ApiResult<DetokenizeRequest> parsed =
      ParseDetokenizeBody(ex->request().body, config_.model->tokenizer->vocab_size());
  if (const ApiError* e = std::get_if<ApiError>(&parsed)) return RespondError(*ex, *e);
  const DetokenizeRequest& r = std::get<DetokenizeRequest>(parsed);
  if (std::optional<ApiError> e = CheckModelName(r.model, *config_.model)) {
    return RespondError(*ex, *e);
  }
  ex->Respond(JsonResponse(DetokenizeResponseBody(r, *config_.model->tokenizer)));
}

}  // namespace tripod::scheduler
