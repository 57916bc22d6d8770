// PrefillEngine; see prefill_engine.h.
#include "prefill_node/prefill_engine.h"

#include <algorithm>
#include <chrono>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/compute/session.h"
#include "common/kv/contiguous_kv_cache.h"
#include "common/kv/pyramid_budgets.h"
#include "common/util/status_macros.h"

namespace tripod {
namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

WeightSelection PrefillSelection(int n_layers, const std::vector<int>& skipped) {
  WeightSelection s;
  s.layers.assign(n_layers, LayerNeed::kFull);
  for (int l : skipped) s.layers[l] = LayerNeed::kKvOnly;
  s.output_head = false;
  return s;
}

absl::StatusOr<std::unique_ptr<PrefillEngine>> PrefillEngine::Create(
    const PrefillOptions& options, std::unique_ptr<Backend> backend, KvDtype kv) {
  if (options.chunk <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefill: chunk must be positive, got ", options.chunk));
  }
  std::unique_ptr<PrefillEngine> e(new PrefillEngine());
  e->options_ = options;
  e->kv_dtype_ = kv;
  e->backend_ = std::move(backend);
  const std::string path = options.model_path.empty() ? BundledModelPath() : options.model_path;
  // The layer count decides the skipped set, and the skipped set decides what to load: read the
  // config first (a mapping and a header parse, no weights).
  ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::Open(path));
  ASSIGN_OR_RETURN(ModelConfig config, ReadModelConfig(*gguf));
  gguf.reset();
  ASSIGN_OR_RETURN(e->skipped_, SkippedLayers(options.pop, config.n_layers));
  WeightSelection selection = PrefillSelection(config.n_layers, e->skipped_);
  selection.stack_kv_only = options.stack_kv;
  selection.kv_only_queries = options.score_queries;
  RETURN_IF_ERROR(e->backend_->Supports(config, e->kv_dtype_));
  ASSIGN_OR_RETURN(e->model_, LoadModel(path, *e->backend_, selection));
  e->plan_ = ForwardPlan::PopPrefill(config.n_layers, e->skipped_);
  e->ws_ = std::make_unique<ForwardWorkspace>(*e->backend_);
  return e;
}

absl::Status CheckPrompt(const ModelConfig& c, const std::vector<int32_t>& prompt) {
  if (prompt.empty()) return absl::InvalidArgumentError("prefill: empty prompt");
  if (static_cast<int64_t>(prompt.size()) > c.context_length) {
    return absl::InvalidArgumentError(absl::StrCat("prefill: prompt of ", prompt.size(),
                                                   " tokens exceeds the context length ",
                                                   c.context_length));
  }
  for (size_t i = 0; i < prompt.size(); ++i) {
    const int32_t t = prompt[i];
    if (t < 0 || t >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("prefill: token id ", t, " at position ", i,
                                                     " is outside the vocabulary [0, ",
                                                     c.vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ForwardPlan> PrefillEngine::PlanFor(const std::optional<PopConfig>& pop) const {
  if (!pop.has_value()) return plan_;
  const int L = model_->config.n_layers;
  ASSIGN_OR_RETURN(std::vector<int> skipped, SkippedLayers(*pop, L));
  ForwardPlan p = ForwardPlan::PopPrefill(L, skipped);
  if (full_weights() || p.KvKey() == plan_.KvKey()) return p;
  return absl::FailedPreconditionError(absl::StrCat(
      "prefill: the request's plan ", p.DebugString(), " (", DescribeSkipped(skipped, L),
      ") differs from this worker's ", plan_.DebugString(), " (", DescribeSkipped(skipped_, L),
      "), whose pruned load lacks the weights; only a worker that loaded the full model "
      "(POP ratio 0) runs any plan"));
}

absl::StatusOr<PrefillResult> PrefillEngine::Run(const std::vector<int32_t>& prompt,
                                                 const PrefillRun& run) {
  RETURN_IF_ERROR(CheckPrompt(model_->config, prompt));
  const ForwardPlan& plan = run.plan != nullptr ? *run.plan : plan_;
  auto cancelled = [&run] {
    return run.cancel != nullptr && run.cancel->load(std::memory_order_relaxed);
  };
  if (cancelled()) return absl::CancelledError("prefill: cancelled before it started");
  const ModelConfig& c = model_->config;
  const int n = static_cast<int>(prompt.size());
  const int m = n - 1;  // tokens prefilled here; the last one is the decode side's
  KvLayout layout{c.n_layers, c.n_kv_heads, c.head_dim, kv_dtype_};
  ASSIGN_OR_RETURN(
      std::unique_ptr<ContiguousKvCache> cache,
      ContiguousKvCache::Create(layout, 1, std::max(m, 1), backend_->DeviceKvMemory()));
  PrefillResult r;
  r.prefilled_tokens = m;
  r.plan_key = plan.KvKey();
  r.last_token = prompt.back();
  r.last_position = m;
  const auto t0 = Clock::now();
  for (int begin = 0; begin < m; begin += options_.chunk) {
    const int len = std::min(options_.chunk, m - begin);
    StepBatch batch;
    batch.AddSequence(0, prompt.data() + begin, len, begin, begin, /*logits_for_last=*/false);
    // Only a run with a sink or a cancel flag pays for the per-layer call.
    KvLayersDone on_kv;
    if (run.sink || run.cancel != nullptr) {
      on_kv = [&](int layer_begin, int layer_end) -> absl::Status {
        if (cancelled()) {
          return absl::CancelledError(absl::StrCat("prefill: cancelled at layer ", layer_begin,
                                                   " of prompt tokens [", begin, ", ", begin + len,
                                                   ")"));
        }
        if (!run.sink) return absl::OkStatus();
        const auto s0 = Clock::now();
        // The sink copies K/V out through the store, unordered with the backend's queued ops.
        if (cache->memory() != nullptr) backend_->Synchronize();
        absl::Status s = run.sink(*cache, 0, KvRange{layer_begin, layer_end, begin, begin + len});
        r.sink_s += Seconds(s0, Clock::now());
        return s;
      };
    }
    RETURN_IF_ERROR(Forward(*model_, *backend_, plan, batch, *cache, *ws_, nullptr, on_kv));
    // Layers the plan skips (POP's nokv and shortgpt controls) write no K/V: the decode side
    // still expects every layer, and gets their slots as the cache left them (zeros in host
    // memory), never reading them (pop_control.h).
    for (int a = 0; on_kv && a < c.n_layers;) {
      if (plan.layers[a] != LayerMode::kSkip) {
        ++a;
        continue;
      }
      int b = a + 1;
      while (b < c.n_layers && plan.layers[b] == LayerMode::kSkip) ++b;
      RETURN_IF_ERROR(on_kv(a, b));
      a = b;
    }
    ++r.chunks;
  }
  const auto t1 = Clock::now();
  r.forward_s = Seconds(t0, t1);
  if (run.sink) return r;
  backend_->Synchronize();
  ASSIGN_OR_RETURN(r.kv, ExportSnapshot(*cache, 0, m));
  r.kv.token_ids.assign(prompt.begin(), prompt.begin() + m);
  r.kv.plan_key = r.plan_key;
  r.export_s = Seconds(t1, Clock::now());
  return r;
}

absl::StatusOr<PrefillResult> PrefillEngine::RunTrimmed(const std::vector<int32_t>& prompt,
                                                        const TrimPolicy& policy,
                                                        const ForwardPlan* plan_in) {
  RETURN_IF_ERROR(CheckPrompt(model_->config, prompt));
  const ModelConfig& c = model_->config;
  const int m = static_cast<int>(prompt.size()) - 1;
  RETURN_IF_ERROR(ValidateTrimPolicy(policy, m));
  PrefillRun run;
  run.plan = plan_in;
  if (KeepsEverything(policy, m)) return Run(prompt, run);
  if (policy.method == TrimMethod::kStreamingLlm || policy.method == TrimMethod::kDraftMap) {
    ASSIGN_OR_RETURN(PrefillResult r, Run(prompt, run));
    ASSIGN_OR_RETURN(r.kv, TrimSnapshot(r.kv, FixedPositions(policy, m, c.n_layers, c.n_kv_heads),
                                        policy.budget));
    return r;
  }
  TrimPolicy p = policy;
  if (p.method == TrimMethod::kPyramidKv) {
    if (p.layer_budgets.empty()) {
      p.layer_budgets = PyramidLayerBudgets(p.budget, p.window, c.n_layers, m);
    }
    if (p.layer_budgets.size() != static_cast<size_t>(c.n_layers)) {
      return absl::InvalidArgumentError(absl::StrCat("trimming: ", p.layer_budgets.size(),
                                                     " per-layer budgets for a model of ",
                                                     c.n_layers, " layers"));
    }
    RETURN_IF_ERROR(ValidateTrimPolicy(p, m));
  }
  ASSIGN_OR_RETURN(
      Scored scored,
      RunScored(prompt, p.window,
                p.method == TrimMethod::kSpecKv ? p.lookahead : std::vector<int32_t>{}, plan_in));
  PrefillResult r = std::move(scored.full);
  const auto t0 = Clock::now();
  ASSIGN_OR_RETURN(r.kv,
                   TrimSnapshot(r.kv, ScoredPositions(p, scored.attention, m), TrimmedSlots(p)));
  r.export_s += Seconds(t0, Clock::now());
  return r;
}

absl::StatusOr<PrefillEngine::Scored> PrefillEngine::RunScored(
    const std::vector<int32_t>& prompt, int window, const std::vector<int32_t>& lookahead,
    const ForwardPlan* plan_in, bool split_lookahead) {
  RETURN_IF_ERROR(CheckPrompt(model_->config, prompt));
  const ModelConfig& c = model_->config;
  const int n = static_cast<int>(prompt.size());
  const int m = n - 1;
  if (window < 1 || window > m) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefill: the scoring window must be in [1, ", m, "], got ", window));
  }
  const ForwardPlan& plan = plan_in != nullptr ? *plan_in : plan_;
  // Every layer's KV is scored: full layers by their own queries, POP's K/V-only layers by queries
  // projected from the stream their K/V came from (Forward's capture), which needs their Q
  // projections loaded (PrefillOptions::score_queries).
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerMode mode = plan.layers[l];
    const PreparedLayer& p = model_->layers[l];
    if (mode == LayerMode::kFull || (mode == LayerMode::kKvOnly && p.attn_norm && (p.q || p.qkv))) {
      continue;
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "prefill: scoring the KV needs every layer's attention, and layer ", l, " of plan ",
        plan.DebugString(),
        " has no queries here (a skipped layer, or a K/V-only layer whose Q projection this "
        "worker did not load)"));
  }
  for (int32_t t : lookahead) {
    if (t < 0 || t >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "prefill: lookahead token id ", t, " is outside the vocabulary [0, ", c.vocab_size, ")"));
    }
  }
  const int total = n + static_cast<int>(lookahead.size());
  if (total > c.context_length) {
    return absl::InvalidArgumentError(absl::StrCat("prefill: ", n, " prompt and ", lookahead.size(),
                                                   " lookahead tokens exceed the context length ",
                                                   c.context_length));
  }
  std::vector<int32_t> tail(prompt.begin() + (m - window), prompt.end());
  const bool split = split_lookahead && !lookahead.empty();
  if (!split) tail.insert(tail.end(), lookahead.begin(), lookahead.end());
  KvLayout layout{c.n_layers, c.n_kv_heads, c.head_dim, kv_dtype_};
  ASSIGN_OR_RETURN(std::unique_ptr<ContiguousKvCache> cache,
                   ContiguousKvCache::Create(layout, 1, total, backend_->DeviceKvMemory()));
  Scored out;
  PrefillResult& r = out.full;
  r.prefilled_tokens = m;
  r.plan_key = plan.KvKey();
  r.last_token = prompt.back();
  r.last_position = m;
  const auto t0 = Clock::now();
  // The positions outside the window, in chunks; then the window, the last prompt token and the
  // lookahead as one batch, whose queries are all captured.
  const int outside = m - window;
  for (int begin = 0; begin < outside; begin += options_.chunk) {
    const int len = std::min(options_.chunk, outside - begin);
    StepBatch batch;
    batch.AddSequence(0, prompt.data() + begin, len, begin, begin, false);
    RETURN_IF_ERROR(Forward(*model_, *backend_, plan, batch, *cache, *ws_, nullptr));
    ++r.chunks;
  }
  // Captures every query of a batch of `ids` at position `pos`.
  auto scored_batch = [&](const std::vector<int32_t>& ids, int pos,
                          CapturedAttention* att) -> absl::Status {
    ForwardPlan scoring = plan;
    scoring.capture.window = static_cast<int>(ids.size());
    scoring.capture.layers.assign(c.n_layers, 1);
    StepBatch batch;
    batch.AddSequence(0, ids.data(), static_cast<int>(ids.size()), pos, pos, false);
    std::vector<CapturedAttention> captured;
    RETURN_IF_ERROR(
        Forward(*model_, *backend_, scoring, batch, *cache, *ws_, nullptr, {}, &captured));
    ++r.chunks;
    *att = std::move(captured.at(0));
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(scored_batch(tail, outside, &out.attention));
  if (split) {
    const auto tl = Clock::now();
    CapturedAttention more;
    RETURN_IF_ERROR(scored_batch(lookahead, n, &more));
    out.lookahead_s = Seconds(tl, Clock::now());
    out.window_only = out.attention;
    // The lookahead's queries see every key the window's did, and their own: max and sum of the
    // two over the common keys, the lookahead's alone past them.
    const CapturedAttention& a = out.window_only;
    for (int l = 0; l < c.n_layers; ++l) {
      for (int h = 0; h < c.n_kv_heads; ++h) {
        float* mx = more.max.data() + (size_t{1} * l * more.n_kv_heads + h) * more.n_keys;
        float* sm = more.sum.data() + (size_t{1} * l * more.n_kv_heads + h) * more.n_keys;
        const float* amx = a.max_at(l, h);
        const float* asm_ = a.sum_at(l, h);
        for (int k = 0; k < a.n_keys; ++k) {
          mx[k] = std::max(mx[k], amx[k]);
          sm[k] += asm_[k];
        }
      }
    }
    out.attention = std::move(more);
  }
  const auto t1 = Clock::now();
  r.forward_s = Seconds(t0, t1);
  backend_->Synchronize();
  ASSIGN_OR_RETURN(r.kv, ExportSnapshot(*cache, 0, m));
  r.kv.plan_key = r.plan_key;
  r.export_s = Seconds(t1, Clock::now());
  return out;
}

}  // namespace tripod
