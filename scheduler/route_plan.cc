#include "scheduler/route_plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/kv/pyramid_budgets.h"
#include "scheduler/draft_methods.h"
#include "scheduler/request_status.h"
#include "scheduler/router.h"

namespace tripod::scheduler {

const char* RouteName(Route route) {
  switch (route) {
    case Route::kDecodeOnly:
      return "decode_only";
    case Route::kDisaggregated:
      return "disaggregated";
    case Route::kRetriedPrefill:
      return "retried_prefill";
    case Route::kRetriedDecode:
      return "retried_decode";
    case Route::kLocalFallback:
      return "local_fallback";
    case Route::kMigrated:
      return "migrated";
  }
  return "unknown";
}

WorkerSnapshot SnapshotOf(const WorkerRegistry& registry) {
  return {registry.Healthy(v1::ROLE_DECODE), registry.Healthy(v1::ROLE_PREFILL),
          registry.Healthy(v1::ROLE_DRAFT)};
}

absl::Status CheckDecodeWorkers(const WorkerSnapshot& workers) {
  if (!workers.decode.empty()) return absl::OkStatus();
  return WithErrorCode(absl::UnavailableError("no decode worker is available"), "no_workers");
}

MethodPlan PlanMethod(const MethodChoice& method, int prompt_tokens, int min_kept) {
  MethodPlan plan;
  if (method.method == DraftMethod::kNone) return plan;
  plan.budget = ResolveBudget(method, prompt_tokens, min_kept);
  if (BudgetKeepsAll(method.method, plan.budget, prompt_tokens)) {
    plan.step = MethodStep::kKeepsAll;
  } else {
    plan.step = NeedsDraft(method.method) ? MethodStep::kDraft : MethodStep::kLocal;
  }
  return plan;
}

std::chrono::milliseconds DraftDeadline(std::chrono::milliseconds per_4096, int64_t tokens) {
  const int64_t blocks = std::max<int64_t>(1, (tokens + 4095) / 4096);
  return per_4096 * blocks;
}

DraftFailure AfterDraftFailed(const absl::Status& status, const std::string& draft_address) {
  DraftFailure f;
  f.mark_failed = absl::IsUnavailable(status);
  f.why = absl::StrCat("draft worker ", draft_address, ": ",
                       absl::IsDeadlineExceeded(status) ? "timed out" : status.message());
  return f;
}

std::string PopRatioFor(const PopChoice& pop, const DispatcherOptions& options) {
  switch (pop.kind) {
    case PopChoice::Kind::kOff:
      return "0";
    case PopChoice::Kind::kOn:
      return options.default_pop.empty() ? options.pop_on : options.default_pop;
    case PopChoice::Kind::kRatio:
      return pop.ratio;
    case PopChoice::Kind::kDefault:
      return options.default_pop;
  }
  return options.default_pop;
}

RoutePlan PlanRoute(int prompt_tokens, const PopChoice& pop, const WorkerSnapshot& workers,
                    const DispatcherOptions& options, uint64_t rotation, bool full_prompt_logits) {
  RoutePlan plan;
  plan.decode = PickDecode(workers.decode, prompt_tokens, rotation);
  if (plan.decode == nullptr) {
    plan.status = CheckDecodeWorkers(WorkerSnapshot{});
    return plan;
  }
  // A prompt of one token has no KV to move; short ones prefill faster where they decode.
  const bool direct = prompt_tokens < std::max(2, options.direct_prefill_tokens);
  if (direct || workers.prefill.empty() || full_prompt_logits) return plan;
  plan.route = Route::kDisaggregated;
  plan.pop_ratio = PopRatioFor(pop, options);
  return plan;
}

PrefillChoice ChoosePrefill(const WorkerSnapshot& workers, const Worker* exclude,
                            const std::string& pop_ratio, uint64_t rotation) {
  PrefillChoice c;
  c.prefill = PickPrefill(workers.prefill, exclude, pop_ratio, rotation);
  c.fallback = exclude == nullptr ? Route::kDecodeOnly : Route::kLocalFallback;
  return c;
}

KvPlan PlanKv(const v1::Trimming& trimming, int kv_entries, int prompt_tokens,
              const Worker& prefill) {
  KvPlan plan;
  plan.kv_slots = kv_entries;
  if (trimming.method() != v1::TRIM_PYRAMIDKV) return plan;
  const int n_layers = prefill.last_health().model().n_layers();
  if (n_layers < 1) {
    plan.kv_slots = 0;
    plan.fallback = absl::StrCat("prefill worker ", prefill.address(),
                                 " did not report its model's layer count");
    return plan;
  }
  const std::vector<int> budgets =
      PyramidLayerBudgets(trimming.budget(), trimming.window(), n_layers, prompt_tokens - 1);
  if (budgets.empty()) return plan;
  plan.layer_budgets.assign(budgets.begin(), budgets.end());
  plan.kv_slots = *std::max_element(budgets.begin(), budgets.end());
  for (int b : budgets) plan.layer_first_slot.push_back(plan.kv_slots - b);
  return plan;
}

int64_t KvBytesSaved(int64_t bytes_sent, int prompt_tokens, int kv_entries) {
  if (kv_entries <= 0) return 0;
  const int64_t full = static_cast<int64_t>(static_cast<double>(bytes_sent) *
                                            (static_cast<double>(prompt_tokens) - 1) / kv_entries);
  return full - bytes_sent;
}

namespace {

// Onto `other` (kind, route) when there is one; else the decode worker prefills the prompt.
NextStep OntoOtherOrLocal(std::shared_ptr<Worker> other, NextStep::Kind kind, Route route,
                          bool mark_failed) {
  NextStep next;
  next.mark_failed = mark_failed;
  next.kind = other != nullptr ? kind : NextStep::Kind::kLocalPrefill;
  next.route = other != nullptr ? route : Route::kLocalFallback;
  next.worker = std::move(other);
  return next;
}

}  // namespace

NextStep AfterReserveFailed(const absl::Status& status, const Worker& decode, int decode_attempts,
                            int prompt_tokens, const WorkerSnapshot& workers, uint64_t rotation) {
  // The decode worker gone or not answering, with nothing of the request there yet: another
  // decode worker takes it (once) rather than the request failing. No room for the transferred
  // KV: the decode worker prefills the prompt itself (its engine queues the request until
  // blocks free up).
  const bool gone = absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status);
  std::shared_ptr<Worker> other = gone && decode_attempts == 0
                                      ? PickDecode(workers.decode, prompt_tokens, rotation, &decode)
                                      : nullptr;
  return OntoOtherOrLocal(std::move(other), NextStep::Kind::kReserveAgain, Route::kRetriedDecode,
                          absl::IsUnavailable(status));
}

NextStep AfterPrefillFailed(const absl::Status& status, const Worker& prefill, int prefill_attempts,
                            const std::string& pop_ratio, const WorkerSnapshot& workers,
                            uint64_t rotation) {
  std::shared_ptr<Worker> other =
      prefill_attempts == 1 ? PickPrefill(workers.prefill, &prefill, pop_ratio, rotation) : nullptr;
  return OntoOtherOrLocal(std::move(other), NextStep::Kind::kPrefillOn, Route::kRetriedPrefill,
                          absl::IsUnavailable(status));
}

NextStep AfterStream(const StreamEnd& end, const Worker& decode, const WorkerSnapshot& workers,
                     const DispatcherOptions& options, uint64_t rotation) {
  NextStep next;
  if (end.end_seen) {
    switch (end.finish) {
      case v1::FINISH_STOP:
        next.kind = NextStep::Kind::kFinish;
        next.finish = "stop";
        return next;
      case v1::FINISH_LENGTH:
        next.kind = NextStep::Kind::kFinish;
        next.finish = "length";
        return next;
      case v1::FINISH_CANCELLED:
        next.status = WithErrorCode(absl::UnavailableError(absl::StrCat(
                                        "the decode worker ended the request: ", end.error)),
                                    "worker_cancelled");
        return next;
      default:
        next.status = absl::InternalError(absl::StrCat("the decode worker failed: ", end.error));
        return next;
    }
  }
  if (end.status.ok()) {
    next.status = absl::InternalError("the decode worker's stream ended without a finish");
    return next;
  }
  next.status = WorkerFailure(absl::StrCat("decode worker ", decode.address()), end.status);
  if (!absl::IsUnavailable(end.status)) return next;
  // The worker died mid-stream: another continues each unfinished choice from what it streamed,
  // unless the dead one held text back of one (a possible stop string's start, an incomplete
  // character), which is lost.
  next.mark_failed = true;
  if (end.migrations >= options.migration_limit) return next;
  int longest = 0;
  for (size_t c = 0; c < end.choices.size(); ++c) {
    const ChoiceProgress& p = end.choices[c];
    if (p.ended) continue;
    if (p.failed) {
      next.note = absl::StrCat("choice ", c, " had failed before decode worker ", decode.address(),
                               " died");
      return next;
    }
    if (p.text_held) {
      next.note = end.choices.size() == 1
                      ? absl::StrCat("decode worker ", decode.address(), " died holding text back")
                      : absl::StrCat("decode worker ", decode.address(),
                                     " died holding text back of choice ", c);
      return next;
    }
    if (end.max_tokens - p.generated < 1) return next;
    longest = std::max(longest, p.generated);
  }
  next.worker = PickDecode(workers.decode, end.prompt_tokens + longest, rotation, &decode);
  if (next.worker == nullptr) return next;
  next.kind = NextStep::Kind::kMigrate;
  next.route = Route::kMigrated;
  next.status = absl::OkStatus();
  return next;
}

std::vector<ChoiceResume> ChoicesToResume(const std::vector<ChoiceProgress>& choices,
                                          int max_tokens, int min_tokens) {
  std::vector<ChoiceResume> out;
  for (size_t c = 0; c < choices.size(); ++c) {
    const ChoiceProgress& p = choices[c];
    if (p.ended || p.failed) continue;
    ChoiceResume r;
    r.choice = static_cast<int>(c);
    r.generated = p.generated;
    r.max_tokens = max_tokens - p.generated;
    r.min_tokens = std::max(0, min_tokens - p.generated);
    out.push_back(r);
  }
  return out;
}

}  // namespace tripod::scheduler
