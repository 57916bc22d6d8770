// POP layer importance; see pop_importance.h. Each sample runs in two passes that the KV cache
// keeps apart: pass 1 = prompt tokens 0..n-2 under the prefill-stage gates, pass 2 = [x_n,
// answer] under the decode-stage gates. Decode-stage gates leave pass 1's KV untouched, so it
// runs once per sample; prefill-stage gates redo it.
#include "eval/pop/pop_importance.h"

#include <chrono>
#include <cmath>
#include <memory>

#include "absl/strings/str_format.h"
#include "common/compute/forward.h"
#include "common/kv/contiguous_kv_cache.h"
#include "common/model/sampler.h"
#include "common/util/sample_stats.h"
#include "common/util/status_macros.h"
#include "eval/pop/plan_runner.h"

namespace tripod {
namespace {

std::vector<double> Squares(const std::vector<double>& v) {
  std::vector<double> out;
  for (double x : v) out.push_back(x * x);
  return out;
}

}  // namespace

absl::StatusOr<PopImportanceResult> PopImportance(const LoadedModel& model, Backend& backend,
                                                  const std::vector<std::vector<int32_t>>& prompts,
                                                  const PopImportanceOptions& options,
                                                  const std::function<void(int)>& progress) {
  const auto t_start = std::chrono::steady_clock::now();
  const ModelConfig& c = model.config;
  const int L = c.n_layers, V = c.vocab_size, m = options.answer_tokens;
  if (prompts.empty()) return absl::InvalidArgumentError("no calibration prompts");
  if (m < 1) return absl::InvalidArgumentError("answer_tokens must be >= 1");
  if (!(options.eps > 0 && options.eps < 1)) return absl::InvalidArgumentError("eps not in (0,1)");
  if (model.output == nullptr) return absl::FailedPreconditionError("the model has no head");
  std::vector<int> layers = options.layers;
  if (layers.empty()) {
    for (int l = 0; l < L; ++l) layers.push_back(l);
  }
  for (int l : layers) {
    if (l < 0 || l >= L) return absl::InvalidArgumentError("layer out of range");
  }
  size_t cap = 0;
  for (const auto& p : prompts) {
    if (p.size() < 2) return absl::InvalidArgumentError("a prompt needs >= 2 tokens");
    cap = std::max(cap, p.size() + m);
  }
  KvLayout layout{L, c.n_kv_heads, c.head_dim, options.kv_dtype};
  ASSIGN_OR_RETURN(std::unique_ptr<ContiguousKvCache> kv,
                   ContiguousKvCache::Create(layout, 1, static_cast<int>(cap)));
  ForwardWorkspace ws(backend);

  PopImportanceResult res;
  res.n_layers = L;
  res.options = options;
  res.layers.resize(L);
  const ForwardPlan full = ForwardPlan::Full(L);
  ForwardPlan pre = full;
  pre.output_head = false;
  std::vector<float> logits;
  std::vector<double> lp;

  for (size_t si = 0; si < prompts.size(); ++si) {
    const std::vector<int32_t>& x = prompts[si];
    const int n = static_cast<int>(x.size());
    res.prompt_tokens.push_back(n);
    const std::span<const int32_t> head(x.data(), n - 1);
    // Pass 1 with all gates 1; the decode-stage loop below reuses it.
    RETURN_IF_ERROR(RunTokens(model, backend, pre, *kv, ws, head, 0, false, nullptr));
    // The answer, sampled from the full model itself.
    SamplingParams sp;
    sp.seed = options.seed + si;
    Sampler sampler(sp, V);
    std::vector<int32_t> history(x.begin(), x.end()), answer;
    int32_t t = x.back();
    for (int i = 0; i < m; ++i) {
      RETURN_IF_ERROR(RunTokens(model, backend, full, *kv, ws, std::span<const int32_t>(&t, 1),
                                n - 1 + i, true, &logits));
      t = sampler.Sample(logits, history, x.size()).id;
      history.push_back(t);
      answer.push_back(t);
    }
    // Pass 2 tokens: x_n and the answer but its last token; row i predicts answer[i].
    std::vector<int32_t> tail = {x.back()};
    tail.insert(tail.end(), answer.begin(), answer.end() - 1);
    auto decode_loss = [&](const ForwardPlan& plan) -> absl::StatusOr<double> {
      RETURN_IF_ERROR(RunTokens(model, backend, plan, *kv, ws, tail, n - 1, true, &logits));
      double nll = 0;
      for (int i = 0; i < m; ++i) {
        LogSoftmax(std::span<const float>(logits).subspan(size_t{1} * i * V, V), &lp);
        nll -= lp[answer[i]];
      }
      return nll / m;
    };
    auto gated = [&](const ForwardPlan& base, int layer, double g) {
      ForwardPlan p = base;
      p.gates.assign(L, 1.0f);
      p.gates[layer] = static_cast<float>(g);
      return p;
    };
    ASSIGN_OR_RETURN(const double base, decode_loss(full));
    res.base_loss.push_back(base);
    const double eps = options.eps;
    // Decode stage: pass 1 stays as it is.
    for (int l : layers) {
      ASSIGN_OR_RETURN(const double up, decode_loss(gated(full, l, 1 + eps)));
      ASSIGN_OR_RETURN(const double down, decode_loss(gated(full, l, 1 - eps)));
      ASSIGN_OR_RETURN(const double zero, decode_loss(gated(full, l, 0)));
      res.layers[l].d_decode.push_back((up - down) / (2 * eps));
      res.layers[l].ablate_decode.push_back(zero - base);
    }
    // Prefill stage: pass 1 again under each gate, pass 2 ungated.
    for (int l : layers) {
      double loss[3];
      const double gates[3] = {1 + eps, 1 - eps, 0};
      for (int k = 0; k < 3; ++k) {
        RETURN_IF_ERROR(
            RunTokens(model, backend, gated(pre, l, gates[k]), *kv, ws, head, 0, false, nullptr));
        ASSIGN_OR_RETURN(loss[k], decode_loss(full));
      }
      res.layers[l].d_prefill.push_back((loss[0] - loss[1]) / (2 * eps));
      res.layers[l].ablate_prefill.push_back(loss[2] - base);
    }
    if (progress) progress(static_cast<int>(si));
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  return res;
}

nlohmann::json PopImportanceToJson(const PopImportanceResult& r) {
  using nlohmann::json;
  json j;
  j["analysis"] = "pop-importance";
  j["n_layers"] = r.n_layers;
  j["samples"] = r.base_loss.size();
  j["prompt_tokens"] = r.prompt_tokens;
  j["answer_tokens"] = r.options.answer_tokens;
  j["eps"] = r.options.eps;
  j["seed"] = r.options.seed;
  j["base_loss"] = Mean(r.base_loss);
  j["base_loss_per_sample"] = r.base_loss;
  json layers = json::array();
  for (int l = 0; l < r.n_layers; ++l) {
    const LayerImportance& li = r.layers[l];
    if (li.d_prefill.empty()) continue;  // not analysed
    const std::vector<double> sp = Squares(li.d_prefill), sd = Squares(li.d_decode);
    layers.push_back({{"layer", l},
                      {"prefill_importance", Mean(sp)},
                      {"prefill_importance_se", StdErr(sp)},
                      {"decode_importance", Mean(sd)},
                      {"decode_importance_se", StdErr(sd)},
                      {"prefill_grad_mean", Mean(li.d_prefill)},
                      {"decode_grad_mean", Mean(li.d_decode)},
                      {"prefill_ablation", Mean(li.ablate_prefill)},
                      {"prefill_ablation_se", StdErr(li.ablate_prefill)},
                      {"decode_ablation", Mean(li.ablate_decode)},
                      {"decode_ablation_se", StdErr(li.ablate_decode)},
                      {"per_sample",
                       {{"d_prefill", li.d_prefill},
                        {"d_decode", li.d_decode},
                        {"ablate_prefill", li.ablate_prefill},
                        {"ablate_decode", li.ablate_decode}}}});
  }
  j["layers"] = layers;
  j["seconds"] = r.seconds;
  return j;
}

std::string PopImportanceTable(const PopImportanceResult& r) {
  std::string s = absl::StrFormat(
      "samples %d, answer %d tokens, eps %.3g, base loss %.4f\n"
      "layer  I_prefill    I_decode     abl_prefill  abl_decode\n",
      static_cast<int>(r.base_loss.size()), r.options.answer_tokens, r.options.eps,
      Mean(r.base_loss));
  for (int l = 0; l < r.n_layers; ++l) {
    const LayerImportance& li = r.layers[l];
    if (li.d_prefill.empty()) continue;
    absl::StrAppendFormat(&s, "%5d  %-11.4g  %-11.4g  %-11.4g  %-11.4g\n", l,
                          Mean(Squares(li.d_prefill)), Mean(Squares(li.d_decode)),
                          Mean(li.ablate_prefill), Mean(li.ablate_decode));
  }
  return s;
}

}  // namespace tripod
