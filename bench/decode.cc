// bench/decode: continuous-batching decode throughput of the decode engine. Per concurrency C,
// C requests with pseudo-random --prompt_tokens prompts and --new_tokens greedy tokens each
// (ignore_eos) are submitted at once. One JSON line per C:
//   aggregate_tok_s: tokens generated while all C sequences decode together (from the last
//     sequence's first token to the first sequence's finish) / that window's wall time
//     ("window":"all_decoding"); where the first sequence finishes before the last one starts
//     (C prompts take longer to prefill than one sequence to decode), from the first first token
//     to the last finish instead ("window":"first_token_to_last_finish");
//   itl_mean_ms, itl_p99_ms: gaps between a sequence's consecutive tokens, over all sequences
//     (prefill chunks of later sequences included, as a client sees them);
//   kv_bytes_per_token: KV memory the running sequences' blocks hold / the slots they fill, at
//     the window's start; kv_bytes_per_token_theory: 2 * layers * kv_heads * head_dim * elem.
// Then {"bench":"prefix_cache"}: time to the first token of a --prefix_tokens prompt, cold and
// when sent again (prefix-cache hit).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/compute/cpu/cpu_features.h"
#include "common/model/model_resolver.h"
#include "common/util/thread_pool.h"
#include "decode_node/decode_engine.h"

ABSL_FLAG(std::string, model, "",
          "a GGUF file or a model catalogue name (scripts/fetch_model --list); default: the "
          "bundled model");
ABSL_FLAG(int, threads, 0, "compute threads (default: all cores)");
ABSL_FLAG(std::string, precision, "auto", "fp32 | bf16 | int8 | int16 | auto");
ABSL_FLAG(std::string, kv_cache_dtype, "auto", "auto | f32 | f16 | bf16 | q8_0");
ABSL_FLAG(int, batch_invariant, -1, "batch-invariant kernels: 1, 0, -1 = on for fp32 only");
ABSL_FLAG(std::string, concurrency, "1,4,16,64", "concurrent requests per run");
ABSL_FLAG(int, prompt_tokens, 512, "prompt length");
ABSL_FLAG(int, new_tokens, 128, "generated tokens per request");
ABSL_FLAG(int, prefix_tokens, 2048, "prompt length of the prefix-cache line (0: skip)");
// 512, not the engine's 256: with 64 prompts of 512 tokens the first sequence would finish before
// the last starts at 256, and the all-decoding window would not exist.
ABSL_FLAG(int, step_tokens, 512, "max tokens per step (the engine's default: 256)");
ABSL_FLAG(int, block_tokens, 16, "KV block size");
ABSL_FLAG(int, kv_budget_mb, 2048, "KV cache budget (MiB)");
ABSL_FLAG(std::string, structured_regex, "",
          "constrain every timed request to fullmatch this regex (a structured output, "
          "common/structured; e.g. '[^#]*#', which leaves most tokens allowed and ends only "
          "after a '#'): its cost against a run without");
ABSL_FLAG(std::string, isa, "",
          "cap the kernels' instruction set (avx2, avx512): an AVX2-only CPU's paths on this one");

namespace tripod {
namespace {

using Clock = std::chrono::steady_clock;
double Now() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

struct Seq {
  std::vector<double> times;  // of each token event
  bool done = false;
};

std::vector<int32_t> RandomPrompt(int n, std::mt19937& rng, int vocab) {
  std::uniform_int_distribution<int32_t> tok(100, vocab - 1);
  std::vector<int32_t> p(n);
  for (int32_t& t : p) t = tok(rng);
  return p;
}

int Run() {
  DecodeEngineOptions o;
  if (absl::StatusOr<std::string> model = ResolveModel(absl::GetFlag(FLAGS_model)); model.ok()) {
    o.model_path = *model;
  } else {
    std::fprintf(stderr, "decode: %s\n", model.status().ToString().c_str());
    return 1;
  }
  o.precision = absl::GetFlag(FLAGS_precision);
  o.kv_cache_dtype = absl::GetFlag(FLAGS_kv_cache_dtype);
  o.batch_invariant = absl::GetFlag(FLAGS_batch_invariant);
  o.kv_budget_bytes = size_t{1} * absl::GetFlag(FLAGS_kv_budget_mb) << 20;
  o.block_tokens = absl::GetFlag(FLAGS_block_tokens);
  o.max_tokens_per_step = absl::GetFlag(FLAGS_step_tokens);
  std::vector<int> concurrency;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_concurrency), ',')) {
    int n;
    if (absl::SimpleAtoi(s, &n) && n > 0) concurrency.push_back(n);
  }
  o.max_running = std::max(1, *std::max_element(concurrency.begin(), concurrency.end()));
  auto engine = DecodeEngine::Create(o);
  if (!engine.ok()) {
    std::fprintf(stderr, "decode: %s\n", engine.status().ToString().c_str());
    return 1;
  }
  DecodeEngine& e = **engine;
  const ModelConfig& c = e.model().config;
  const KvLayout layout = e.cache().layout();
  const double theory = static_cast<double>(layout.bytes_per_token());
  std::mt19937 rng(1234);
  const int prompt_n = absl::GetFlag(FLAGS_prompt_tokens);
  const int new_n = absl::GetFlag(FLAGS_new_tokens);

  {  // Warm-up, outside the timings.
    DecodeRequest r;
    r.prompt = RandomPrompt(64, rng, c.vocab_size);
    r.sampling.temperature = 0;
    r.max_tokens = 4;
    if (!e.Submit(std::move(r)).ok() || !e.RunUntilIdle().ok()) return 1;
  }

  std::shared_ptr<structured::TokenConstraint> constraint;
  if (const std::string rx = absl::GetFlag(FLAGS_structured_regex); !rx.empty()) {
    absl::StatusOr<std::shared_ptr<structured::TokenConstraint>> tc = e.CompileConstraint(rx);
    if (!tc.ok()) {
      std::fprintf(stderr, "decode: --structured_regex: %s\n", tc.status().ToString().c_str());
      return 1;
    }
    constraint = *std::move(tc);
  }

  for (int C : concurrency) {
    std::deque<Seq> seqs(C);
    double window_start = 0, window_end = 0, first_token = 0, last_finish = 0;
    int first_tokens = 0;
    DecodeEngine::KvUsage usage;
    const DecodeEngineStats before = e.stats();
    for (int i = 0; i < C; ++i) {
      DecodeRequest r;
      r.prompt = RandomPrompt(prompt_n, rng, c.vocab_size);
      r.sampling.temperature = 0;
      r.max_tokens = new_n;
      r.ignore_eos = true;
      r.constraint = constraint;  // an end token ends a constrained request, ignore_eos or not
      Seq* s = &seqs[i];
      r.on_event = [&, s](const TokenEvent& ev) {
        const double t = Now();
        if (ev.token >= 0) s->times.push_back(t);
        if (ev.token >= 0 && ev.index == 0) {
          if (first_token == 0) first_token = t;
          if (++first_tokens == C) {
            window_start = t;
            usage = e.kv_usage();
          }
        }
        if (ev.finish != FinishReason::kNone) {
          s->done = true;
          if (window_end == 0) window_end = t;
          last_finish = t;
        }
      };
      if (!e.Submit(std::move(r)).ok()) return 1;
    }
    if (!e.RunUntilIdle().ok()) return 1;
    const DecodeEngineStats after = e.stats();
    const bool all_decoding = window_end > window_start;
    if (!all_decoding) {
      window_start = first_token;
      window_end = last_finish;
    }
    int64_t window_tokens = 0;
    std::vector<double> gaps;
    for (const Seq& s : seqs) {
      for (size_t k = 0; k < s.times.size(); ++k) {
        if (s.times[k] >= window_start && s.times[k] <= window_end) ++window_tokens;
        if (k > 0) gaps.push_back(1e3 * (s.times[k] - s.times[k - 1]));
      }
    }
    std::sort(gaps.begin(), gaps.end());
    double mean = 0;
    for (double g : gaps) mean += g;
    mean = gaps.empty() ? 0 : mean / gaps.size();
    const double p99 = gaps.empty() ? 0 : gaps[std::min(gaps.size() - 1, gaps.size() * 99 / 100)];
    const double window = window_end - window_start;
    const double per_slot = static_cast<double>(e.cache().kv_bytes_per_token());
    const double used = usage.slots > 0 ? per_slot * usage.blocks * e.cache().block_tokens() /
                                              static_cast<double>(usage.slots)
                                        : 0;
    std::printf(
        "{\"bench\":\"decode\",\"concurrency\":%d,\"aggregate_tok_s\":%.1f,\"itl_mean_ms\":%.2f,"
        "\"itl_p99_ms\":%.2f,\"kv_bytes_per_token\":%.0f,\"kv_bytes_per_token_theory\":%.0f,"
        "\"window\":\"%s\",\"window_tokens\":%lld,\"window_s\":%.3f,\"prompt_tokens\":%d,"
        "\"new_tokens\":%d,"
        "\"steps\":%lld,\"forward_s\":%.3f,\"step_s\":%.3f,\"precision\":\"%s\",\"kv_cache_dtype\":"
        "\"%s\",\"threads\":%d,\"isa\":\"%s\",\"structured\":%s}\n",
        C, window > 0 ? window_tokens / window : 0.0, mean, p99, used, theory,
        all_decoding ? "all_decoding" : "first_token_to_last_finish",
        static_cast<long long>(window_tokens), window, prompt_n, new_n,
        static_cast<long long>(after.steps - before.steps),
        after.forward_seconds - before.forward_seconds, after.step_seconds - before.step_seconds,
        o.precision.c_str(), KvDtypeName(layout.dtype), ComputeThreads(), IsaName(ActiveIsa()),
        constraint != nullptr ? "true" : "false");
    std::fflush(stdout);
  }

  const int prefix_n = absl::GetFlag(FLAGS_prefix_tokens);
  if (prefix_n > 0) {
    const std::vector<int32_t> prompt = RandomPrompt(prefix_n, rng, c.vocab_size);
    double ttft[2] = {0, 0};
    for (int rep = 0; rep < 2; ++rep) {
      DecodeRequest r;
      r.prompt = prompt;
      r.sampling.temperature = 0;
      r.max_tokens = 1;
      double first = 0;
      r.on_event = [&first](const TokenEvent& ev) {
        if (ev.token >= 0 && first == 0) first = Now();
      };
      const double t0 = Now();
      if (!e.Submit(std::move(r)).ok() || !e.RunUntilIdle().ok()) return 1;
      ttft[rep] = first - t0;
    }
    std::printf(
        "{\"bench\":\"prefix_cache\",\"prompt_tokens\":%d,\"ttft_cold_s\":%.4f,\"ttft_hit_s\":%.4f,"
        "\"speedup\":%.1f,\"hit_slots\":%lld}\n",
        prefix_n, ttft[0], ttft[1], ttft[1] > 0 ? ttft[0] / ttft[1] : 0.0,
        static_cast<long long>(e.stats().prefix_hit_slots));
  }
  return 0;
}

}  // namespace
}  // namespace tripod

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string isa = absl::GetFlag(FLAGS_isa);
  if (isa == "avx2") {
    tripod::SetIsaCap(tripod::IsaLevel::kAvx2);
  } else if (isa == "avx512") {
    tripod::SetIsaCap(tripod::IsaLevel::kAvx512);
  } else if (!isa.empty()) {
    std::fprintf(stderr, "decode: --isa must be avx2 or avx512, got '%s'\n", isa.c_str());
    return 2;
  }
  if (absl::GetFlag(FLAGS_threads) > 0) tripod::SetComputeThreads(absl::GetFlag(FLAGS_threads));
  return tripod::Run();
}
