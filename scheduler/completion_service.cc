#include "scheduler/completion_service.h"

#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "common/util/mutex.h"
#include "scheduler/openai_request.h"
#include "scheduler/openai_response.h"
#include "scheduler/request_preparation.h"

namespace tripod::scheduler {
namespace {

// The call's checks before anything runs: the API key, parsing, the model.
ApiResult<PreparedRequest> Admit(grpc::CallbackServerContext* context,
                                 const v1::CompletionRequest& proto, const ApiKeys& keys,
                                 const ServedModel& model, CompletionRequest* parsed_out) {
  if (keys.enabled()) {
    const auto& md = context->client_metadata();
    auto it = md.find("authorization");
    std::optional<std::string> value;
    if (it != md.end()) value.emplace(it->second.data(), it->second.size());
    if (std::optional<ApiError> e = keys.Check(value ? &*value : nullptr)) return *e;
  }
  ApiResult<CompletionRequest> parsed = CompletionRequestFromProto(proto);
  if (const ApiError* e = std::get_if<ApiError>(&parsed)) return *e;
  *parsed_out = std::get<CompletionRequest>(std::move(parsed));
  return PrepareRequest(*parsed_out, model);
}

// State shared by a call's reactor and the dispatcher's callbacks: the reactor goes away in
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
           const ApiKeys& keys, Dispatcher& dispatcher) {
    CompletionRequest parsed;
    ApiResult<PreparedRequest> prepared = Admit(context, proto, keys, model_, &parsed);
    if (const ApiError* e = std::get_if<ApiError>(&prepared)) return FinishLocked(ToGrpcStatus(*e));
    ctx_ = MakeResponseContext(parsed, model_.name, model_.created);
    auto shared = shared_;
    RequestCallbacks cb;
    cb.on_token = [shared](const GeneratedToken& t) {
      MutexLock l(&shared->mu);
      if (shared->reactor != nullptr) shared->reactor->tokens_.push_back(t);
    };
    cb.on_end = [shared](const CompletionEnd& end) {
      MutexLock l(&shared->mu);
      CompleteReactor* r = shared->reactor;
      if (r != nullptr && !r->finished_) {
        FillCompletionResponse(r->ctx_, r->tokens_, end, *r->model_.tokenizer, r->response_);
        r->FinishOnce(grpc::Status::OK);
      }
    };
    cb.on_error = [shared](const ApiError& e) {
      MutexLock l(&shared->mu);
      if (shared->reactor != nullptr) shared->reactor->FinishOnce(ToGrpcStatus(e));
    };
    // Not under the lock: a request that ends at once calls back before Submit returns.
    ApiError refused;
    std::shared_ptr<RequestHandle> handle =
        dispatcher.Submit(std::get<PreparedRequest>(std::move(prepared)), std::move(cb), &refused);
    if (handle == nullptr) return FinishLocked(ToGrpcStatus(refused));
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
  std::vector<GeneratedToken> tokens_;
  std::shared_ptr<Shared<CompleteReactor>> shared_;
};

// Chunks are written one at a time (gRPC allows one write in flight); those that arrive meanwhile
// wait in a queue, and consecutive token chunks are merged there.
class GenerateReactor : public grpc::ServerWriteReactor<v1::CompletionChunk> {
 public:
  explicit GenerateReactor(const ServedModel& model)
      : model_(model), shared_(std::make_shared<Shared<GenerateReactor>>()) {
    MutexLock l(&shared_->mu);
    shared_->reactor = this;
  }

  void Run(grpc::CallbackServerContext* context, const v1::CompletionRequest& proto,
           const ApiKeys& keys, Dispatcher& dispatcher) {
    CompletionRequest parsed;
    ApiResult<PreparedRequest> prepared = Admit(context, proto, keys, model_, &parsed);
    if (const ApiError* e = std::get_if<ApiError>(&prepared)) return FinishLocked(ToGrpcStatus(*e));
    parsed.stream = true;
    ctx_ = MakeResponseContext(parsed, model_.name, model_.created);
    auto shared = shared_;
    RequestCallbacks cb;
    cb.on_token = [shared](const GeneratedToken& t) {
      MutexLock l(&shared->mu);
      if (GenerateReactor* r = shared->reactor) r->Enqueue(t, nullptr, nullptr);
    };
    cb.on_end = [shared](const CompletionEnd& end) {
      MutexLock l(&shared->mu);
      if (GenerateReactor* r = shared->reactor) r->Enqueue(std::nullopt, &end, nullptr);
    };
    cb.on_error = [shared](const ApiError& e) {
      MutexLock l(&shared->mu);
      if (GenerateReactor* r = shared->reactor) r->Enqueue(std::nullopt, nullptr, &e);
    };
    // Not under the lock: a request that ends at once calls back before Submit returns.
    ApiError refused;
    std::shared_ptr<RequestHandle> handle =
        dispatcher.Submit(std::get<PreparedRequest>(std::move(prepared)), std::move(cb), &refused);
    if (handle == nullptr) return FinishLocked(ToGrpcStatus(refused));
    MutexLock l(&shared->mu);
    shared->handle = handle;
    if (shared->cancelled) handle->Cancel();
  }

  void OnWriteDone(bool ok) override {
    MutexLock l(&shared_->mu);
    writing_ = false;
    if (!ok) {  // the call is over (cancelled): finish it, nothing more is written
      pending_.clear();
      if (!final_status_.has_value()) final_status_ = grpc::Status::CANCELLED;
    }
    WriteNext();
  }

  // The client cancelled (or its deadline passed): the request is cancelled on the workers,
  // which then report nothing more, and the call must still be finished for OnDone to come (at
  // once, or when the write in flight is done: one operation at a time).
  void OnCancel() override {
    MutexLock l(&shared_->mu);
    shared_->cancelled = true;
    if (shared_->handle != nullptr) shared_->handle->Cancel();
    pending_.clear();
    pending_tokens_.clear();
    final_status_ = grpc::Status::CANCELLED;
    if (!writing_) WriteNext();
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
  void Enqueue(std::optional<GeneratedToken> token, const CompletionEnd* end,
               const ApiError* error) {
    if (finished_ || shared_->cancelled) return;  // the call is over or being finished
    if (token.has_value()) {
      if (!pending_.empty() && pending_.back().finish_reason().empty() &&
          !pending_tokens_.empty()) {
        pending_tokens_.push_back(*token);  // merged into the chunk not yet written
        pending_.back().Clear();
        FillCompletionChunk(ctx_, pending_tokens_, *model_.tokenizer, &pending_.back());
      } else {
        pending_tokens_ = {*token};
        pending_.emplace_back();
        FillCompletionChunk(ctx_, pending_tokens_, *model_.tokenizer, &pending_.back());
      }
    } else if (end != nullptr) {
      pending_tokens_.clear();
      pending_.emplace_back();
      FillFinalChunk(ctx_, *end, &pending_.back());
      final_status_ = grpc::Status::OK;
    } else {
      pending_tokens_.clear();
      final_status_ = ToGrpcStatus(*error);
    }
    if (!writing_) WriteNext();
  }

  // Refused before it ran (OnCancel may race).
  void FinishLocked(const grpc::Status& status) {
    MutexLock l(&shared_->mu);
    FinishOnce(status);
  }
  // Under shared_->mu.
  void FinishOnce(const grpc::Status& status) {
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

  void WriteNext() {
    if (pending_.empty()) {
      if (final_status_.has_value()) FinishOnce(*final_status_);
      return;
    }
    current_ = std::move(pending_.front());
    pending_.pop_front();
    if (pending_.empty()) pending_tokens_.clear();
    writing_ = true;
    StartWrite(&current_);
  }

  const ServedModel& model_;
  std::shared_ptr<Shared<GenerateReactor>> shared_;
  ResponseContext ctx_;
  std::deque<v1::CompletionChunk> pending_;
  std::vector<GeneratedToken> pending_tokens_;  // the tokens of pending_.back(), if a token chunk
  v1::CompletionChunk current_;
  bool writing_ = false;
  bool finished_ = false;
  std::optional<grpc::Status> final_status_;
};

}  // namespace

grpc::ServerUnaryReactor* CompletionService::Complete(grpc::CallbackServerContext* context,
                                                      const v1::CompletionRequest* request,
                                                      v1::CompletionResponse* response) {
  auto* reactor = new CompleteReactor(*model_, response);
  reactor->Run(context, *request, *keys_, *dispatcher_);
  return reactor;
}

grpc::ServerWriteReactor<v1::CompletionChunk>* CompletionService::Generate(
    grpc::CallbackServerContext* context, const v1::CompletionRequest* request) {
  auto* reactor = new GenerateReactor(*model_);
  reactor->Run(context, *request, *keys_, *dispatcher_);
  return reactor;
}

}  // namespace tripod::scheduler
