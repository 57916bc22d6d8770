#include "scheduler/request_call.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/rpc/deferred_release.h"
#include "common/rpc/protocol.h"
#include "scheduler/draft_methods.h"
#include "scheduler/router.h"
#include "spdlog/spdlog.h"

namespace tripod::scheduler {
namespace {

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

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
      accepted_(absl::Now()),
      choices_(std::max(1, request_.n)) {}

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

WorkerSnapshot Call::Workers() const { return SnapshotOf(dispatcher_->registry()); }

grpc::ClientContext* Call::NextContext(Phase phase, std::chrono::milliseconds timeout) {
  MutexLock l(&mu_);
  if (cancelled_) return nullptr;
  contexts_.push_back(NewClientContext(timeout));
  phase_ = phase;
  if (phase == Phase::kGenerating) hold_ = shared_from_this();
  return contexts_.back().get();
}

void Call::Begin() {
  started_ = absl::Now();
  times_.queue_s = Seconds(started_ - accepted_);
  if (SchedulerMetrics* m = dispatcher_->metrics()) m->RequestStarted(times_.queue_s);
  if (cancelled()) return Finish("cancelled", nullptr);
  if (absl::Status st = CheckDecodeWorkers(Workers()); !st.ok()) return Finish("error", &st);
  prompt_ = request_.prompt;
  const DraftMethod method = request_.method.method;
  const MethodPlan plan = PlanMethod(request_.method, static_cast<int>(prompt_.size()),
                                     dispatcher_->options().methods.min_kept);
  if (plan.step == MethodStep::kNone) return ChooseWorkers();
  MethodReport& report = times_.method;
  report.name = DraftMethodName(method);
  report.budget = plan.budget;
  switch (plan.step) {
    case MethodStep::kKeepsAll:
      report.applied = true;  // nothing to drop: the request runs exactly as without it
      return ChooseWorkers();
    case MethodStep::kDraft:
      return StartDraft();
    default:
      break;
  }
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
  ChooseWorkers();
}

void Call::StartDraft() {
  draft_ = PickDraft(Workers().draft, request_id_);
  if (draft_ == nullptr) {
    MethodFallback("no draft worker is available");
    return ChooseWorkers();
  }
  score_request_ =
      ScoreRequestFor(request_.method.method, request_id_, prompt_, times_.method.budget,
                      request_.max_tokens, dispatcher_->options().methods);
  // The deadline covers the prompts queued at the draft worker ahead of this one.
  draft_tokens_ = static_cast<int64_t>(prompt_.size());
  grpc::ClientContext* context =
      NextContext(Phase::kDrafting, DraftDeadline(dispatcher_->options().draft_timeout,
                                                  draft_->inflight_tokens() + draft_tokens_));
  if (context == nullptr) return Finish("cancelled", nullptr);
  draft_->AddInflight(1);
  draft_->AddInflightTokens(draft_tokens_);
  draft_started_ = absl::Now();
  draft_->draft().async()->Score(
      context, &score_request_, &importance_map_,
      [self = shared_from_this()](grpc::Status s) { self->OnDrafted(s); });
}

void Call::OnDrafted(const grpc::Status& status) {
  draft_->AddInflight(-1);
  draft_->AddInflightTokens(-draft_tokens_);
  times_.draft_s = Seconds(absl::Now() - draft_started_);
  if (cancelled()) return Finish("cancelled", nullptr);
  if (!status.ok()) {
    const DraftFailure f = AfterDraftFailed(tripod::FromGrpcStatus(status), draft_->address());
    if (f.mark_failed) draft_->MarkFailed(status.error_message());
    MethodFallback(f.why);
    return ChooseWorkers();
  }
  const DraftMethod method = request_.method.method;
  AppliedMethod a = ApplyMethod(method, times_.method.budget, prompt_, &importance_map_,
                                dispatcher_->options().methods);
  if (!a.error.empty()) {
    MethodFallback(absl::StrCat("draft worker ", draft_->address(), ": ", a.error));
    return ChooseWorkers();
  }
  if (method == DraftMethod::kSpecPc) times_.method.applied = true;
  prompt_ = std::move(a.prompt);
  trimming_ = std::move(a.trimming);
  kv_entries_ = a.kv_entries;
  ChooseWorkers();
}

void Call::MethodFallback(const std::string& why) {
  spdlog::warn("scheduler: request {}: {} not applied: {}", request_id_, times_.method.name, why);
  times_.method.applied = false;
  times_.method.fallback = why;
  trimming_.Clear();
  kv_entries_ = 0;
}

void Call::ChooseWorkers() {
  const WorkerSnapshot workers = Workers();
  RoutePlan plan = PlanRoute(static_cast<int>(prompt_.size()), request_.pop, workers,
                             dispatcher_->options(), request_id_, request_.prompt_logprobs >= 0);
  if (!plan.status.ok()) return Finish("error", &plan.status);
  decode_ = std::move(plan.decode);
  decode_->AddInflight(1);
  if (plan.route == Route::kDecodeOnly) return StartGenerate(0, Route::kDecodeOnly);
  plan_ratio_ = std::move(plan.pop_ratio);
  route_ = plan.route;
  ReserveAndPrefill(ChoosePrefill(workers, nullptr, plan_ratio_, request_id_));
}

void Call::ReserveAndPrefill(PrefillChoice choice) {
  if (choice.prefill == nullptr) {
    if (choice.fallback == Route::kLocalFallback) {
      if (SchedulerMetrics* m = dispatcher_->metrics()) m->PrefillRetried("local");
    }
    return StartGenerate(0, choice.fallback);
  }
  prefill_ = std::move(choice.prefill);
  const int n = static_cast<int>(prompt_.size());
  KvPlan kv = PlanKv(trimming_, kv_entries_, n, *prefill_);
  if (!kv.fallback.empty()) MethodFallback(kv.fallback);
  if (!kv.layer_budgets.empty()) {
    trimming_.mutable_layer_budgets()->Assign(kv.layer_budgets.begin(), kv.layer_budgets.end());
  }
  reserve_request_.Clear();
  reserve_request_.set_prompt_tokens(n);
  reserve_request_.set_plan_key(prefill_->last_health().plan_key());
  // The reservation must outlive the prefill, which may queue and run for minutes on a long
  // prompt (docs/workers.md, "Leases"): the decode worker's default lease freed it first, and the
  // request fell back to prefilling on the decode worker. This
  // scheduler gives the prefill up at prefill_timeout and cancels the reservation on every failure,
  // so a lease that long only holds KV after the scheduler itself died (the worker caps it).
  reserve_request_.set_lease_ms(static_cast<uint32_t>(
      std::clamp<int64_t>(dispatcher_->options().prefill_timeout.count(), 1, UINT32_MAX)));
  reserve_request_.set_kv_slots(kv.kv_slots);
  reserve_request_.mutable_layer_first_slot()->Assign(kv.layer_first_slot.begin(),
                                                      kv.layer_first_slot.end());
  grpc::ClientContext* context =
      NextContext(Phase::kReserving, dispatcher_->options().reserve_timeout);
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
  if (status.ok()) {
    transfer_id_ = reserve_response_.transfer_id();
    return RunPrefill();
  }
  const WorkerSnapshot workers = Workers();
  NextStep next = AfterReserveFailed(tripod::FromGrpcStatus(status), *decode_, decode_attempts_,
                                     static_cast<int>(prompt_.size()), workers, request_id_);
  if (next.mark_failed) decode_->MarkFailed(status.error_message());
  if (next.kind == NextStep::Kind::kReserveAgain) {
    ++decode_attempts_;
    spdlog::warn("scheduler: request {}: Reserve on {} failed ({}); routing to {}", request_id_,
                 decode_->address(), status.error_message(), next.worker->address());
    if (SchedulerMetrics* m = dispatcher_->metrics()) m->DecodeRerouted();
    decode_->AddInflight(-1);
    ReleaseLater(std::exchange(decode_, std::move(next.worker)));
    decode_->AddInflight(1);
    route_ = next.route;
    return ReserveAndPrefill(ChoosePrefill(workers, nullptr, plan_ratio_, request_id_));
  }
  spdlog::warn("scheduler: request {}: Reserve on {} failed ({}); prefilling there", request_id_,
               decode_->address(), status.error_message());
  if (SchedulerMetrics* m = dispatcher_->metrics()) m->PrefillRetried("local");
  StartGenerate(0, next.route);
}

void Call::RunPrefill() {
  prefill_request_.Clear();
  prefill_request_.set_request_id(request_id_);
  prefill_request_.mutable_prompt()->Assign(prompt_.begin(), prompt_.end());
  if (trimming_.method() != v1::TRIM_NONE) *prefill_request_.mutable_trimming() = trimming_;
  if (!plan_ratio_.empty()) prefill_request_.mutable_plan()->set_pop_ratio(plan_ratio_);
  if (request_.pop.control()) {
    prefill_request_.mutable_plan()->set_variant(PopVariantName(request_.pop.variant));
  }
  prefill_request_.set_decode_address(decode_->address());
  prefill_request_.set_decode_tls_name(decode_->tls_name());
  prefill_request_.set_transfer_id(transfer_id_);
  grpc::ClientContext* context =
      NextContext(Phase::kPrefilling, dispatcher_->options().prefill_timeout);
  if (context == nullptr) {
    SendDecodeCancel(transfer_id_);
    return Finish("cancelled", nullptr);
  }
  prefill_->AddInflight(1);
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
  if (!status.ok()) return RetryPrefill(status);
  const v1::PrefillResponse& r = prefill_response_;
  times_.prefill_s = r.queue_s() + r.compute_s();
  times_.transfer_s = r.tail_s();
  if (SchedulerMetrics* m = dispatcher_->metrics()) m->KvBytes(static_cast<double>(r.bytes_sent()));
  if (trimming_.method() != v1::TRIM_NONE && kv_entries_ > 0) {
    times_.method.applied = true;
    times_.method.kv_entries = kv_entries_;
    times_.method.kv_bytes_saved = KvBytesSaved(static_cast<int64_t>(r.bytes_sent()),
                                                static_cast<int>(prompt_.size()), kv_entries_);
  }
  StartGenerate(transfer_id_, route_);
}

void Call::RetryPrefill(const grpc::Status& status) {
  const std::string why =
      absl::StrCat("prefill on ", prefill_->address(), " failed (", status.error_message(), ")");
  // The reservation may hold part of the KV: free it now rather than at its lease's end.
  if (transfer_id_ != 0) SendDecodeCancel(transfer_id_);
  transfer_id_ = 0;
  ++prefill_attempts_;
  NextStep next = AfterPrefillFailed(tripod::FromGrpcStatus(status), *prefill_, prefill_attempts_,
                                     plan_ratio_, Workers(), request_id_);
  if (next.mark_failed) prefill_->MarkFailed(status.error_message());
  if (next.kind == NextStep::Kind::kPrefillOn) {
    spdlog::warn("scheduler: request {}: {}; retrying on another prefill worker", request_id_, why);
    if (SchedulerMetrics* m = dispatcher_->metrics()) m->PrefillRetried("another_worker");
    route_ = next.route;
    return ReserveAndPrefill(PrefillChoice{std::move(next.worker), Route::kLocalFallback});
  }
  spdlog::warn("scheduler: request {}: {}; prefilling on the decode worker", request_id_, why);
  if (SchedulerMetrics* m = dispatcher_->metrics()) m->PrefillRetried("local");
  StartGenerate(0, next.route);
}

void Call::StartGenerate(uint64_t transfer_id, Route route) {
  times_.route = RouteName(route);
  if (transfer_id == 0 && trimming_.method() != v1::TRIM_NONE) {
    MethodFallback(
        absl::StrCat("the decode worker prefilled the whole prompt (", RouteName(route), ")"));
  }
  v1::GenerateRequest& g = generate_request_;
  g.Clear();  // a migration's request is built afresh
  g.set_request_id(request_id_);
  g.mutable_prompt()->Assign(prompt_.begin(), prompt_.end());
  g.set_transfer_id(transfer_id);
  FillSampling(request_.sampling, g.mutable_sampling());
  for (const std::string& s : request_.stop) g.add_stop(s);
  g.set_include_stop_str(request_.include_stop_str);
  g.mutable_stop_token_ids()->Assign(request_.stop_token_ids.begin(),
                                     request_.stop_token_ids.end());
  g.set_ignore_eos(request_.ignore_eos);
  // After a migration the new worker continues each choice from what it streamed: those tokens
  // end its prompt (the constraint walked over them first), and count against max_tokens.
  const std::vector<ChoiceResume> resume =
      ChoicesToResume(Progress(), request_.max_tokens, request_.min_tokens);
  if (!request_.output_regex.empty()) g.mutable_constraint()->set_regex(request_.output_regex);
  if (request_.n > 1 && migrations_ > 0) {
    for (const ChoiceResume& r : resume) {
      v1::ContinuedChoice* w = g.add_continued_choices();
      w->set_choice(r.choice);
      const std::vector<int32_t>& out = choices_[r.choice].tokens;
      w->mutable_tokens()->Assign(out.begin(), out.end());
      w->set_max_tokens(r.max_tokens);
      w->set_min_tokens(r.min_tokens);
    }
  } else {
    const std::vector<int32_t>& out = choices_[0].tokens;  // empty before a migration
    g.mutable_prompt()->Add(out.begin(), out.end());
    g.set_continuation(!out.empty());
    g.set_max_tokens(resume.empty() ? request_.max_tokens : resume[0].max_tokens);
    g.set_min_tokens(resume.empty() ? request_.min_tokens : resume[0].min_tokens);
    if (!request_.output_regex.empty()) {
      g.mutable_constraint()->set_generated(static_cast<int>(out.size()));
    }
    if (request_.n > 1) g.set_n(request_.n);
  }
  // Until every prompt position's log-probability is in (a migrated stream's new worker computes
  // what the dead one did not send).
  const int prompt_positions = static_cast<int>(request_.prompt.size()) - 1;
  g.set_prompt_logprobs(request_.prompt_logprobs >= 0 && prompt_logprobs_next_ <= prompt_positions);
  g.set_prompt_top_logprobs(std::max(0, request_.prompt_logprobs));
  if (request_.pop.control()) {
    // The decode worker runs the control's plans on its rows, whoever prefilled the prompt.
    v1::PopControlSpec& pc = *g.mutable_pop_control();
    pc.set_variant(PopVariantName(request_.pop.variant));
    pc.set_ratio(request_.pop.ratio);
    pc.set_prompt_tokens(static_cast<int>(prompt_.size()));
  }
  grpc::ClientContext* context = NextContext(Phase::kGenerating);
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
  if (ev.prompt_logprobs_size() > 0 && !cancelled()) PassPromptLogprobs(ev);
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
      if (ChoiceStream* c = ChoiceOf(ev)) c->tokens.push_back(ev.token());
    }
    if (ChoiceStream* c = ChoiceOf(ev)) c->progress.text_held = ev.text_held();
    GeneratedToken t;
    t.choice = ev.choice();
    t.id = ev.token();
    t.text = ev.text();
    t.logprob = ev.logprob();
    for (const v1::TopLogprob& tl : ev.top_logprobs()) t.top.push_back({tl.token(), tl.logprob()});
    if (callbacks_.on_token) callbacks_.on_token(t);
  }
  if (ev.finish() != v1::FINISH_NONE) {
    if (request_.n == 1) {
      end_seen_ = true;
      end_ = ev;
    } else {
      OnChoiceEnded(ev);
    }
  }
  StartRead(&event_);
}

std::vector<ChoiceProgress> Call::Progress() const {
  std::vector<ChoiceProgress> out;
  for (const ChoiceStream& c : choices_) {
    out.push_back(c.progress);
    out.back().generated = static_cast<int>(c.tokens.size());
  }
  return out;
}

Call::ChoiceStream* Call::ChoiceOf(const v1::GenerateResponse& ev) {
  const int c = ev.choice();
  return c >= 0 && c < static_cast<int>(choices_.size()) ? &choices_[c] : nullptr;
}

void Call::OnChoiceEnded(const v1::GenerateResponse& ev) {
  ++choices_ended_;
  const bool finished = ev.finish() == v1::FINISH_STOP || ev.finish() == v1::FINISH_LENGTH;
  // The worker counts the tokens it streamed; a migrated choice's earlier ones are the call's.
  ChoiceStream* c = ChoiceOf(ev);
  choice_tokens_ += (c != nullptr ? c->carried : 0) + ev.usage().completion_tokens();
  if (c != nullptr) (finished ? c->progress.ended : c->progress.failed) = true;
  if (!choice_failed_) end_ = ev;  // the first failure is what the request reports
  if (!finished) choice_failed_ = true;
  if (finished && !cancelled() && callbacks_.on_choice_end) {
    callbacks_.on_choice_end(ev.choice(), ev.finish() == v1::FINISH_STOP ? "stop" : "length");
  }
  end_seen_ = choices_ended_ >= request_.n;
}

void Call::PassPromptLogprobs(const v1::GenerateResponse& ev) {
  // Positions of the original prompt not passed on yet (a migrated stream's prompt is longer, and
  // its new worker starts over).
  const int n = static_cast<int>(request_.prompt.size());
  std::vector<PromptLogprob> lps;
  for (const v1::PromptLogprob& w : ev.prompt_logprobs()) {
    if (w.position() != prompt_logprobs_next_ || w.position() >= n) continue;
    PromptLogprob p;
    p.position = w.position();
    p.id = w.token();
    p.logprob = w.logprob();
    p.rank = w.rank();
    for (const v1::TopLogprob& t : w.top()) p.top.push_back({t.token(), t.logprob()});
    lps.push_back(std::move(p));
    ++prompt_logprobs_next_;
  }
  if (!lps.empty() && callbacks_.on_prompt_logprobs) callbacks_.on_prompt_logprobs(lps);
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
  }
  StreamEnd end;
  end.end_seen = end_seen_;
  end.finish = end_.finish();
  end.error = end_.error();
  end.status = tripod::FromGrpcStatus(status);
  end.prompt_tokens = static_cast<int>(prompt_.size());
  end.max_tokens = request_.max_tokens;
  end.migrations = migrations_;
  end.choices = Progress();
  NextStep next = AfterStream(end, *decode_, Workers(), dispatcher_->options(), request_id_);
  if (next.mark_failed) decode_->MarkFailed(status.error_message());
  switch (next.kind) {
    case NextStep::Kind::kFinish:
      return Finish(next.finish, nullptr);
    case NextStep::Kind::kMigrate:
      return Migrate(std::move(next.worker), status);
    default:
      if (!next.note.empty()) {
        spdlog::warn("scheduler: request {}: {}; not moved", request_id_, next.note);
      }
      return Finish("error", &next.status);
  }
}

void Call::Migrate(std::shared_ptr<Worker> other, const grpc::Status& status) {
  ++migrations_;
  spdlog::warn(
      "scheduler: request {}: decode worker {} died mid-stream ({}); moving it to {} "
      "after {} tokens ({} of {} choices ended)",
      request_id_, decode_->address(), status.error_message(), other->address(), tokens_,
      choices_ended_, choices_.size());
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
  for (ChoiceStream& c : choices_) c.carried = static_cast<int>(c.tokens.size());
  // The new worker prefills everything itself: the method's report stands as it was.
  trimming_.Clear();
  StartGenerate(0, Route::kMigrated);
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

void Call::FailQueued(const absl::Status& error) { Finish("error", &error); }

void Call::Finish(const std::string& finish, const absl::Status* error) {
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
  if (request_.n > 1) {
    // Every candidate's tokens (best_of's too, as vLLM counts them); the prompt once.
    end.usage.completion_tokens = end_seen_ ? choice_tokens_ : tokens_;
  } else {
    end.usage.completion_tokens =
        end_seen_ ? choices_[0].carried + end_.usage().completion_tokens() : tokens_;
  }
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
