#include "scheduler/completion_service.h"

#include <ctime>
#include <memory>
#include <optional>
#include <vector>

#include "common/rpc/server_stream_writer.h"
#include "common/util/mutex.h"
#include "scheduler/choices.h"
#include "scheduler/openai_request.h"
#include "scheduler/openai_response.h"
#include "scheduler/prompt_echo.h"
#include "scheduler/request_preparation.h"
#include "scheduler/request_status.h"

namespace tripod::scheduler {
namespace {

// The call's checks before anything runs: the API key, parsing (Generate: `stream`), the
// choices' limit, the model; as HTTP's.
ApiResult<PreparedRequest> Admit(grpc::CallbackServerContext* context,
                                 const v1::CompletionRequest& proto, bool stream,
                                 const ApiKeys& keys, const ServedModel& model, int max_n,
                                 CompletionRequest* parsed_out) {
  if (keys.enabled()) {
    const auto& md = context->client_metadata();
    auto it = md.find("authorization");
    std::optional<std::string> value;
    if (it != md.end()) value.emplace(it->second.data(), it->second.size());
    if (std::optional<ApiError> e = keys.Check(value ? &*value : nullptr)) return *e;
  }
  ApiResult<CompletionRequest> parsed = CompletionRequestFromProto(proto, stream);
  if (const ApiError* e = std::get_if<ApiError>(&parsed)) return *e;
  *parsed_out = std::get<CompletionRequest>(std::move(parsed));
  if (std::optional<ApiError> e = CheckChoiceLimit(*parsed_out, max_n)) return *e;
  return PrepareRequest(*parsed_out, model);
}

// State shared by Complete's reactor and the dispatcher's callbacks: the reactor goes away in
// OnDone, possibly while a callback runs, so callbacks reach it only through here, under the lock.
template <typename Reactor>
struct Shared {
  Mutex mu;
  Reactor* reactor ABSL_GUARDED_BY(mu) = nullptr;
  std::shared_ptr<RequestHandle> handle ABSL_GUARDED_BY(mu);
  bool cancelled ABSL_GUARDED_BY(mu) = false;
};

class CompleteReactor : public grpc::ServerUnaryReactor {
 public:
  CompleteReactor(const ServedModel& model, v1::CompletionResponse* response)
      : model_(model), response_(response), shared_(std::make_shared<Shared<CompleteReactor>>()) {
    MutexLock l(&shared_->mu);
    shared_->reactor = this;
  }

  void Run(grpc::CallbackServerContext* context, const v1::CompletionRequest& proto,
           const ApiKeys& keys, int max_n, Dispatcher& dispatcher) {
    const int64_t received_unix_s = static_cast<int64_t>(std::time(nullptr));
    CompletionRequest parsed;
    ApiResult<PreparedRequest> prepared =
        Admit(context, proto, /*stream=*/false, keys, model_, max_n, &parsed);
    if (const ApiError* e = std::get_if<ApiError>(&prepared)) return FinishLocked(ToGrpcStatus(*e));
    ctx_ = MakeResponseContext(parsed, model_.name, received_unix_s);
    n_ = parsed.n;
    candidates_.emplace(parsed.best_of);
    echo_ = MakePromptEcho(parsed, std::get<PreparedRequest>(prepared).prompt, *model_.tokenizer);
    auto shared = shared_;
    RequestCallbacks cb;
    cb.on_prompt_logprobs = [shared](std::span<const PromptLogprob> lps) {
      MutexLock l(&shared->mu);
      if (CompleteReactor* r = shared->reactor) {
        r->echo_.logprobs.insert(r->echo_.logprobs.end(), lps.begin(), lps.end());
      }
    };
    cb.on_token = [shared](const GeneratedToken& t) {
      MutexLock l(&shared->mu);
      if (shared->reactor != nullptr) shared->reactor->candidates_->AddToken(t);
    };
    if (parsed.best_of > 1) {
      cb.on_choice_end = [shared](int choice, const std::string& finish) {
        MutexLock l(&shared->mu);
        if (shared->reactor != nullptr) shared->reactor->candidates_->EndChoice(choice, finish);
      };
    }
    cb.on_end = [shared](const CompletionEnd& end) {
      MutexLock l(&shared->mu);
      CompleteReactor* r = shared->reactor;
      if (r != nullptr && !r->finished_) {
        const std::vector<ChoiceOutput> best = std::move(*r->candidates_).Best(end, r->n_);
        FillCompletionResponse(r->ctx_, best, end, *r->model_.tokenizer, &r->echo_, r->response_);
        r->FinishOnce(grpc::Status::OK);
      }
    };
    cb.on_error = [shared](const absl::Status& e) {
      MutexLock l(&shared->mu);
      if (shared->reactor != nullptr) shared->reactor->FinishOnce(ToGrpcStatus(ToApiError(e)));
    };
    // Not under the lock: a request that ends at once calls back before Submit returns.
    absl::Status refused;
    std::shared_ptr<RequestHandle> handle =
        dispatcher.Submit(std::get<PreparedRequest>(std::move(prepared)), std::move(cb), &refused);
    if (handle == nullptr) return FinishLocked(ToGrpcStatus(ToApiError(refused)));
    MutexLock l(&shared->mu);
    shared->handle = handle;
    if (shared->cancelled) handle->Cancel();
  }

  // The client cancelled (or its deadline passed): the request is cancelled on the workers,
  // which then report nothing more, and the call must still be finished for OnDone to come.
  void OnCancel() override {
    MutexLock l(&shared_->mu);
    shared_->cancelled = true;
    if (shared_->handle != nullptr) shared_->handle->Cancel();
    FinishOnce(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    std::shared_ptr<RequestHandle> handle;  // let go outside the lock
    {
      MutexLock l(&shared_->mu);
      shared_->reactor = nullptr;
      // The request's callbacks hold shared_, which would otherwise hold the request: a cycle.
      handle = std::move(shared_->handle);
    }
    delete this;
  }

 private:
  // Under shared_->mu.
  void FinishOnce(const grpc::Status& status) {
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }
  // Refused before it ran (OnCancel may race).
  void FinishLocked(const grpc::Status& status) {
    MutexLock l(&shared_->mu);
    FinishOnce(status);
  }

  const ServedModel& model_;
  bool finished_ = false;  // under shared_->mu
  v1::CompletionResponse* response_;
  ResponseContext ctx_;
  int n_ = 1;
  // Under shared_->mu once the request runs.
  std::optional<Candidates> candidates_;
  PromptEcho echo_;
  std::shared_ptr<Shared<CompleteReactor>> shared_;
};

// One Generate call: the dispatcher's callbacks turn tokens into chunks (GrpcChunkStream) for
// the call's stream writer (server_stream_writer.h), which writes them one at a time;
// consecutive token chunks of one choice still waiting there are merged into one.
class GenerateCall : public std::enable_shared_from_this<GenerateCall> {
 public:
  using Stream = ServerStreamWriter<v1::CompletionChunk>;

  explicit GenerateCall(const ServedModel& model) : model_(model) {}

  grpc::ServerWriteReactor<v1::CompletionChunk>* Run(grpc::CallbackServerContext* context,
                                                     const v1::CompletionRequest& proto,
                                                     const ApiKeys& keys, int max_n,
                                                     Dispatcher& dispatcher) {
    const int64_t received_unix_s = static_cast<int64_t>(std::time(nullptr));
    auto self = shared_from_this();
    StreamHooks hooks;
    // The client cancelled (or its deadline passed): the request is cancelled on the workers,
    // which then report nothing more.
    hooks.on_client_gone = [self] {
      MutexLock l(&self->mu_);
      self->cancelled_ = true;
      if (self->handle_ != nullptr) self->handle_->Cancel();
    };
    hooks.on_done = [self] {
      std::shared_ptr<RequestHandle> handle;  // let go outside the lock
      MutexLock l(&self->mu_);
      // The request's callbacks hold this call, which would otherwise hold the request: a cycle.
      handle = std::move(self->handle_);
    };
    stream_ = std::make_shared<Stream>(std::move(hooks));
    grpc::ServerWriteReactor<v1::CompletionChunk>* reactor = stream_->Open();
    CompletionRequest parsed;
    ApiResult<PreparedRequest> prepared =
        Admit(context, proto, /*stream=*/true, keys, model_, max_n, &parsed);
    if (const ApiError* e = std::get_if<ApiError>(&prepared)) {
      stream_->End(ToGrpcStatus(*e));
      return reactor;
    }
    {
      MutexLock l(&mu_);
      chunks_.emplace(MakeResponseContext(parsed, model_.name, received_unix_s), *model_.tokenizer);
      n_ = parsed.n;
      echo_ = MakePromptEcho(parsed, std::get<PreparedRequest>(prepared).prompt, *model_.tokenizer);
    }
    RequestCallbacks cb;
    cb.on_prompt_logprobs = [self](std::span<const PromptLogprob> lps) {
      MutexLock l(&self->mu_);
      self->echo_.logprobs.insert(self->echo_.logprobs.end(), lps.begin(), lps.end());
    };
    cb.on_token = [self](const GeneratedToken& t) { self->OnToken(t); };
    if (parsed.n > 1) {
      cb.on_choice_end = [self](int choice, const std::string& finish) {
        MutexLock l(&self->mu_);
        // The last choice's end waits for on_end, which sends it with usage and timing.
        if (++self->choices_ended_ < self->n_) {
          self->WriteLocked(self->chunks_->FinishChoice(choice, finish));
        } else {
          self->last_choice_ = choice;
        }
      };
    }
    cb.on_end = [self](const CompletionEnd& end) {
      {
        MutexLock l(&self->mu_);
        self->WriteLocked(self->chunks_->Finish(end, self->last_choice_));
      }
      self->stream_->End(grpc::Status::OK);
    };
    cb.on_error = [self](const absl::Status& e) {
      self->stream_->End(ToGrpcStatus(ToApiError(e)));
    };
    // Not under the lock: a request that ends at once calls back before Submit returns.
    absl::Status refused;
    std::shared_ptr<RequestHandle> handle =
        dispatcher.Submit(std::get<PreparedRequest>(std::move(prepared)), std::move(cb), &refused);
    if (handle == nullptr) {
      stream_->End(ToGrpcStatus(ToApiError(refused)));
      return reactor;
    }
    MutexLock l(&mu_);
    handle_ = handle;
    if (cancelled_) handle->Cancel();
    return reactor;
  }

 private:
  // The dispatcher's callbacks come one at a time, in order.
  void OnToken(const GeneratedToken& t) ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock l(&mu_);
    if (cancelled_) return;
    const GeneratedToken one[] = {t};
    v1::CompletionChunk chunk;
    if (!chunks_->Tokens(one, t.choice, &chunk)) return;
    if (mergeable_ && pending_.index() == chunk.index()) {
      // Merged into the chunk not yet written, if it still waits.
      v1::CompletionChunk merged = pending_;
      MergeChunk(chunk, &merged);
      if (stream_->ReplaceLast(merged)) {
        pending_ = std::move(merged);
        return;
      }
    }
    WriteLocked(chunk);
    pending_ = std::move(chunk);
    mergeable_ = true;
  }

  // Every write goes here: the prompt's chunks before the first, and only token chunks are
  // merged into.
  void WriteLocked(v1::CompletionChunk chunk) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!prompt_sent_) {
      prompt_sent_ = true;
      for (v1::CompletionChunk& c : chunks_->Prompt(echo_, n_)) stream_->Write(std::move(c));
    }
    mergeable_ = false;
    stream_->Write(std::move(chunk));
  }

  const ServedModel& model_;
  std::shared_ptr<Stream> stream_;  // set once in Run
  Mutex mu_;
  std::shared_ptr<RequestHandle> handle_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<GrpcChunkStream> chunks_ ABSL_GUARDED_BY(mu_);  // set in Run, before any callback
  int n_ ABSL_GUARDED_BY(mu_) = 1;
  PromptEcho echo_ ABSL_GUARDED_BY(mu_);
  bool prompt_sent_ ABSL_GUARDED_BY(mu_) = false;
  int choices_ended_ ABSL_GUARDED_BY(mu_) = 0;
  int last_choice_ ABSL_GUARDED_BY(mu_) = 0;  // the choice whose end comes with on_end
  // The last chunk handed to the writer, when it is a token chunk that may still wait in its
  // queue (then the next of the same choice is merged into it).
  v1::CompletionChunk pending_ ABSL_GUARDED_BY(mu_);
  bool mergeable_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

grpc::ServerUnaryReactor* CompletionService::Complete(grpc::CallbackServerContext* context,
                                                      const v1::CompletionRequest* request,
                                                      v1::CompletionResponse* response) {
  auto* reactor = new CompleteReactor(*model_, response);
  reactor->Run(context, *request, *keys_, max_n_, *dispatcher_);
  return reactor;
}

grpc::ServerWriteReactor<v1::CompletionChunk>* CompletionService::Generate(
    grpc::CallbackServerContext* context, const v1::CompletionRequest* request) {
  return std::make_shared<GenerateCall>(*model_)->Run(context, *request, *keys_, max_n_,
                                                      *dispatcher_);
}

}  // namespace tripod::scheduler
