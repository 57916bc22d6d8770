// The routing rules of route_plan.h, one table per rule: each row a situation (the request, the
// healthy workers, the options) and the plan or next step expected. Workers are recorded Health
// answers, no processes.
#include "scheduler/route_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "scheduler/request_status.h"

namespace tripod::scheduler {
namespace {

// A decode worker whose last Health said `load` running and `free_blocks` free of 16 tokens.
std::shared_ptr<Worker> Decode(const std::string& address, int load = 0, int free_blocks = 900) {
  auto w = std::make_shared<Worker>(address, v1::ROLE_DECODE);
  v1::HealthResponse h;
  h.set_role(v1::ROLE_DECODE);
  h.set_running(load);
  h.set_free_kv_blocks(free_blocks);
  h.set_total_kv_blocks(1000);
  h.set_block_tokens(16);
  EXPECT_TRUE(w->RecordCheck(true, h, "", 2));
  return w;
}

// A prefill worker of a 30-layer model: full weights, or pruned to skip its last `pruned`.
std::shared_ptr<Worker> Prefill(const std::string& address, int load = 0, int pruned = 0,
                                int n_layers = 30) {
  auto w = std::make_shared<Worker>(address, v1::ROLE_PREFILL);
  v1::HealthResponse h;
  h.set_role(v1::ROLE_PREFILL);
  h.set_running(load);
  h.mutable_model()->set_n_layers(n_layers);
  h.set_full_weights(pruned == 0);
  for (int l = n_layers - pruned; l < n_layers; ++l) h.add_skipped_layers(l);
  h.set_plan_key(7);
  EXPECT_TRUE(w->RecordCheck(true, h, "", 2));
  return w;
}

std::string Address(const std::shared_ptr<Worker>& w) { return w ? w->address() : ""; }

TEST(RoutePlanTest, RouteNames) {
  const struct {
    Route route;
    std::string name;
  } cases[] = {
      {Route::kDecodeOnly, "decode_only"},         {Route::kDisaggregated, "disaggregated"},
      {Route::kRetriedPrefill, "retried_prefill"}, {Route::kRetriedDecode, "retried_decode"},
      {Route::kLocalFallback, "local_fallback"},   {Route::kMigrated, "migrated"}};
  for (const auto& c : cases) EXPECT_EQ(RouteName(c.route), c.name);
}

TEST(RoutePlanTest, PopRatio) {
  const struct {
    PopChoice::Kind kind;
    std::string ratio, default_pop, expected;
  } cases[] = {
      {PopChoice::Kind::kOff, "", "1/4", "0"},
      {PopChoice::Kind::kOn, "", "", "1/3"},       // --pop empty: "on" is pop_on
      {PopChoice::Kind::kOn, "", "0.25", "0.25"},  // else the scheduler's --pop
      {PopChoice::Kind::kRatio, "0.5", "1/4", "0.5"},
      {PopChoice::Kind::kDefault, "", "", ""},  // the workers' own plan
      {PopChoice::Kind::kDefault, "", "1/4", "1/4"},
  };
  for (const auto& c : cases) {
    DispatcherOptions o;
    o.default_pop = c.default_pop;
    EXPECT_EQ(PopRatioFor(PopChoice{c.kind, c.ratio}, o), c.expected)
        << static_cast<int>(c.kind) << " " << c.default_pop;
  }
}

TEST(RoutePlanTest, FirstRoute) {
  auto busy = Decode("d:busy", 5), idle = Decode("d:idle", 0);
  auto prefill = Prefill("p:1");
  const struct {
    std::string name;
    int prompt_tokens, direct_threshold;
    WorkerSnapshot workers;
    PopChoice pop;
    absl::StatusCode code;
    std::string decode;
    Route route;
    std::string ratio;
    bool prompt_logprobs = false;  // the request asks for its prompt's log-probabilities
  } cases[] = {
      {"no decode worker",
       100,
       32,
       {{}, {prefill}, {}},
       {},
       absl::StatusCode::kUnavailable,
       "",
       Route::kDecodeOnly,
       ""},
      {"long prompt",
       100,
       32,
       {{busy, idle}, {prefill}, {}},
       {},
       absl::StatusCode::kOk,
       "d:idle",
       Route::kDisaggregated,
       ""},
      {"at the threshold",
       32,
       32,
       {{idle}, {prefill}, {}},
       {},
       absl::StatusCode::kOk,
       "d:idle",
       Route::kDisaggregated,
       ""},
      {"below the threshold",
       31,
       32,
       {{idle}, {prefill}, {}},
       {},
       absl::StatusCode::kOk,
       "d:idle",
       Route::kDecodeOnly,
       ""},
      {"one token has no KV to move",
       1,
       0,
       {{idle}, {prefill}, {}},
       {},
       absl::StatusCode::kOk,
       "d:idle",
       Route::kDecodeOnly,
       ""},
      {"two tokens with no threshold",
       2,
       0,
       {{idle}, {prefill}, {}},
       {},
       absl::StatusCode::kOk,
       "d:idle",
       Route::kDisaggregated,
       ""},
      {"no prefill worker",
       100,
       32,
       {{idle}, {}, {}},
       {},
       absl::StatusCode::kOk,
       "d:idle",
       Route::kDecodeOnly,
       ""},
      {"POP off asked",
       100,
       32,
       {{idle}, {prefill}, {}},
       {PopChoice::Kind::kOff, ""},
       absl::StatusCode::kOk,
       "d:idle",
       Route::kDisaggregated,
       "0"},
      // Prompt log-probabilities: the decode worker prefills the whole prompt with its full plan,
      // whatever the length and whoever could prefill it.
      {"prompt logprobs: a long prompt stays on the decode worker",
       100,
       32,
       {{busy, idle}, {prefill}, {}},
       {},
       absl::StatusCode::kOk,
       "d:idle",
       Route::kDecodeOnly,
       "",
       true},
      {"prompt logprobs with POP off asked",
       100,
       32,
       {{idle}, {prefill}, {}},
       {PopChoice::Kind::kOff, ""},
       absl::StatusCode::kOk,
       "d:idle",
       Route::kDecodeOnly,
       "",
       true},
      {"prompt logprobs under a scheduler default of POP 1/3",
       5000,
       0,
       {{idle}, {prefill}, {}},
       {PopChoice::Kind::kDefault, ""},
       absl::StatusCode::kOk,
       "d:idle",
       Route::kDecodeOnly,
       "",
       true},
      {"prompt logprobs without a decode worker",
       100,
       32,
       {{}, {prefill}, {}},
       {},
       absl::StatusCode::kUnavailable,
       "",
       Route::kDecodeOnly,
       "",
       true},
  };
  for (const auto& c : cases) {
    DispatcherOptions o;
    o.direct_prefill_tokens = c.direct_threshold;
    const RoutePlan p = PlanRoute(c.prompt_tokens, c.pop, c.workers, o, 0, c.prompt_logprobs);
    EXPECT_EQ(p.status.code(), c.code) << c.name;
    EXPECT_EQ(Address(p.decode), c.decode) << c.name;
    if (!p.status.ok()) {
      EXPECT_EQ(ErrorCode(p.status), "no_workers") << c.name;
      continue;
    }
    EXPECT_EQ(p.route, c.route) << c.name;
    EXPECT_EQ(p.pop_ratio, c.ratio) << c.name;
  }
  EXPECT_TRUE(CheckDecodeWorkers({{idle}, {}, {}}).ok());
  EXPECT_EQ(HttpStatusOf(CheckDecodeWorkers({})), 503);
}

TEST(RoutePlanTest, PrefillChoice) {
  auto full = Prefill("p:full", 3), pruned = Prefill("p:pruned", 0, 10);  // skips 1/3
  const struct {
    std::string name;
    std::vector<std::shared_ptr<Worker>> prefill;
    bool exclude_full;
    std::string ratio;
    std::string chosen;
    Route fallback;
  } cases[] = {
      {"least loaded that runs the plan",
       {full, pruned},
       false,
       "1/3",
       "p:pruned",
       Route::kDecodeOnly},
      {"a pruned worker cannot run POP off",
       {full, pruned},
       false,
       "0",
       "p:full",
       Route::kDecodeOnly},
      {"none runs the plan: decode-only", {pruned}, false, "0", "", Route::kDecodeOnly},
      {"none left on a retry: local fallback", {full}, true, "", "", Route::kLocalFallback},
      {"the failed worker is skipped", {full, pruned}, true, "", "p:pruned", Route::kLocalFallback},
  };
  for (const auto& c : cases) {
    const PrefillChoice p =
        ChoosePrefill({{}, c.prefill, {}}, c.exclude_full ? full.get() : nullptr, c.ratio, 0);
    EXPECT_EQ(Address(p.prefill), c.chosen) << c.name;
    EXPECT_EQ(p.fallback, c.fallback) << c.name;
  }
}

TEST(RoutePlanTest, MethodStep) {
  const struct {
    DraftMethod method;
    int budget_tokens;
    double fraction;
    int prompt_tokens;
    MethodStep step;
    int budget;
    int min_kept = 0;
  } cases[] = {
      {DraftMethod::kNone, 0, 0, 100, MethodStep::kNone, 0},
      {DraftMethod::kSpecKv, 50, 0, 100, MethodStep::kDraft, 50},
      {DraftMethod::kSpecKv, 99, 0, 100, MethodStep::kKeepsAll, 99},  // all n - 1 entries
      {DraftMethod::kDraftMap, 10, 0, 100, MethodStep::kDraft, 10},
      {DraftMethod::kSpecPc, 99, 0, 100, MethodStep::kDraft, 99},  // drops one prompt token
      {DraftMethod::kSpecPc, 100, 0, 100, MethodStep::kKeepsAll, 100},
      {DraftMethod::kSnapKv, 0, 0.5, 100, MethodStep::kLocal, 50},
      {DraftMethod::kPyramidKv, 30, 0, 100, MethodStep::kLocal, 30},
      {DraftMethod::kKeepLast, 40, 0, 100, MethodStep::kLocal, 40},
      // A prompt within the floor runs as without the method; a longer one keeps the floor.
      {DraftMethod::kSpecPc, 0, 0.25, 100, MethodStep::kKeepsAll, 100, 512},
      {DraftMethod::kSpecKv, 0, 0.25, 512, MethodStep::kKeepsAll, 512, 512},
      {DraftMethod::kSpecKv, 0, 0.25, 600, MethodStep::kDraft, 512, 512},
      {DraftMethod::kSnapKv, 0, 0.25, 4096, MethodStep::kLocal, 1024, 512},
      {DraftMethod::kSnapKv, 20, 0, 100, MethodStep::kLocal, 20, 512},
  };
  for (const auto& c : cases) {
    const MethodPlan p = PlanMethod(MethodChoice{c.method, c.budget_tokens, c.fraction},
                                    c.prompt_tokens, c.min_kept);
    EXPECT_EQ(p.step, c.step) << DraftMethodName(c.method) << " " << c.budget_tokens;
    EXPECT_EQ(p.budget, c.budget) << DraftMethodName(c.method) << " " << c.budget_tokens;
  }
}

TEST(RoutePlanTest, TheDraftDeadlineGrowsWithThePrompt) {
  using std::chrono::milliseconds;
  EXPECT_EQ(DraftDeadline(milliseconds(30000), 0), milliseconds(30000));
  EXPECT_EQ(DraftDeadline(milliseconds(30000), 130), milliseconds(30000));
  EXPECT_EQ(DraftDeadline(milliseconds(30000), 4096), milliseconds(30000));
  EXPECT_EQ(DraftDeadline(milliseconds(30000), 4097), milliseconds(60000));
  EXPECT_EQ(DraftDeadline(milliseconds(30000), 16384), milliseconds(120000));
}

TEST(RoutePlanTest, DraftFailure) {
  const struct {
    absl::Status status;
    std::string why;
    bool mark_failed;
  } cases[] = {
      {absl::DeadlineExceededError("deadline"), "draft worker r:1: timed out", false},
      {absl::UnavailableError("connection refused"), "draft worker r:1: connection refused", true},
      {absl::InvalidArgumentError("bad prompt"), "draft worker r:1: bad prompt", false},
  };
  for (const auto& c : cases) {
    const DraftFailure f = AfterDraftFailed(c.status, "r:1");
    EXPECT_EQ(f.why, c.why);
    EXPECT_EQ(f.mark_failed, c.mark_failed) << c.why;
  }
}

TEST(RoutePlanTest, KvReservation) {
  auto layered = Prefill("p:1"), silent = Prefill("p:2", 0, 0, /*n_layers=*/0);
  v1::Trimming none, snap, pyramid;
  snap.set_method(v1::TRIM_SNAPKV);
  pyramid.set_method(v1::TRIM_PYRAMIDKV);
  pyramid.set_budget(40);
  pyramid.set_window(8);
  const struct {
    std::string name;
    const v1::Trimming* trimming;
    int kv_entries;
    std::shared_ptr<Worker> prefill;
    int kv_slots;  // -1: the per-layer maximum
    bool per_layer;
    bool fallback;
  } cases[] = {
      {"untrimmed", &none, 0, layered, 0, false, false},
      {"trimmed to a count", &snap, 40, layered, 40, false, false},
      {"PyramidKV per layer", &pyramid, 40, layered, -1, true, false},
      {"PyramidKV without a layer count falls back", &pyramid, 40, silent, 0, false, true},
  };
  for (const auto& c : cases) {
    const KvPlan p = PlanKv(*c.trimming, c.kv_entries, 200, *c.prefill);
    EXPECT_EQ(!p.fallback.empty(), c.fallback) << c.name;
    EXPECT_EQ(!p.layer_budgets.empty(), c.per_layer) << c.name;
    if (c.per_layer) {
      ASSERT_EQ(p.layer_budgets.size(), 30u) << c.name;
      ASSERT_EQ(p.layer_first_slot.size(), 30u) << c.name;
      const int most = *std::max_element(p.layer_budgets.begin(), p.layer_budgets.end());
      EXPECT_EQ(p.kv_slots, most) << c.name;
      EXPECT_GT(p.layer_budgets.front(), p.layer_budgets.back()) << "a pyramid: " << c.name;
      for (size_t l = 0; l < 30; ++l) {
        EXPECT_EQ(p.layer_first_slot[l] + p.layer_budgets[l], most) << c.name << " layer " << l;
      }
    } else {
      EXPECT_EQ(p.kv_slots, c.kv_slots) << c.name;
      EXPECT_TRUE(p.layer_first_slot.empty()) << c.name;
    }
  }
}

TEST(RoutePlanTest, KvBytesSaved) {
  const struct {
    int64_t sent;
    int prompt_tokens, kv_entries;
    int64_t saved;
  } cases[] = {
      {1000, 101, 10, 9000},  // 100 slots' worth, 10 sent
      {1000, 11, 10, 0},      // everything sent
      {1000, 101, 0, 0},      // untrimmed
  };
  for (const auto& c : cases) {
    EXPECT_EQ(KvBytesSaved(c.sent, c.prompt_tokens, c.kv_entries), c.saved)
        << c.sent << " " << c.prompt_tokens << " " << c.kv_entries;
  }
}

TEST(RoutePlanTest, AfterReserveFailed) {
  auto failed = Decode("d:failed"), other = Decode("d:other");
  const struct {
    std::string name;
    absl::Status status;
    int decode_attempts;
    std::vector<std::shared_ptr<Worker>> decode;
    NextStep::Kind kind;
    Route route;
    std::string worker;
    bool mark_failed;
  } cases[] = {
      {"gone: another decode worker",
       absl::UnavailableError("refused"),
       0,
       {failed, other},
       NextStep::Kind::kReserveAgain,
       Route::kRetriedDecode,
       "d:other",
       true},
      {"silent: another, not marked",
       absl::DeadlineExceededError("slow"),
       0,
       {failed, other},
       NextStep::Kind::kReserveAgain,
       Route::kRetriedDecode,
       "d:other",
       false},
      {"gone twice: prefills there",
       absl::UnavailableError("refused"),
       1,
       {failed, other},
       NextStep::Kind::kLocalPrefill,
       Route::kLocalFallback,
       "",
       true},
      {"gone, no other",
       absl::UnavailableError("refused"),
       0,
       {failed},
       NextStep::Kind::kLocalPrefill,
       Route::kLocalFallback,
       "",
       true},
      {"no room: prefills there",
       absl::ResourceExhaustedError("no blocks"),
       0,
       {failed, other},
       NextStep::Kind::kLocalPrefill,
       Route::kLocalFallback,
       "",
       false},
  };
  for (const auto& c : cases) {
    const NextStep n =
        AfterReserveFailed(c.status, *failed, c.decode_attempts, 100, {c.decode, {}, {}}, 0);
    EXPECT_EQ(n.kind, c.kind) << c.name;
    EXPECT_EQ(n.route, c.route) << c.name;
    EXPECT_EQ(Address(n.worker), c.worker) << c.name;
    EXPECT_EQ(n.mark_failed, c.mark_failed) << c.name;
  }
}

TEST(RoutePlanTest, AfterPrefillFailed) {
  auto failed = Prefill("p:failed"), other = Prefill("p:other"),
       pruned = Prefill("p:pruned", 0, 10);
  const struct {
    std::string name;
    absl::Status status;
    int attempts;
    std::vector<std::shared_ptr<Worker>> prefill;
    std::string ratio;
    NextStep::Kind kind;
    Route route;
    std::string worker;
    bool mark_failed;
  } cases[] = {
      {"gone: another prefill worker",
       absl::UnavailableError("refused"),
       1,
       {failed, other},
       "",
       NextStep::Kind::kPrefillOn,
       Route::kRetriedPrefill,
       "p:other",
       true},
      {"failed: another, not marked",
       absl::InternalError("oops"),
       1,
       {failed, other},
       "",
       NextStep::Kind::kPrefillOn,
       Route::kRetriedPrefill,
       "p:other",
       false},
      {"second failure: the decode worker",
       absl::UnavailableError("refused"),
       2,
       {failed, other},
       "",
       NextStep::Kind::kLocalPrefill,
       Route::kLocalFallback,
       "",
       true},
      {"no other: the decode worker",
       absl::InternalError("oops"),
       1,
       {failed},
       "",
       NextStep::Kind::kLocalPrefill,
       Route::kLocalFallback,
       "",
       false},
      {"the other cannot run the plan",
       absl::InternalError("oops"),
       1,
       {failed, pruned},
       "0",
       NextStep::Kind::kLocalPrefill,
       Route::kLocalFallback,
       "",
       false},
  };
  for (const auto& c : cases) {
    const NextStep n =
        AfterPrefillFailed(c.status, *failed, c.attempts, c.ratio, {{}, c.prefill, {}}, 0);
    EXPECT_EQ(n.kind, c.kind) << c.name;
    EXPECT_EQ(n.route, c.route) << c.name;
    EXPECT_EQ(Address(n.worker), c.worker) << c.name;
    EXPECT_EQ(n.mark_failed, c.mark_failed) << c.name;
  }
}

TEST(RoutePlanTest, AfterStream) {
  auto dead = Decode("d:dead");
  // 7 blocks of 16 tokens hold the 100-token prompt, not the prompt and the 20 tokens streamed.
  auto roomy = Decode("d:roomy", 5, 900), small = Decode("d:small", 0, 7);
  const absl::Status gone = absl::UnavailableError("socket closed");
  StreamEnd base;
  base.prompt_tokens = 100;
  base.choices = {ChoiceProgress{20}};
  base.max_tokens = 64;
  // n = 3: choice 0 ended, 1 and 2 still going; 2 the longest, whose 30 tokens do not fit
  // d:small beside the prompt (choice 1's 5 would).
  auto three = [](StreamEnd& e) {
    e.choices = {ChoiceProgress{12, true}, ChoiceProgress{5}, ChoiceProgress{30}};
  };
  auto with = [&](auto change) {
    StreamEnd e = base;
    change(e);
    return e;
  };
  const struct {
    std::string name;
    StreamEnd end;
    int migration_limit;
    std::vector<std::shared_ptr<Worker>> decode;
    NextStep::Kind kind;
    std::string finish;
    absl::StatusCode code;
    std::string error_code;
    std::string worker;
    bool mark_failed;
  } cases[] = {
      {"stop",
       with([](StreamEnd& e) { e.end_seen = true, e.finish = v1::FINISH_STOP; }),
       1,
       {},
       NextStep::Kind::kFinish,
       "stop",
       absl::StatusCode::kOk,
       "",
       "",
       false},
      {"length",
       with([](StreamEnd& e) { e.end_seen = true, e.finish = v1::FINISH_LENGTH; }),
       1,
       {},
       NextStep::Kind::kFinish,
       "length",
       absl::StatusCode::kOk,
       "",
       "",
       false},
      {"the worker cancelled it",
       with([](StreamEnd& e) { e.end_seen = true, e.finish = v1::FINISH_CANCELLED; }),
       1,
       {},
       NextStep::Kind::kGiveUp,
       "",
       absl::StatusCode::kUnavailable,
       "worker_cancelled",
       "",
       false},
      {"the worker failed",
       with([](StreamEnd& e) { e.end_seen = true, e.finish = v1::FINISH_ERROR; }),
       1,
       {},
       NextStep::Kind::kGiveUp,
       "",
       absl::StatusCode::kInternal,
       "",
       "",
       false},
      {"ended without a finish",
       base,
       1,
       {small},
       NextStep::Kind::kGiveUp,
       "",
       absl::StatusCode::kInternal,
       "",
       "",
       false},
      {"the client's mistake",
       with([](StreamEnd& e) { e.status = absl::InvalidArgumentError("bad sampling"); }),
       1,
       {small},
       NextStep::Kind::kGiveUp,
       "",
       absl::StatusCode::kInvalidArgument,
       "",
       "",
       false},
      {"overloaded",
       with([](StreamEnd& e) { e.status = absl::ResourceExhaustedError("full"); }),
       1,
       {small},
       NextStep::Kind::kGiveUp,
       "",
       absl::StatusCode::kUnavailable,
       "worker_unavailable",
       "",
       false},
      {"died: migrates where prompt and output fit",
       with([&](StreamEnd& e) { e.status = gone; }),
       1,
       {dead, small, roomy},
       NextStep::Kind::kMigrate,
       "",
       absl::StatusCode::kOk,
       "",
       "d:roomy",
       true},
      {"died past the migration limit",
       with([&](StreamEnd& e) { e.status = gone, e.migrations = 1; }),
       1,
       {dead, roomy},
       NextStep::Kind::kGiveUp,
       "",
       absl::StatusCode::kUnavailable,
       "worker_unavailable",
       "",
       true},
      {"died holding text back",
       with([&](StreamEnd& e) { e.status = gone, e.choices[0].text_held = true; }),
       1,
       {dead, roomy},
       NextStep::Kind::kGiveUp,
       "",
       absl::StatusCode::kUnavailable,
       "worker_unavailable",
       "",
       true},
      {"died generating several choices: each unfinished one moves",
       with([&](StreamEnd& e) { e.status = gone, three(e); }),
       1,
       {dead, small, roomy},
       NextStep::Kind::kMigrate,
       "",
       absl::StatusCode::kOk,
       "",
       "d:roomy",
       true},
      {"several choices, one holding text back: not moved",
       with([&](StreamEnd& e) { e.status = gone, three(e), e.choices[2].text_held = true; }),
       1,
       {dead, roomy},
       NextStep::Kind::kGiveUp,
       "",
       absl::StatusCode::kUnavailable,
       "worker_unavailable",
       "",
       true},
      {"several choices, an ended one's held text does not count",
       with([&](StreamEnd& e) { e.status = gone, three(e), e.choices[0].text_held = true; }),
       1,
       {dead, roomy},
       NextStep::Kind::kMigrate,
       "",
       absl::StatusCode::kOk,
       "",
       "d:roomy",
       true},
      {"several choices, one had failed: not moved",
       with([&](StreamEnd& e) { e.status = gone, three(e), e.choices[1].failed = true; }),
       1,
       {dead, roomy},
       NextStep::Kind::kGiveUp,
       "",
       absl::StatusCode::kUnavailable,
       "worker_unavailable",
       "",
       true},
      {"several choices, the longest fits the less loaded worker",
       with([&](StreamEnd& e) { e.status = gone, three(e), e.choices[2].generated = 10; }),
       1,
       {dead, small, roomy},
       NextStep::Kind::kMigrate,
       "",
       absl::StatusCode::kOk,
       "",
       "d:small",
       true},
      {"several choices, past the migration limit",
       with([&](StreamEnd& e) { e.status = gone, three(e), e.migrations = 1; }),
       1,
       {dead, roomy},
       NextStep::Kind::kGiveUp,
       "",
       absl::StatusCode::kUnavailable,
       "worker_unavailable",
       "",
       true},
      {"several choices, a second move within the limit",
       with([&](StreamEnd& e) { e.status = gone, three(e), e.migrations = 1; }),
       2,
       {dead, roomy},
       NextStep::Kind::kMigrate,
       "",
       absl::StatusCode::kOk,
       "",
       "d:roomy",
       true},
      {"died with no tokens left",
       with([&](StreamEnd& e) { e.status = gone, e.choices[0].generated = 64; }),
       1,
       {dead, roomy},
       NextStep::Kind::kGiveUp,
       "",
       absl::StatusCode::kUnavailable,
       "worker_unavailable",
       "",
       true},
      {"died, no other decode worker",
       with([&](StreamEnd& e) { e.status = gone; }),
       1,
       {dead},
       NextStep::Kind::kGiveUp,
       "",
       absl::StatusCode::kUnavailable,
       "worker_unavailable",
       "",
       true},
  };
  for (const auto& c : cases) {
    DispatcherOptions o;
    o.migration_limit = c.migration_limit;
    const NextStep n = AfterStream(c.end, *dead, {c.decode, {}, {}}, o, 0);
    EXPECT_EQ(n.kind, c.kind) << c.name;
    EXPECT_EQ(n.finish, c.finish) << c.name;
    EXPECT_EQ(n.status.code(), c.code) << c.name << ": " << n.status;
    EXPECT_EQ(ErrorCode(n.status), c.error_code) << c.name;
    EXPECT_EQ(Address(n.worker), c.worker) << c.name;
    EXPECT_EQ(n.mark_failed, c.mark_failed) << c.name;
    if (n.kind == NextStep::Kind::kMigrate) {
      EXPECT_EQ(n.route, Route::kMigrated) << c.name;
    }
  }
  const NextStep held =
      AfterStream(with([&](StreamEnd& e) { e.status = gone, e.choices[0].text_held = true; }),
                  *dead, {{dead, roomy}, {}, {}}, DispatcherOptions{}, 0);
  EXPECT_NE(held.note.find("holding text back"), std::string::npos) << held.note;
  const NextStep choice = AfterStream(
      with([&](StreamEnd& e) { e.status = gone, three(e), e.choices[2].text_held = true; }), *dead,
      {{dead, roomy}, {}, {}}, DispatcherOptions{}, 0);
  EXPECT_NE(choice.note.find("text back of choice 2"), std::string::npos) << choice.note;
}

TEST(RoutePlanTest, ChoicesToResume) {
  const ChoiceProgress going{5}, ended{7, true}, failed{3, false, true}, fresh{0};
  const struct {
    std::string name;
    std::vector<ChoiceProgress> choices;
    int max_tokens, min_tokens;
    std::vector<std::vector<int>> want;  // {choice, generated, max_tokens, min_tokens}
  } cases[] = {
      {"one choice", {going}, 16, 0, {{0, 5, 11, 0}}},
      {"one choice before its first token", {fresh}, 16, 4, {{0, 0, 16, 4}}},
      {"min_tokens partly out", {going}, 16, 8, {{0, 5, 11, 3}}},
      {"min_tokens all out", {going}, 16, 2, {{0, 5, 11, 0}}},
      {"ended choices stay ended",
       {ended, going, ended, fresh},
       10,
       0,
       {{1, 5, 5, 0}, {3, 0, 10, 0}}},
      {"a failed choice is not resumed", {failed, going}, 10, 6, {{1, 5, 5, 1}}},
      {"every choice ended", {ended, ended}, 10, 0, {}},
  };
  for (const auto& c : cases) {
    std::vector<std::vector<int>> got;
    for (const ChoiceResume& r : ChoicesToResume(c.choices, c.max_tokens, c.min_tokens)) {
      got.push_back({r.choice, r.generated, r.max_tokens, r.min_tokens});
    }
    EXPECT_EQ(got, c.want) << c.name;
  }
}

// What the front ends make of the core's statuses.
TEST(RequestStatusTest, ApiErrors) {
  const struct {
    absl::Status status;
    int http;
    std::string type, code;
  } cases[] = {
      {absl::InvalidArgumentError("bad"), 400, "invalid_request_error", ""},
      {WithErrorCode(absl::ResourceExhaustedError("busy"), "server_busy"), 429, "rate_limit_error",
       "server_busy"},
      {WithErrorCode(absl::UnavailableError("none"), "no_workers"), 503, "server_error",
       "no_workers"},
      {absl::InternalError("oops"), 500, "server_error", ""},
      {WorkerFailure("decode worker d:1", absl::OutOfRangeError("too long")), 400,
       "invalid_request_error", ""},
      {WorkerFailure("decode worker d:1", absl::DeadlineExceededError("late")), 503, "server_error",
       "worker_unavailable"},
      {WorkerFailure("decode worker d:1", absl::DataLossError("?")), 500, "server_error", ""},
  };
  for (const auto& c : cases) {
    const ApiError e = ToApiError(c.status);
    EXPECT_EQ(e.http_status, c.http) << c.status;
    EXPECT_EQ(e.type, c.type) << c.status;
    EXPECT_EQ(e.code, c.code) << c.status;
    EXPECT_EQ(e.message, std::string(c.status.message()));
  }
  EXPECT_EQ(ToApiError(WorkerFailure("decode worker d:1", absl::InternalError("x"))).message,
            "decode worker d:1: x");
}

}  // namespace
}  // namespace tripod::scheduler
