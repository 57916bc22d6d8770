// bench/prefill: POP prefill speed against the full model, one JSON line per prompt length.
// Both sides prefill the n-1 tokens a prefill worker computes (the boundary token is the decode
// side's), with no output head: "full" is the engine at ratio 0 (bit-identical to the full
// forward), "pop" the engine at --ratio (1/3 by default) with the skipped layers' K/V as one
// stacked GEMM, and "pop_unstacked" the same plan with one K/V GEMM per skipped layer. Reps are
// interleaved (full, pop, pop_unstacked, full, ...) so that load drifts hit all alike; the best
// of --reps is reported, and speedup_median_paired is the median over reps of full/pop timed
// back to back. Timings cover the forward passes only (the KV copy-out is reported
// apart). predicted_speedup is the FLOP-count ratio (prefill_node/prefill_flops.h). Prompts are
// pseudo-random token ids.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/kv/contiguous_kv_cache.h"
#include "common/model/model_resolver.h"
#include "common/util/status_macros.h"
#include "common/util/thread_pool.h"
#include "prefill_node/prefill_engine.h"
#include "prefill_node/prefill_flops.h"

ABSL_FLAG(std::string, model, "",
          "a GGUF file or a model catalogue name (scripts/fetch_model --list); default: the "
          "bundled model");
ABSL_FLAG(int, threads, 0, "compute threads (default: all cores)");
ABSL_FLAG(std::string, precision, "auto", "fp32 | bf16 | int8 | int16 | auto");
ABSL_FLAG(std::string, lengths, "128,512,1024,2048,4096", "prompt lengths");
ABSL_FLAG(std::string, ratio, "1/3", "POP pruning ratio");
ABSL_FLAG(int, reps, 3, "interleaved repetitions (best is reported)");
ABSL_FLAG(int, chunk, 2048, "prefill chunk size");
ABSL_FLAG(bool, unstacked, true, "also time POP with one K/V GEMM per skipped layer");

namespace tripod {
namespace {

using Clock = std::chrono::steady_clock;

// Seconds for the skipped layers' K/V alone: the engine's plan with its kept layers removed, so
// the forward is the embedding and the K/V projections (stacked or per layer) from it.
absl::StatusOr<double> TimeKvOnly(PrefillEngine& e, const std::vector<int32_t>& prompt, int chunk) {
  ForwardPlan plan = e.plan();
  for (LayerMode& m : plan.layers) {
    if (m == LayerMode::kFull) m = LayerMode::kSkip;
  }
  const ModelConfig& c = e.model().config;
  const int n = static_cast<int>(prompt.size()) - 1;
  KvLayout layout{c.n_layers, c.n_kv_heads, c.head_dim, e.kv_dtype()};
  ASSIGN_OR_RETURN(std::unique_ptr<ContiguousKvCache> kv, ContiguousKvCache::Create(layout, 1, n));
  ForwardWorkspace ws(e.backend());
  const auto t0 = Clock::now();
  for (int b = 0; b < n; b += chunk) {
    StepBatch batch;
    batch.AddSequence(0, prompt.data() + b, std::min(chunk, n - b), b, b, false);
    RETURN_IF_ERROR(Forward(e.model(), e.backend(), plan, batch, *kv, ws, nullptr));
  }
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "prefill: %s\n", s.ToString().c_str());
  return 1;
}

int Run() {
  std::vector<int> lengths;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_lengths), ',')) {
    int n;
    if (absl::SimpleAtoi(s, &n) && n > 1) lengths.push_back(n);
  }
  auto pop_config = ParsePopConfig(absl::GetFlag(FLAGS_ratio), "");
  if (!pop_config.ok()) return Fail(pop_config.status());
  PrefillOptions o;
  absl::StatusOr<std::string> model = ResolveModel(absl::GetFlag(FLAGS_model));
  if (!model.ok()) return Fail(model.status());
  o.model_path = *model;
  o.precision = absl::GetFlag(FLAGS_precision);
  o.chunk = absl::GetFlag(FLAGS_chunk);

  struct Variant {
    const char* name;
    std::unique_ptr<PrefillEngine> engine;
  };
  std::vector<Variant> variants;
  for (const char* name : {"full", "pop", "pop_unstacked"}) {
    if (std::string(name) == "pop_unstacked" && !absl::GetFlag(FLAGS_unstacked)) continue;
    PrefillOptions v = o;
    v.pop = std::string(name) == "full" ? PopConfig{0.0, std::nullopt} : *pop_config;
    v.stack_kv = std::string(name) != "pop_unstacked";
    auto e = PrefillEngine::Create(v);
    if (!e.ok()) return Fail(e.status());
    variants.push_back({name, std::move(e).value()});
  }
  const ModelConfig& c = variants[0].engine->model().config;
  const PrefillEngine& pop = *variants[1].engine;

  std::mt19937 rng(1234);
  std::uniform_int_distribution<int> tok(100, c.vocab_size - 1);
  {  // Warm-up: oneDNN primitives and workspaces, outside the timings.
    std::vector<int32_t> warm(65);
    for (int32_t& t : warm) t = tok(rng);
    for (Variant& v : variants) {
      if (auto r = v.engine->Run(warm); !r.ok()) return Fail(r.status());
    }
  }
  for (int n : lengths) {
    std::vector<int32_t> prompt(n);
    for (int32_t& t : prompt) t = tok(rng);
    std::vector<double> best(variants.size(), 1e30), best_kv(variants.size(), 1e30);
    double export_s = 0;
    std::vector<double> ratios;  // full / pop within each rep: robust to load that drifts
    for (int rep = 0; rep < std::max(1, absl::GetFlag(FLAGS_reps)); ++rep) {
      for (size_t i = 0; i < variants.size(); ++i) {
        auto r = variants[i].engine->Run(prompt);
        if (!r.ok()) return Fail(r.status());
        best[i] = std::min(best[i], r->forward_s);
        if (i == 0) ratios.push_back(r->forward_s);
        if (i == 1) {
          export_s = r->export_s;
          ratios.back() /= r->forward_s;
        }
        if (i > 0) {
          auto kv_s = TimeKvOnly(*variants[i].engine, prompt, o.chunk);
          if (!kv_s.ok()) return Fail(kv_s.status());
          best_kv[i] = std::min(best_kv[i], *kv_s);
        }
      }
    }
    const double full_flops = PrefillFlops(c, variants[0].engine->plan(), n - 1);
    const double pop_flops = PrefillFlops(c, pop.plan(), n - 1);
    std::printf(
        "{\"bench\":\"prefill\",\"precision\":\"%s\",\"threads\":%d,\"plan\":\"%s\","
        "\"prompt_tokens\":%d,\"prefilled_tokens\":%d,\"full_s\":%.4f,\"pop_s\":%.4f,"
        "\"speedup\":%.3f,\"predicted_speedup\":%.3f,\"speedup_median_paired\":%.3f,",
        o.precision.c_str(), ComputeThreads(), pop.plan().DebugString().c_str(), n, n - 1, best[0],
        best[1], best[0] / best[1], full_flops / pop_flops, Median(ratios));
    if (variants.size() > 2) {
      // kv_only: the skipped layers' K/V projections alone (stacked vs one GEMM per layer).
      std::printf(
          "\"pop_unstacked_s\":%.4f,\"kv_only_s\":%.4f,\"kv_only_unstacked_s\":%.4f,"
          "\"kv_stack_gain\":%.3f,",
          best[2], best_kv[1], best_kv[2], best_kv[2] / best_kv[1]);
    }
    std::printf("\"full_gflop_s\":%.1f,\"pop_gflop_s\":%.1f,\"pop_export_s\":%.4f}\n",
                full_flops / best[0] * 1e-9, pop_flops / best[1] * 1e-9, export_s);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace tripod

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_threads) > 0) tripod::SetComputeThreads(absl::GetFlag(FLAGS_threads));
  return tripod::Run();
}
