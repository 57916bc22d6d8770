#include "scheduler/request_call.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/kv/pyramid_budgets.h"
#include "common/rpc/deferred_release.h"
#include "common/rpc/protocol.h"
#include "scheduler/draft_methods.h"
#include "scheduler/router.h"
#include "spdlog/spdlog.h"

namespace tripod::scheduler {
namespace {

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

// A worker's refusal or failure as the client's error: what the worker said, the status a
// client can act on (its own mistake 400, overload 429/503, our fault 500).
ApiError WorkerError(const std::string& what, const grpc::Status& status) {
  ApiError e;
  e.message = absl::StrCat(what, ": ", status.error_message());
  switch (status.error_code()) {
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::OUT_OF_RANGE:
      e.http_status = 400;
      break;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      e.http_status = 503;
      e.type = "server_error";
      e.code = "worker_unavailable";
      break;
    default:
      e.http_status = 500;
      e.type = "server_error";
      break;
  }
  return e;
}

void FillSampling(const SamplingParams& s, v1::SamplingParams* out) {
  out->set_temperature(s.temperature);
  out->set_top_k(s.top_k);
  out->set_top_p(s.top_p);
  out->set_min_p(s.min_p);
  out->set_repetition_penalty(s.repetition_penalty);
  out->set_presence_penalty(s.presence_penalty);
  out->set_frequency_penalty(s.frequency_penalty);
  out->set_seed(s.seed);
  out->set_top_logprobs(s.top_logprobs);
  for (const TokenBias& b : s.logit_bias) {
    v1::TokenBias* w = out->add_logit_bias();
    w->set_id(b.id);
    w->set_bias(b.bias);
  }
}

}  // namespace

Call::Call(Dispatcher* dispatcher, PreparedRequest request, RequestCallbacks callbacks,
           uint64_t request_id)
    : dispatcher_(dispatcher),
      request_(std::move(request)),
      callbacks_(std::move(callbacks)),
      request_id_(request_id),
      accepted_(absl::Now()) {}

Call::~Call() {
  // The last reference to a Call often goes on a gRPC callback thread (the end of OnDone, a
  // unary callback's capture), and its contexts and workers may hold the last references to
  // their channels, which must not be destroyed there (deferred_release.h).
  struct Leftovers {
    std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
    std::shared_ptr<Worker> decode, prefill, draft;
  };
  auto rest = std::make_shared<Leftovers>();
  {
    MutexLock l(&mu_);
    rest->contexts = std::move(contexts_);
  }
  rest->decode = std::move(decode_);
  rest->prefill = std::move(prefill_);
  rest->draft = std::move(draft_);
  ReleaseLater(std::move(rest));
}

bool Call::cancelled() const {
  MutexLock l(&mu_);
  return cancelled_;
}

void Call::Begin() {
  started_ = absl::Now();
  times_.queue_s = Seconds(started_ - accepted_);
  if (SchedulerMetrics* m = dispatcher_->metrics()) m->RequestStarted(times_.queue_s);
  if (cancelled()) return Finish("cancelled", nullptr);
  if (dispatcher_->registry().Healthy(v1::ROLE_DECODE).empty()) {
    ApiError e{503, "no decode worker is available", "server_error", "", "no_workers"};
    return Finish("error", &e);
  }
  prompt_ = request_.prompt;
  const DraftMethod method = request_.method.method;
  if (method == DraftMethod::kNone) return Route();
  const int n = static_cast<int>(prompt_.size());
  MethodReport& report = times_.method;
  report.name = DraftMethodName(method);
  report.budget = ResolveBudget(request_.method, n);
  if (BudgetKeepsAll(method, report.budget, n)) {
    // Nothing to drop: the request runs exactly as without the method.
    report.applied = true;
    return Route();
  }
  if (NeedsDraft(method)) return StartDraft();
  AppliedMethod a =
      ApplyMethod(method, report.budget, prompt_, nullptr, dispatcher_->options().methods);
  if (!a.error.empty()) {
    MethodFallback(a.error);
  } else {
    if (CompressesPrompt(method)) report.applied = true;
    prompt_ = std::move(a.prompt);
    trimming_ = std::move(a.trimming);
    kv_entries_ = a.kv_entries;
  }
  Route();
}

void Call::StartDraft() {
  draft_ = PickDraft(dispatcher_->registry().Healthy(v1::ROLE_DRAFT), request_id_);
  if (draft_ == nullptr) {
    MethodFallback("no draft worker is available");
    return Route();
  }
  score_request_ =
      ScoreRequestFor(request_.method.method, request_id_, prompt_, times_.method.budget,
                      request_.max_tokens, dispatcher_->options().methods);
  grpc::ClientContext* context = nullptr;
  {
    MutexLock l(&mu_);
    if (!cancelled_) {
      contexts_.push_back(NewClientContext(dispatcher_->options().draft_timeout));
      context = contexts_.back().get();
      phase_ = Phase::kDrafting;
    }
  }
  if (context == nullptr) return Finish("cancelled", nullptr);
  draft_->AddInflight(1);
  draft_started_ = absl::Now();
  draft_->draft().async()->Score(
      context, &score_request_, &importance_map_,
      [self = shared_from_this()](grpc::Status s) { self->OnDrafted(s); });
}

void Call::OnDrafted(const grpc::Status& status) {
  draft_->AddInflight(-1);
  times_.draft_s = Seconds(absl::Now() - draft_started_);
  if (cancelled()) return Finish("cancelled", nullptr);
  if (!status.ok()) {
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
      draft_->MarkFailed(status.error_message());
    }
    MethodFallback(absl::StrCat("draft worker ", draft_->address(), ": ",
                                status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED
                                    ? "timed out"
                                    : status.error_message()));
    return Route();
  }
  const DraftMethod method = request_.method.method;
  AppliedMethod a = ApplyMethod(method, times_.method.budget, prompt_, &importance_map_,
                                dispatcher_->options().methods);
  if (!a.error.empty()) {
    MethodFallback(absl::StrCat("draft worker ", draft_->address(), ": ", a.error));
    return Route();
  }
  if (method == DraftMethod::kSpecPc) times_.method.applied = true;
  prompt_ = std::move(a.prompt);
  trimming_ = std::move(a.trimming);
  kv_entries_ = a.kv_entries;
  Route();
}

void Call::MethodFallback(const std::string& why) {
  spdlog::warn("scheduler: request {}: {} not applied: {}", request_id_, times_.method.name, why);
  times_.method.applied = false;
  times_.method.fallback = why;
  trimming_.Clear();
  kv_entries_ = 0;
}

void Call::Route() {
  const int n = static_cast<int>(prompt_.size());
  decode_ = PickDecode(dispatcher_->registry().Healthy(v1::ROLE_DECODE), n, request_id_);
  if (decode_ == nullptr) {
    ApiError e{503, "no decode worker is available", "server_error", "", "no_workers"};
    return Finish("error", &e);
  }
  decode_->AddInflight(1);
  // A prompt of one token has no KV to move; short ones prefill faster where they decode.
  const bool direct = n < std::max(2, dispatcher_->options().direct_prefill_tokens);
  if (direct || dispatcher_->registry().Healthy(v1::ROLE_PREFILL).empty()) {
    return StartGenerate(0, "decode_only");
  }
  const DispatcherOptions& o = dispatcher_->options();
  switch (request_.pop.kind) {
    case PopChoice::Kind::kOff:
      plan_ratio_ = "0";
      break;
    case PopChoice::Kind::kOn:
      plan_ratio_ = o.default_pop.empty() ? o.pop_on : o.default_pop;
      break;
    case PopChoice::Kind::kRatio:
      plan_ratio_ = request_.pop.ratio;
      break;
    case PopChoice::Kind::kDefault:
      plan_ratio_ = o.default_pop;
      break;
  }
  route_ = "disaggregated";
  ReserveAndPrefill(nullptr);
}

void Call::ReserveAndPrefill(const Worker* exclude) {
  prefill_ = PickPrefill(dispatcher_->registry().Healthy(v1::ROLE_PREFILL), exclude, plan_ratio_,
                         request_id_);
  if (prefill_ == nullptr) {
    if (exclude == nullptr) {
      // No prefill worker runs this plan (a pruned worker cannot run POP off, say): the decode
      // worker, which holds the full model, prefills it.
      return StartGenerate(0, "decode_only");
    }
    if (SchedulerMetrics* m = dispatcher_->metrics()) m->PrefillRetried("local");
    return StartGenerate(0, "local_fallback");
  }
  reserve_request_.Clear();
  reserve_request_.set_prompt_tokens(static_cast<int32_t>(prompt_.size()));
  reserve_request_.set_plan_key(prefill_->last_health().plan_key());
  std::vector<int> pyramid;
  if (trimming_.method() == v1::TRIM_PYRAMIDKV) {
    // The per-layer budgets need the model's layer count, known once a prefill worker is chosen
    // (every worker serves the same model): each layer's entries fill the top of the slots.
    const int n_layers = prefill_->last_health().model().n_layers();
    if (n_layers < 1) {
      MethodFallback(absl::StrCat("prefill worker ", prefill_->address(),
                                  " did not report its model's layer count"));
    } else {
      pyramid = PyramidLayerBudgets(trimming_.budget(), trimming_.window(), n_layers,
                                    static_cast<int>(prompt_.size()) - 1);
      trimming_.mutable_layer_budgets()->Assign(pyramid.begin(), pyramid.end());
    }
  }
  reserve_request_.set_kv_slots(kv_entries_);
  if (!pyramid.empty()) {
    const int slots = *std::max_element(pyramid.begin(), pyramid.end());
    reserve_request_.set_kv_slots(slots);
    for (int b : pyramid) reserve_request_.add_layer_first_slot(slots - b);
  }
  grpc::ClientContext* context = nullptr;
  {
    MutexLock l(&mu_);
    if (!cancelled_) {
      contexts_.push_back(NewClientContext(dispatcher_->options().reserve_timeout));
      context = contexts_.back().get();
      phase_ = Phase::kReserving;
    }
  }
  if (context == nullptr) return Finish("cancelled", nullptr);
  decode_->decode().async()->Reserve(
      context, &reserve_request_, &reserve_response_,
      [self = shared_from_this()](grpc::Status s) { self->OnReserved(s); });
}

void Call::OnReserved(const grpc::Status& status) {
  if (cancelled()) {
    if (status.ok()) SendDecodeCancel(reserve_response_.transfer_id());
    return Finish("cancelled", nullptr);
  }
  if (!status.ok()) {
    const grpc::StatusCode code = status.error_code();
    if (code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED) {
      // The decode worker is gone or not answering, and nothing of the request is there yet:
      // another decode worker takes it (once) rather than the request failing.
      if (code == grpc::StatusCode::UNAVAILABLE) decode_->MarkFailed(status.error_message());
      std::shared_ptr<Worker> other =
          decode_attempts_ == 0
              ? PickDecode(dispatcher_->registry().Healthy(v1::ROLE_DECODE),
                           static_cast<int>(prompt_.size()), request_id_, decode_.get())
              : nullptr;
      if (other != nullptr) {
        ++decode_attempts_;
        spdlog::warn("scheduler: request {}: Reserve on {} failed ({}); routing to {}", request_id_,
                     decode_->address(), status.error_message(), other->address());
        if (SchedulerMetrics* m = dispatcher_->metrics()) m->DecodeRerouted();
        decode_->AddInflight(-1);
        ReleaseLater(std::exchange(decode_, std::move(other)));
        decode_->AddInflight(1);
        route_ = "retried_decode";
        return ReserveAndPrefill(nullptr);
      }
    }
    // No room on the decode worker for the transferred KV: let it prefill the prompt itself
    // (its engine queues the request until blocks free up).
    spdlog::warn("scheduler: request {}: Reserve on {} failed ({}); prefilling there", request_id_,
                 decode_->address(), status.error_message());
    if (SchedulerMetrics* m = dispatcher_->metrics()) m->PrefillRetried("local");
    return StartGenerate(0, "local_fallback");
  }
  transfer_id_ = reserve_response_.transfer_id();
  RunPrefill();
}

void Call::RunPrefill() {
  prefill_request_.Clear();
  prefill_request_.set_request_id(request_id_);
  prefill_request_.mutable_prompt()->Assign(prompt_.begin(), prompt_.end());
  if (trimming_.method() != v1::TRIM_NONE) *prefill_request_.mutable_trimming() = trimming_;
  const DispatcherOptions& o = dispatcher_->options();
  if (!plan_ratio_.empty()) prefill_request_.mutable_plan()->set_pop_ratio(plan_ratio_);
  prefill_request_.set_decode_address(decode_->address());
  prefill_request_.set_transfer_id(transfer_id_);
  prefill_->AddInflight(1);
  grpc::ClientContext* context;
  {
    MutexLock l(&mu_);
    if (cancelled_) {
      context = nullptr;
    } else {
      contexts_.push_back(NewClientContext(o.prefill_timeout));
      context = contexts_.back().get();
      phase_ = Phase::kPrefilling;
    }
  }
  if (context == nullptr) {
    prefill_->AddInflight(-1);
    SendDecodeCancel(transfer_id_);
    return Finish("cancelled", nullptr);
  }
  prefill_->prefill().async()->Run(
      context, &prefill_request_, &prefill_response_,
      [self = shared_from_this()](grpc::Status s) { self->OnPrefilled(s); });
}

void Call::OnPrefilled(const grpc::Status& status) {
  prefill_->AddInflight(-1);
  if (cancelled()) {
    SendDecodeCancel(transfer_id_);
    return Finish("cancelled", nullptr);
  }
  if (!status.ok()) {
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
      prefill_->MarkFailed(status.error_message());
    }
    return RetryPrefill(
        absl::StrCat("prefill on ", prefill_->address(), " failed (", status.error_message(), ")"));
  }
  const v1::PrefillResponse& r = prefill_response_;
  times_.prefill_s = r.queue_s() + r.compute_s();
  times_.transfer_s = r.tail_s();
  if (SchedulerMetrics* m = dispatcher_->metrics()) m->KvBytes(static_cast<double>(r.bytes_sent()));
  if (trimming_.method() != v1::TRIM_NONE && kv_entries_ > 0) {
    // Every slot carries the same bytes (one type, every layer and head), so the untrimmed KV
    // would have been bytes_sent * (n - 1) / entries.
    const int64_t full =
        static_cast<int64_t>(static_cast<double>(r.bytes_sent()) *
                             (static_cast<double>(prompt_.size()) - 1) / kv_entries_);
    times_.method.applied = true;
    times_.method.kv_entries = kv_entries_;
    times_.method.kv_bytes_saved = full - static_cast<int64_t>(r.bytes_sent());
  }
  StartGenerate(transfer_id_, route_);
}

void Call::RetryPrefill(const std::string& why) {
  // The reservation may hold part of the KV: free it now rather than at its lease's end.
  if (transfer_id_ != 0) SendDecodeCancel(transfer_id_);
  transfer_id_ = 0;
  ++prefill_attempts_;
  if (prefill_attempts_ == 1 && PickPrefill(dispatcher_->registry().Healthy(v1::ROLE_PREFILL),
                                            prefill_.get(), plan_ratio_, request_id_) != nullptr) {
    spdlog::warn("scheduler: request {}: {}; retrying on another prefill worker", request_id_, why);
    if (SchedulerMetrics* m = dispatcher_->metrics()) m->PrefillRetried("another_worker");
    route_ = "retried_prefill";
    return ReserveAndPrefill(prefill_.get());
  }
  spdlog::warn("scheduler: request {}: {}; prefilling on the decode worker", request_id_, why);
  if (SchedulerMetrics* m = dispatcher_->metrics()) m->PrefillRetried("local");
  StartGenerate(0, "local_fallback");
}

void Call::StartGenerate(uint64_t transfer_id, const std::string& route) {
  times_.route = route;
  if (transfer_id == 0 && trimming_.method() != v1::TRIM_NONE) {
    MethodFallback(absl::StrCat("the decode worker prefilled the whole prompt (", route, ")"));
  }
  v1::GenerateRequest& g = generate_request_;
  g.set_request_id(request_id_);
  // After a migration the new worker continues from what was streamed: those tokens end its
  // prompt, and count against max_tokens.
  g.mutable_prompt()->Assign(prompt_.begin(), prompt_.end());
  g.mutable_prompt()->Add(generated_.begin(), generated_.end());
  g.set_continuation(!generated_.empty());
  g.set_transfer_id(transfer_id);
  FillSampling(request_.sampling, g.mutable_sampling());
  g.set_max_tokens(request_.max_tokens - static_cast<int>(generated_.size()));
  for (const std::string& s : request_.stop) g.add_stop(s);
  g.mutable_stop_token_ids()->Assign(request_.stop_token_ids.begin(),
                                     request_.stop_token_ids.end());
  g.set_min_tokens(std::max(0, request_.min_tokens - static_cast<int>(generated_.size())));
  g.set_ignore_eos(request_.ignore_eos);
  grpc::ClientContext* context;
  {
    MutexLock l(&mu_);
    if (cancelled_) {
      context = nullptr;
    } else {
      contexts_.push_back(NewClientContext());
      context = contexts_.back().get();
      phase_ = Phase::kGenerating;
      hold_ = shared_from_this();
    }
  }
  if (context == nullptr) {
    if (transfer_id != 0) SendDecodeCancel(transfer_id);
    return Finish("cancelled", nullptr);
  }
  decode_->decode().async()->Generate(context, &generate_request_, this);
  StartRead(&event_);
  StartCall();
}

void Call::OnReadDone(bool ok) {
  if (!ok) return;  // the stream ended: OnDone follows
  const v1::GenerateResponse& ev = event_;
  if ((ev.token() >= 0 || !ev.text().empty()) && !cancelled()) {
    const absl::Time now = absl::Now();
    if (ev.token() >= 0) {
      if (SchedulerMetrics* m = dispatcher_->metrics()) {
        if (tokens_ == 0) {
          m->FirstToken(Seconds(now - accepted_));
        } else {
          m->InterToken(Seconds(now - last_token_));
        }
      }
      ++tokens_;
      last_token_ = now;
      generated_.push_back(ev.token());
    }
    text_held_ = ev.text_held();
    GeneratedToken t;
    t.id = ev.token();
    t.text = ev.text();
    t.logprob = ev.logprob();
    for (const v1::TopLogprob& tl : ev.top_logprobs()) t.top.push_back({tl.token(), tl.logprob()});
    if (callbacks_.on_token) callbacks_.on_token(t);
  }
  if (ev.finish() != v1::FINISH_NONE) {
    end_seen_ = true;
    end_ = ev;
  }
  StartRead(&event_);
}

void Call::OnDone(const grpc::Status& status) {
  std::shared_ptr<Call> keep;  // released last: `this` may go with it
  {
    MutexLock l(&mu_);
    keep = std::move(hold_);
  }
  if (cancelled()) return Finish("cancelled", nullptr);
  if (end_seen_) {
    times_.first_token_s = end_.timing().first_token_s();
    times_.decode_s = end_.timing().decode_s();
    switch (end_.finish()) {
      case v1::FINISH_STOP:
        return Finish("stop", nullptr);
      case v1::FINISH_LENGTH:
        return Finish("length", nullptr);
      case v1::FINISH_CANCELLED: {
        ApiError e{503, absl::StrCat("the decode worker ended the request: ", end_.error()),
                   "server_error", "", "worker_cancelled"};
        return Finish("error", &e);
      }
      default: {
        ApiError e{500, absl::StrCat("the decode worker failed: ", end_.error()), "server_error",
                   "", ""};
        return Finish("error", &e);
      }
    }
  }
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
    decode_->MarkFailed(status.error_message());
    if (Migrate(status)) return;
  }
  ApiError e = WorkerError(absl::StrCat("decode worker ", decode_->address()), status);
  if (status.ok())
    e = ApiError{500, "the decode worker's stream ended without a finish", "server_error", "", ""};
  Finish("error", &e);
}

bool Call::Migrate(const grpc::Status& status) {
  if (migrations_ >= dispatcher_->options().migration_limit) return false;
  if (text_held_) {
    spdlog::warn("scheduler: request {}: decode worker {} died holding text back; not moved",
                 request_id_, decode_->address());
    return false;
  }
  const int n = static_cast<int>(prompt_.size() + generated_.size());
  if (request_.max_tokens - static_cast<int>(generated_.size()) < 1) return false;
  std::shared_ptr<Worker> other =
      PickDecode(dispatcher_->registry().Healthy(v1::ROLE_DECODE), n, request_id_, decode_.get());
  if (other == nullptr) return false;
  ++migrations_;
  spdlog::warn(
      "scheduler: request {}: decode worker {} died mid-stream ({}); moving it to {} "
      "after {} tokens",
      request_id_, decode_->address(), status.error_message(), other->address(), generated_.size());
  if (SchedulerMetrics* m = dispatcher_->metrics()) m->Migrated();
  decode_->AddInflight(-1);
  other->AddInflight(1);
  std::shared_ptr<Worker> old;
  {
    MutexLock l(&mu_);
    phase_ = Phase::kReserving;  // a Cancel now only flags; StartGenerate sees the flag
    old = std::exchange(decode_, std::move(other));
  }
  ReleaseLater(std::move(old));
  carried_tokens_ = static_cast<int>(generated_.size());
  // The new worker prefills everything itself: the method's report stands as it was.
  trimming_.Clear();
  StartGenerate(0, "migrated");
  return true;
}

void Call::Cancel() {
  Phase phase;
  grpc::ClientContext* in_flight = nullptr;
  std::shared_ptr<Worker> decode;  // the stream's worker (Migrate may replace decode_)
  {
    MutexLock l(&mu_);
    if (cancelled_ || finished_) return;
    cancelled_ = true;
    phase = phase_;
    if (phase != Phase::kQueued && !contexts_.empty()) in_flight = contexts_.back().get();
    if (phase == Phase::kGenerating) decode = decode_;
  }
  if (in_flight != nullptr) in_flight->TryCancel();
  switch (phase) {
    case Phase::kQueued:
      // Still in the queue: it never reaches a worker (Begin sees the flag if it raced).
      dispatcher_->CancelQueued(this);
      break;
    case Phase::kPrefilling:
      SendPrefillCancel();
      break;
    case Phase::kGenerating:
      // The decode worker also notices the cancelled call, within its poll interval; the
      // explicit Cancel reaches its engine before the next step.
      SendDecodeCancel(0, std::move(decode));
      break;
    default:
      break;
  }
}

void Call::FailQueued(const ApiError& error) { Finish("error", &error); }

void Call::Finish(const std::string& finish, const ApiError* error) {
  bool client_gone;
  {
    MutexLock l(&mu_);
    if (finished_) return;
    finished_ = true;
    client_gone = cancelled_;
    phase_ = Phase::kDone;
  }
  const absl::Time now = absl::Now();
  times_.total_s = Seconds(now - accepted_);
  CompletionEnd end;
  end.finish_reason = finish;
  end.times = times_;
  end.usage.prompt_tokens = static_cast<int>(request_.prompt.size());
  if (!end.times.method.name.empty()) {
    end.times.method.prompt_tokens = static_cast<int>(prompt_.size());
  }
  end.usage.completion_tokens =
      end_seen_ ? carried_tokens_ + end_.usage().completion_tokens() : tokens_;
  // After a migration the last worker's cache hits were on the prompt and earlier output.
  end.usage.cached_tokens = end_seen_ && migrations_ == 0 ? end_.usage().cached_tokens() : 0;
  if (decode_ != nullptr) decode_->AddInflight(-1);
  if (SchedulerMetrics* m = dispatcher_->metrics()) {
    m->RequestEnded(client_gone ? "cancelled" : (error != nullptr ? "error" : finish), end.usage,
                    end.times);
  }
  if (!client_gone) {
    if (error != nullptr) {
      if (callbacks_.on_error) callbacks_.on_error(*error);
    } else if (callbacks_.on_end) {
      callbacks_.on_end(end);
    }
  }
  dispatcher_->CallDone(this);
}

namespace {

struct PendingCancel {
  std::shared_ptr<Worker> worker;
  std::unique_ptr<grpc::ClientContext> context;
  v1::CancelRequest request;
  v1::CancelResponse response;
  // Stored (release) once filled in, loaded (acquire) by the callback: what gRPC does between the
  // two threads is invisible to ThreadSanitizer (Debian's gRPC is uninstrumented), this is not.
  std::atomic<bool> sent{false};
};

// On the call's callback thread: the worker may be the last reference to its channel.
void ReleasePendingCancel(PendingCancel* p) {
  (void)p->sent.load(std::memory_order_acquire);
  ReleaseLater(std::shared_ptr<PendingCancel>(p));
}

}  // namespace

void Call::SendDecodeCancel(uint64_t transfer_id, std::shared_ptr<Worker> worker) {
  if (worker == nullptr) worker = decode_;
  if (worker == nullptr) return;
  auto* p = new PendingCancel{worker, NewClientContext(std::chrono::seconds(5))};
  // One or the other: a transfer's cancel must not end the Generate call that (after a failed
  // prefill) runs under the same request id.
  if (transfer_id != 0) {
    p->request.set_transfer_id(transfer_id);
  } else {
    p->request.set_request_id(request_id_);
  }
  // Nothing of *p is read once `sent` is published: the call's callback may free it as soon as
  // the call is made.
  grpc::ClientContext* context = p->context.get();
  p->sent.store(true, std::memory_order_release);
  worker->decode().async()->Cancel(context, &p->request, &p->response,
                                   [p](grpc::Status) { ReleasePendingCancel(p); });
  // This may be the worker's last reference (Migrate replaced decode_): never dropped here, on
  // what may be a gRPC callback thread.
  ReleaseLater(std::move(worker));
}

void Call::SendPrefillCancel() {
  if (prefill_ == nullptr) return;
  auto* p = new PendingCancel{prefill_, NewClientContext(std::chrono::seconds(5))};
  p->request.set_request_id(request_id_);
  grpc::ClientContext* context = p->context.get();  // read before `sent` is published
  p->sent.store(true, std::memory_order_release);
  prefill_->prefill().async()->Cancel(context, &p->request, &p->response,
                                      [p](grpc::Status) { ReleasePendingCancel(p); });
}

}  // namespace tripod::scheduler
