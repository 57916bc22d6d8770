// eval-pop; see pop_eval.h. Every method runs the same two-pass shape as the reference (prompt
// tokens 0..n-2, then the last prompt token with the continuation), so ratio 0 reproduces the
// reference bit for bit and any difference is the method's.
#include "eval/pop/pop_eval.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/compute/forward.h"
#include "common/kv/contiguous_kv_cache.h"
#include "common/util/sample_stats.h"
#include "common/util/status_macros.h"
#include "eval/pop/plan_runner.h"

namespace tripod {
namespace {

const char* KindName(PopMethodKind k) {
  switch (k) {
    case PopMethodKind::kPop:
      return "pop";
    case PopMethodKind::kShortGpt:
      return "shortgpt";
    case PopMethodKind::kNoBoundary:
      return "noboundary";
    case PopMethodKind::kNoKv:
      return "nokv";
  }
  return "?";
}

// What one method produced on one window: logits predicting each continuation token
// ([m, vocab], teacher-forced) and its greedy generation.
struct RunOut {
  std::vector<float> logits;
  std::vector<int32_t> greedy;
};

// Runs methods on one window. Prefill() writes slots 0..n-2; Decode() runs the last prompt
// token and the continuation on top (slots n-1..), so several methods can share one prefill.
class Runner {
 public:
  Runner(const LoadedModel& model, Backend& backend, ContiguousKvCache& kv)
      : model_(model), backend_(backend), kv_(kv), ws_(backend) {}

  // Prompt tokens 0..n-2 under POP's prefill plan for `skipped` (none: the full model).
  absl::Status Prefill(const CorpusWindow& w, const std::vector<int>& skipped) {
    const ForwardPlan pre = ForwardPlan::PopPrefill(model_.config.n_layers, skipped);
    return RunTokens(model_, backend_, pre, kv_, ws_,
                     std::span<const int32_t>(w.prompt).first(w.prompt.size() - 1), 0, false,
                     nullptr);
  }

  // Needs the prefill each kind builds on: kPop and kNoBoundary POP's for `skipped`; kShortGpt
  // and kNoKv the full model's (their skipped layers' prompt K/V are never read, the kept
  // layers' are the full model's).
  absl::Status Decode(const CorpusWindow& w, PopMethodKind kind, const std::vector<int>& skipped,
                      int gen, RunOut* out) {
    const int L = model_.config.n_layers, V = model_.config.vocab_size;
    const int n = static_cast<int>(w.prompt.size());
    const int m = static_cast<int>(w.continuation.size());
    ForwardPlan dec = ForwardPlan::Full(L);
    std::vector<bool> hidden(L, false);
    if (kind == PopMethodKind::kShortGpt) {
      for (int l : skipped) dec.layers[l] = LayerMode::kSkip;
    } else if (kind == PopMethodKind::kNoKv) {
      for (int l : skipped) hidden[l] = true;
    }
    // The no-K/V control: in the decode stage the skipped layers see only slots from the last
    // prompt token on (they wrote no K/V for the prompt).
    HidingKvStore hiding(kv_, hidden, n - 1);
    KvStore& dkv = kind == PopMethodKind::kNoKv ? static_cast<KvStore&>(hiding) : kv_;
    const std::span<const int32_t> cont(w.continuation);
    std::vector<float> rows;
    if (kind == PopMethodKind::kNoBoundary) {
      // The last prompt token through the pruned plan too: the first logits come from it.
      ForwardPlan pruned = ForwardPlan::PopPrefill(L, skipped);
      pruned.output_head = true;
      RETURN_IF_ERROR(RunTokens(model_, backend_, pruned, kv_, ws_,
                                std::span<const int32_t>(&w.prompt.back(), 1), n - 1, true,
                                &out->logits));
      RETURN_IF_ERROR(
          RunTokens(model_, backend_, dec, kv_, ws_, cont.first(m - 1), n, true, &rows));
      out->logits.insert(out->logits.end(), rows.begin(), rows.end());
    } else {
      std::vector<int32_t> tail = {w.prompt.back()};
      tail.insert(tail.end(), cont.begin(), cont.end() - 1);
      RETURN_IF_ERROR(RunTokens(model_, backend_, dec, dkv, ws_, tail, n - 1, true, &out->logits));
    }
    // Greedy generation from the prompt; overwrites the continuation's slots as it goes.
    out->greedy.clear();
    out->greedy.push_back(ArgMax(std::span<const float>(out->logits).first(V)));
    for (int i = 1; i < gen; ++i) {
      const int32_t t = out->greedy.back();
      RETURN_IF_ERROR(RunTokens(model_, backend_, dec, dkv, ws_, std::span<const int32_t>(&t, 1),
                                n + i - 1, true, &rows));
      out->greedy.push_back(ArgMax(rows));
    }
    return absl::OkStatus();
  }

 private:
  const LoadedModel& model_;
  Backend& backend_;
  ContiguousKvCache& kv_;
  ForwardWorkspace ws_;
};

}  // namespace

std::string PopMethod::name() const { return absl::StrFormat("%s@%.3f", KindName(kind), ratio); }

std::vector<PopMethod> DefaultPopMethods() {
  std::vector<PopMethod> out;
  for (double r : {0.0, 0.2, 0.25, 1.0 / 3, 0.4, 0.5}) out.push_back({PopMethodKind::kPop, r});
  for (PopMethodKind k :
       {PopMethodKind::kShortGpt, PopMethodKind::kNoBoundary, PopMethodKind::kNoKv}) {
    out.push_back({k, 1.0 / 3});
  }
  return out;
}

absl::StatusOr<std::vector<PopMethod>> ParsePopMethods(const std::string& spec) {
  std::vector<PopMethod> out;
  for (absl::string_view item : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    item = absl::StripAsciiWhitespace(item);
    std::vector<absl::string_view> kv = absl::StrSplit(item, ':');
    if (kv.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("config '", item, "': expected KIND:RATIO, e.g. pop:0.25 or nokv:1/3"));
    }
    PopMethod m;
    if (kv[0] == "pop") {
      m.kind = PopMethodKind::kPop;
    } else if (kv[0] == "shortgpt") {
      m.kind = PopMethodKind::kShortGpt;
    } else if (kv[0] == "noboundary") {
      m.kind = PopMethodKind::kNoBoundary;
    } else if (kv[0] == "nokv") {
      m.kind = PopMethodKind::kNoKv;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("config '", item, "': kind must be pop, shortgpt, noboundary or nokv"));
    }
    std::vector<absl::string_view> frac = absl::StrSplit(kv[1], '/');
    double num = 0, den = 1;
    if (frac.size() > 2 || !absl::SimpleAtod(frac[0], &num) ||
        (frac.size() == 2 && !absl::SimpleAtod(frac[1], &den)) || den == 0) {
      return absl::InvalidArgumentError(absl::StrCat("config '", item, "': bad ratio"));
    }
    m.ratio = num / den;
    if (!(m.ratio >= 0 && m.ratio < 1)) {
      return absl::InvalidArgumentError(absl::StrCat("config '", item, "': ratio not in [0, 1)"));
    }
    out.push_back(m);
  }
  if (out.empty()) return absl::InvalidArgumentError("no configs given");
  return out;
}

std::vector<int> PopSkippedLayers(int n_layers, double ratio) {
  // The epsilon keeps 30 * (1/3) at 10, not 9.
  const int k = static_cast<int>(std::floor(n_layers * ratio + 1e-9));
  return PopSkippedLayersCount(n_layers, k);
}

std::vector<int> PopSkippedLayersCount(int n_layers, int k) {
  k = std::clamp(k, 0, n_layers);
  std::vector<int> out;
  for (int l = n_layers - k; l < n_layers; ++l) out.push_back(l);
  return out;
}

absl::StatusOr<PopEvalResult> EvalPop(const LoadedModel& model, Backend& backend,
                                      const std::vector<CorpusWindow>& windows,
                                      const std::vector<PopMethod>& methods,
                                      const PopEvalOptions& options,
                                      const std::function<void(int)>& progress) {
  const auto t0 = std::chrono::steady_clock::now();
  const ModelConfig& c = model.config;
  const int L = c.n_layers, V = c.vocab_size;
  if (windows.empty()) return absl::InvalidArgumentError("no prompts to evaluate");
  if (options.generate_tokens < 1) return absl::InvalidArgumentError("generate_tokens < 1");
  if (model.output == nullptr) return absl::FailedPreconditionError("the model has no head");
  int cap = 0;
  const size_t m = windows[0].continuation.size();
  for (const CorpusWindow& w : windows) {
    if (w.prompt.size() < 2) return absl::InvalidArgumentError("a prompt needs >= 2 tokens");
    if (w.continuation.empty() || w.continuation.size() != m) {
      return absl::InvalidArgumentError("continuations must be non-empty and of one length");
    }
    cap = std::max<int>(cap, w.prompt.size() + std::max<int>(m, options.generate_tokens) + 1);
  }
  KvLayout layout{L, c.n_kv_heads, c.head_dim, options.kv_dtype};
  ASSIGN_OR_RETURN(std::unique_ptr<ContiguousKvCache> kv,
                   ContiguousKvCache::Create(layout, 1, cap));
  Runner runner(model, backend, *kv);

  PopEvalResult res;
  res.n_layers = L;
  res.continuation_tokens = static_cast<int>(m);
  res.generate_tokens = options.generate_tokens;
  for (const PopMethod& pm : methods) {
    if (!(pm.ratio >= 0 && pm.ratio < 1)) return absl::InvalidArgumentError("ratio not in [0, 1)");
    res.methods.push_back({pm, PopSkippedLayers(L, pm.ratio), {}, {}, {}, {}});
  }
  std::vector<std::vector<double>> ref_lp(m);  // the reference's log-probabilities per row
  std::vector<double> lp;
  RunOut ref, out;
  // Methods grouped by the prefill they build on (see Runner::Decode): the full model's first.
  std::vector<std::pair<int, std::vector<int>>> groups;  // (skipped count, method indices)
  groups.push_back({0, {}});
  for (size_t i = 0; i < res.methods.size(); ++i) {
    const PopMethodResult& r = res.methods[i];
    const bool on_full = r.method.kind == PopMethodKind::kShortGpt ||
                         r.method.kind == PopMethodKind::kNoKv || r.skipped.empty();
    const int k = on_full ? 0 : static_cast<int>(r.skipped.size());
    auto g =
        std::find_if(groups.begin(), groups.end(), [&](const auto& x) { return x.first == k; });
    if (g == groups.end()) g = groups.insert(groups.end(), {k, {}});
    g->second.push_back(static_cast<int>(i));
  }
  for (size_t wi = 0; wi < windows.size(); ++wi) {
    const CorpusWindow& w = windows[wi];
    res.prompt_tokens.push_back(static_cast<int>(w.prompt.size()));
    for (const auto& [k, members] : groups) {
      RETURN_IF_ERROR(runner.Prefill(w, PopSkippedLayersCount(L, k)));
      if (k == 0) {
        RETURN_IF_ERROR(runner.Decode(w, PopMethodKind::kPop, {}, options.generate_tokens, &ref));
        double nll = 0;
        for (size_t t = 0; t < m; ++t) {
          LogSoftmax(std::span<const float>(ref.logits).subspan(t * V, V), &ref_lp[t]);
          nll -= ref_lp[t][w.continuation[t]];
        }
        res.full_nll.push_back(nll / m);
      }
      for (int mi : members) {
        PopMethodResult& r = res.methods[mi];
        RETURN_IF_ERROR(runner.Decode(w, r.method.kind, r.skipped, options.generate_tokens, &out));
        double kl = 0, mnll = 0;
        for (size_t t = 0; t < m; ++t) {
          LogSoftmax(std::span<const float>(out.logits).subspan(t * V, V), &lp);
          const std::vector<double>& rl = ref_lp[t];
          double d = 0;
          for (int v = 0; v < V; ++v) d += std::exp(rl[v]) * (rl[v] - lp[v]);
          kl += d;
          mnll -= lp[w.continuation[t]];
        }
        int agree = 0;
        for (int i = 0; i < options.generate_tokens; ++i) agree += out.greedy[i] == ref.greedy[i];
        r.kl.push_back(kl / m);
        r.nll.push_back(mnll / m);
        r.agreement.push_back(static_cast<double>(agree) / options.generate_tokens);
        r.first_token_match.push_back(out.greedy[0] == ref.greedy[0]);
      }
    }
    if (progress) progress(static_cast<int>(wi));
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

nlohmann::json PopEvalToJson(const PopEvalResult& r) {
  using nlohmann::json;
  json j;
  j["eval"] = "pop";
  j["n_layers"] = r.n_layers;
  j["prompts"] = r.prompt_tokens.size();
  const auto [mn, mx] = std::minmax_element(r.prompt_tokens.begin(), r.prompt_tokens.end());
  double mean_len = 0;
  for (int n : r.prompt_tokens) mean_len += n;
  mean_len /= std::max<size_t>(1, r.prompt_tokens.size());
  j["prompt_tokens"] = {{"min", r.prompt_tokens.empty() ? 0 : *mn},
                        {"max", r.prompt_tokens.empty() ? 0 : *mx},
                        {"mean", mean_len}};
  j["continuation_tokens"] = r.continuation_tokens;
  j["generate_tokens"] = r.generate_tokens;
  j["full"] = {{"nll", Mean(r.full_nll)}, {"ppl", std::exp(Mean(r.full_nll))}};
  // Three equal-width prompt-length buckets, to see whether the effect grows with length.
  const int lo = r.prompt_tokens.empty() ? 0 : *mn, hi = r.prompt_tokens.empty() ? 0 : *mx;
  auto bucket = [&](int n) {
    return hi == lo ? 0 : std::min(2, static_cast<int>(3.0 * (n - lo) / (hi - lo + 1)));
  };
  json methods = json::array();
  json per_prompt;
  per_prompt["prompt_tokens"] = r.prompt_tokens;
  per_prompt["full_nll"] = r.full_nll;
  for (const PopMethodResult& m : r.methods) {
    double first = 0;
    for (int f : m.first_token_match) first += f;
    first /= std::max<size_t>(1, m.first_token_match.size());
    json jm = {{"name", m.method.name()},
               {"kind", KindName(m.method.kind)},
               {"ratio", m.method.ratio},
               {"skipped_layers", m.skipped},
               {"kl", Mean(m.kl)},
               {"kl_se", StdErr(m.kl)},
               {"agreement", Mean(m.agreement)},
               {"agreement_se", StdErr(m.agreement)},
               {"first_token_agreement", first},
               {"nll", Mean(m.nll)},
               {"ppl", std::exp(Mean(m.nll))}};
    json buckets = json::array();
    for (int b = 0; b < 3; ++b) {
      std::vector<double> kl, ag;
      int bmin = hi, bmax = lo;
      for (size_t i = 0; i < m.kl.size(); ++i) {
        if (bucket(r.prompt_tokens[i]) != b) continue;
        kl.push_back(m.kl[i]);
        ag.push_back(m.agreement[i]);
        bmin = std::min(bmin, r.prompt_tokens[i]);
        bmax = std::max(bmax, r.prompt_tokens[i]);
      }
      if (kl.empty()) continue;
      buckets.push_back({{"min_tokens", bmin},
                         {"max_tokens", bmax},
                         {"prompts", kl.size()},
                         {"kl", Mean(kl)},
                         {"agreement", Mean(ag)}});
    }
    jm["by_length"] = buckets;
    methods.push_back(jm);
    per_prompt[m.method.name()] = {{"kl", m.kl},
                                   {"agreement", m.agreement},
                                   {"nll", m.nll},
                                   {"first_token_match", m.first_token_match}};
  }
  j["methods"] = methods;
  j["per_prompt"] = per_prompt;
  j["seconds"] = r.seconds;
  return j;
}

absl::StatusOr<PopEvalResult> MergePopEvalJson(const std::vector<nlohmann::json>& shards) {
  PopEvalResult res;
  try {
    for (size_t si = 0; si < shards.size(); ++si) {
      const nlohmann::json& j = shards[si];
      const nlohmann::json& pp = j.at("per_prompt");
      if (si == 0) {
        res.n_layers = j.at("n_layers").get<int>();
        res.continuation_tokens = j.at("continuation_tokens").get<int>();
        res.generate_tokens = j.at("generate_tokens").get<int>();
        for (const auto& jm : j.at("methods")) {
          PopMethodResult r;
          ASSIGN_OR_RETURN(std::vector<PopMethod> pm,
                           ParsePopMethods(absl::StrCat(jm.at("kind").get<std::string>(), ":",
                                                        jm.at("ratio").get<double>())));
          r.method = pm[0];
          r.skipped = jm.at("skipped_layers").get<std::vector<int>>();
          res.methods.push_back(r);
        }
      } else if (j.at("methods").size() != res.methods.size()) {
        return absl::InvalidArgumentError("shards evaluated different configs");
      }
      auto append = [](auto& dst, const nlohmann::json& src) {
        for (const auto& x : src)
          dst.push_back(x.get<typename std::decay_t<decltype(dst)>::value_type>());
      };
      append(res.prompt_tokens, pp.at("prompt_tokens"));
      append(res.full_nll, pp.at("full_nll"));
      for (size_t i = 0; i < res.methods.size(); ++i) {
        PopMethodResult& r = res.methods[i];
        const std::string name = j.at("methods")[i].at("name").get<std::string>();
        if (name != r.method.name()) return absl::InvalidArgumentError("shards' configs differ");
        const nlohmann::json& m = pp.at(name);
        append(r.kl, m.at("kl"));
        append(r.agreement, m.at("agreement"));
        append(r.nll, m.at("nll"));
        append(r.first_token_match, m.at("first_token_match"));
      }
      res.seconds += j.at("seconds").get<double>();
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("not an eval-pop JSON: ", e.what()));
  }
  if (res.prompt_tokens.empty()) return absl::InvalidArgumentError("nothing to merge");
  return res;
}

}  // namespace tripod
