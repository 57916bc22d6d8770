#include "eval/longctx_eval.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/compute/max_pool.h"
#include "common/kv/pyramid_budgets.h"
#include "common/model/bundled_model.h"
#include "common/model/gguf.h"
#include "common/util/status_macros.h"
#include "draft_node/specpc.h"
#include "eval/greedy_from_kv.h"
#include "prefill_node/kv_trimming.h"
#include "prefill_node/pop_config.h"

namespace tripod {
namespace {

bool Wants(const std::vector<std::string>& methods, const char* name) {
  return std::find(methods.begin(), methods.end(), name) != methods.end();
}

// Methods that replace the prompt by some of its tokens: their budget counts prompt tokens.
bool CompressesPrompt(const std::string& method) {
  return method == "specpc" || method == "keeplast";
}

// What a transfer of it sends (PyramidKV's padding left out).
int64_t Bytes(const KvSnapshot& kv) { return static_cast<int64_t>(kv.kept_bytes()); }

}  // namespace

const std::vector<std::string>& LongCtxMethodNames() {
  static const std::vector<std::string> names = {"full",   "speckv",    "specpc",       "draftmap",
                                                 "snapkv", "pyramidkv", "streamingllm", "keeplast"};
  return names;
}

absl::StatusOr<std::unique_ptr<LongCtxEvaluator>> LongCtxEvaluator::Create(
    const LongCtxOptions& options) {
  std::unique_ptr<LongCtxEvaluator> e(new LongCtxEvaluator());
  e->options_ = options;
  if (e->options_.model_path.empty()) e->options_.model_path = BundledModelPath();
  const std::string& path = e->options_.model_path;
  ASSIGN_OR_RETURN(e->gguf_, GgufFile::Open(path));
  ASSIGN_OR_RETURN(e->tokenizer_, Tokenizer::FromGguf(*e->gguf_));

  PrefillOptions p;
  p.model_path = path;
  p.precision = options.precision;
  p.backend = options.backend;
  p.chunk = options.chunk;
  ASSIGN_OR_RETURN(p.pop, ParsePopConfig("0", ""));  // full weights: the full plan and POP's
  ASSIGN_OR_RETURN(e->prefill_, PrefillEngine::Create(p));
  ASSIGN_OR_RETURN(const PopConfig pop, ParsePopConfig(options.pop_ratio, ""));
  ASSIGN_OR_RETURN(e->pop_plan_, e->prefill_->PlanFor(pop));

  DraftEngineOptions d;
  if (options.draft_model_path.empty()) {
    d.model_path = path;
    d.self_draft_layers = options.draft_layers;
    d.lookahead_layers = options.lookahead_layers;
  } else {
    d.model_path = options.draft_model_path;
    d.target_model_path = path;
  }
  d.precision = options.precision;
  d.backend = options.backend;
  d.prefill_chunk = options.chunk;
  ASSIGN_OR_RETURN(e->draft_, DraftEngine::Create(d));

  DecodeEngineOptions o;
  o.model_path = path;
  o.precision = options.precision;
  o.backend = options.backend;
  ASSIGN_OR_RETURN(e->decode_, DecodeEngine::Create(o));
  return e;
}

absl::StatusOr<std::string> LongCtxEvaluator::Generate(const std::vector<int32_t>& prompt,
                                                       const KvSnapshot& kv, int max_tokens) {
  ASSIGN_OR_RETURN(const std::vector<int32_t> ids, GreedyFromKv(*decode_, prompt, kv, max_tokens));
  return tokenizer_->Decode(ids);
}

absl::StatusOr<std::vector<LongCtxRow>> LongCtxEvaluator::Evaluate(
    const LongCtxSample& sample, const std::vector<std::string>& methods,
    const std::vector<double>& budgets, const std::vector<bool>& pops) {
  const std::vector<int32_t>& prompt = sample.prompt;
  const int n = static_cast<int>(prompt.size());
  const int m = n - 1;
  const ModelConfig& c = prefill_->model().config;
  const int window = options_.trim_window;

  // The draft's map, once: token scores for SpecPC and the draft map at any budget, and SpecKV's
  // lookahead (greedy, as long as the answer at most).
  DraftResult draft;
  if (Wants(methods, "speckv") || Wants(methods, "specpc") || Wants(methods, "draftmap")) {
    DraftRequest r;
    r.prompt = prompt;
    r.lookahead =
        Wants(methods, "speckv") ? std::min(options_.speckv_lookahead, sample.max_tokens) : 0;
    ASSIGN_OR_RETURN(draft, draft_->Score(r));
  }
  const SpecPcParams specpc;  // the draft worker's defaults
  const std::vector<float> pooled = MaxPool1d(draft.token_scores, specpc.pool_kernel);
  auto draft_keep = [&](int budget) {
    SpecPcParams p = specpc;
    p.budget = budget;
    return SpecPcSelect(pooled, p);
  };

  std::vector<LongCtxRow> rows;
  auto add = [&](const std::string& method, double budget, int budget_tokens, bool pop,
                 const std::vector<int32_t>& p, const KvSnapshot& kv, double prefill_s,
                 double draft_s) -> absl::Status {
    ASSIGN_OR_RETURN(std::string out, Generate(p, kv, sample.max_tokens));
    LongCtxRow row;
    row.task = sample.task;
    row.length = sample.target_tokens;
    row.method = method;
    row.budget = budget;
    row.budget_tokens = budget_tokens;
    row.pop = pop;
    row.pop_kv_only_layers = pop ? pop_plan_.count(LayerMode::kKvOnly) : 0;
    row.prompt_tokens = n;
    row.accuracy = ScoreLongCtxOutput(sample, out);
    row.prefill_s = prefill_s;
    row.draft_s = draft_s;
    row.kv_bytes = Bytes(kv);
    row.output = std::move(out);
    rows.push_back(std::move(row));
    return absl::OkStatus();
  };

  for (const bool pop : pops) {
    PrefillRun run;
    run.plan = pop ? &pop_plan_ : nullptr;
    // One pass per POP setting serves the untrimmed KV (the reference row, what the fixed methods
    // trim, and what every method amounts to at a budget that keeps everything) and the scores of
    // SpecKV (window, last token and lookahead) and SnapKV / PyramidKV (window and last token):
    // the lookahead runs as a batch of its own after the window's (split_lookahead); the
    // untrimmed KV is the prompt's either way. Without a scoring method, a plain prefill.
    const bool want_speckv = Wants(methods, "speckv");
    const bool want_snapkv = Wants(methods, "snapkv") || Wants(methods, "pyramidkv");
    std::optional<PrefillEngine::Scored> scored;
    std::optional<PrefillResult> plain;
    if (want_speckv || want_snapkv) {
      const std::vector<int32_t> lookahead = want_speckv ? draft.lookahead : std::vector<int32_t>{};
      ASSIGN_OR_RETURN(scored, prefill_->RunScored(prompt, window, lookahead, run.plan,
                                                   /*split_lookahead=*/true));
    } else {
      ASSIGN_OR_RETURN(plain, prefill_->Run(prompt, run));
    }
    const KvSnapshot& full_kv = scored ? scored->full.kv : plain->kv;
    // The prompt's passes (the lookahead's batch left out).
    const double full_s = scored ? scored->full.forward_s - scored->lookahead_s : plain->forward_s;
    const CapturedAttention* speckv_att = want_speckv ? &scored->attention : nullptr;
    const CapturedAttention* snapkv_att = nullptr;
    if (want_snapkv) {
      snapkv_att = scored->window_only.n_keys > 0 ? &scored->window_only : &scored->attention;
    }
    if (Wants(methods, "full")) {
      RETURN_IF_ERROR(add("full", 1.0, m, pop, prompt, full_kv, full_s, 0));
    }
    for (const double fraction : budgets) {
      const int budget = std::max(1, static_cast<int>(std::lround(fraction * n)));
      if (budget < window) {
        return absl::InvalidArgumentError(absl::StrCat("eval-longctx: budget ", fraction, " of ", n,
                                                       " tokens is below the window ", window));
      }
      // A budget that keeps everything a method could drop runs the request as without the
      // method, as the scheduler does: the full row's KV, no draft hop.
      if (budget >= m) {
        for (const std::string& method : methods) {
          if (method == "full" || (CompressesPrompt(method) && budget < n)) continue;
          RETURN_IF_ERROR(add(method, fraction, CompressesPrompt(method) ? n : m, pop, prompt,
                              full_kv, full_s, 0));
        }
        if ((!Wants(methods, "specpc") && !Wants(methods, "keeplast")) || budget >= n) continue;
      }
      const int kv_budget = budget;
      TrimPolicy policy;
      policy.budget = kv_budget;
      policy.window = window;
      policy.pool_kernel = options_.trim_pool;
      auto trimmed = [&](const KvSnapshot& untrimmed,
                         const std::vector<int32_t>& positions) -> absl::StatusOr<KvSnapshot> {
        return TrimSnapshot(untrimmed, positions, kv_budget);
      };
      if (speckv_att != nullptr && budget < m) {
        policy.method = TrimMethod::kSpecKv;
        ASSIGN_OR_RETURN(const KvSnapshot kv,
                         trimmed(full_kv, ScoredPositions(policy, *speckv_att, m)));
        RETURN_IF_ERROR(add("speckv", fraction, kv_budget, pop, prompt, kv, scored->full.forward_s,
                            draft.prefill_s + draft.lookahead_s));
      }
      if (snapkv_att != nullptr && budget < m && Wants(methods, "pyramidkv")) {
        // SnapKV's scores, a budget per layer (the same pass: the scores do not depend on it).
        TrimPolicy pyramid = policy;
        pyramid.method = TrimMethod::kPyramidKv;
        pyramid.layer_budgets = PyramidLayerBudgets(kv_budget, window, c.n_layers, m);
        ASSIGN_OR_RETURN(
            const KvSnapshot kv,
            TrimSnapshot(full_kv, ScoredPositions(pyramid, *snapkv_att, m), TrimmedSlots(pyramid)));
        RETURN_IF_ERROR(add("pyramidkv", fraction, kv_budget, pop, prompt, kv, full_s, 0));
      }
      if (snapkv_att != nullptr && budget < m && Wants(methods, "snapkv")) {
        policy.method = TrimMethod::kSnapKv;
        ASSIGN_OR_RETURN(const KvSnapshot kv,
                         trimmed(full_kv, ScoredPositions(policy, *snapkv_att, m)));
        RETURN_IF_ERROR(add("snapkv", fraction, kv_budget, pop, prompt, kv, full_s, 0));
      }
      if (Wants(methods, "streamingllm") && budget < m) {
        policy.method = TrimMethod::kStreamingLlm;
        ASSIGN_OR_RETURN(const KvSnapshot kv,
                         trimmed(full_kv, FixedPositions(policy, m, c.n_layers, c.n_kv_heads)));
        RETURN_IF_ERROR(add("streamingllm", fraction, kv_budget, pop, prompt, kv, full_s, 0));
      }
      if (Wants(methods, "draftmap") && budget < m) {
        policy.method = TrimMethod::kDraftMap;
        // As the scheduler asks: one more than the budget, the last prompt position dropped.
        for (int32_t i : draft_keep(kv_budget + 1)) {
          if (i < m) policy.keep.push_back(i);
        }
        ASSIGN_OR_RETURN(const KvSnapshot kv,
                         trimmed(full_kv, FixedPositions(policy, m, c.n_layers, c.n_kv_heads)));
        policy.keep.clear();
        RETURN_IF_ERROR(
            add("draftmap", fraction, kv_budget, pop, prompt, kv, full_s, draft.prefill_s));
      }
      if (Wants(methods, "specpc")) {
        std::vector<int32_t> kept;
        for (int32_t i : draft_keep(budget)) kept.push_back(prompt[i]);
        ASSIGN_OR_RETURN(PrefillResult r, prefill_->Run(kept, run));
        RETURN_IF_ERROR(add("specpc", fraction, static_cast<int>(kept.size()), pop, kept, r.kv,
                            r.forward_s, draft.prefill_s));
      }
      if (Wants(methods, "keeplast")) {  // SpecPC's baseline: the prompt's last `budget` tokens
        const std::vector<int32_t> kept(prompt.end() - budget, prompt.end());
        ASSIGN_OR_RETURN(PrefillResult r, prefill_->Run(kept, run));
        RETURN_IF_ERROR(add("keeplast", fraction, budget, pop, kept, r.kv, r.forward_s, 0));
      }
    }
  }
  return rows;
}

}  // namespace tripod
