// bench/forward: single-stream prefill and decode speed of the forward pass. One JSON line per
// prompt length: prefill tokens/s over the whole prompt, then decode tokens/s over
// --decode_tokens greedy steps after it (so the 2048 line is decode at a 2048-token context).
// Prompts are pseudo-random token ids, as llama-bench uses; timings are best of --reps.
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
#include "common/compute/cpu/cpu_features.h"
#include "common/compute/session.h"
#include "common/model/model_resolver.h"
#include "common/util/thread_pool.h"

ABSL_FLAG(std::string, model, "",
          "a GGUF file or a model catalogue name (scripts/fetch_model --list); default: the "
          "bundled model");
ABSL_FLAG(int, threads, 0, "compute threads (default: all cores)");
ABSL_FLAG(std::string, isa, "",
          "cap the kernels' instruction set (avx2, avx512): an AVX2-only CPU's paths on this one");
ABSL_FLAG(std::string, precision, "auto", "fp32 | bf16 | int8 | int16 | auto");
ABSL_FLAG(std::string, kv_cache_dtype, "auto", "auto | f32 | f16 | bf16 | q8_0");
ABSL_FLAG(std::string, lengths, "128,512,2048", "prompt lengths");
ABSL_FLAG(int, decode_tokens, 128, "greedy tokens decoded after each prompt");
ABSL_FLAG(int, reps, 2, "repetitions (the best is reported, and the mean rates as *_mean)");
ABSL_FLAG(int, chunk, tripod::SessionOptions{}.prefill_chunk,
          "prefill chunk size (default: the session's)");

namespace tripod {
namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

int Argmax(const std::vector<float>& v) {
  return static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin());
}

int Run() {
  SessionOptions o;
  if (absl::StatusOr<std::string> model = ResolveModel(absl::GetFlag(FLAGS_model)); model.ok()) {
    o.model_path = *model;
  } else {
    std::fprintf(stderr, "forward: %s\n", model.status().ToString().c_str());
    return 1;
  }
  o.precision = absl::GetFlag(FLAGS_precision);
  o.kv_cache_dtype = absl::GetFlag(FLAGS_kv_cache_dtype);
  o.prefill_chunk = absl::GetFlag(FLAGS_chunk);
  std::vector<int> lengths;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_lengths), ',')) {
    int n;
    if (absl::SimpleAtoi(s, &n) && n > 0) lengths.push_back(n);
  }
  if (lengths.empty()) {
    std::fprintf(stderr, "forward: --lengths needs at least one positive length\n");
    return 1;
  }
  const int decode = absl::GetFlag(FLAGS_decode_tokens);
  // Room for the longest prompt and its decode, and for the 65-token warm-up below.
  constexpr int kWarmTokens = 64;
  o.context_tokens =
      std::max(*std::max_element(lengths.begin(), lengths.end()) + decode + 1, kWarmTokens + 1);
  auto session = Session::Open(o);
  if (!session.ok()) {
    std::fprintf(stderr, "forward: %s\n", session.status().ToString().c_str());
    return 1;
  }
  Session& s = **session;
  const int vocab = s.model().config.vocab_size;
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int> tok(100, vocab - 1);
  {  // Warm-up: prepares (prepacks) the GEMM weights, outside the timings.
    std::vector<int32_t> warm(kWarmTokens);
    for (int32_t& t : warm) t = tok(rng);
    s.Truncate(0);
    for (const std::vector<int32_t>& part : {warm, std::vector<int32_t>{warm[0]}}) {
      if (auto r = s.Append(part); !r.ok()) {
        std::fprintf(stderr, "forward: warm-up: %s\n", r.status().ToString().c_str());
        return 1;
      }
    }
  }
  for (int n : lengths) {
    std::vector<int32_t> prompt(n);
    for (int32_t& t : prompt) t = tok(rng);
    double best_prefill = 1e30, best_decode = 1e30, sum_prefill_rate = 0, sum_decode_rate = 0;
    const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
    for (int rep = 0; rep < reps; ++rep) {
      s.Truncate(0);
      const auto t0 = Clock::now();
      auto logits = s.Append(prompt);
      const auto t1 = Clock::now();
      if (!logits.ok()) {
        std::fprintf(stderr, "forward: %s\n", logits.status().ToString().c_str());
        return 1;
      }
      int next = Argmax(*logits);
      for (int i = 0; i < decode; ++i) {
        auto l = s.Append({next});
        if (!l.ok()) {
          std::fprintf(stderr, "forward: %s\n", l.status().ToString().c_str());
          return 1;
        }
        next = Argmax(*l);
      }
      const auto t2 = Clock::now();
      best_prefill = std::min(best_prefill, Seconds(t0, t1));
      best_decode = std::min(best_decode, Seconds(t1, t2));
      sum_prefill_rate += n / Seconds(t0, t1);
      sum_decode_rate += decode / Seconds(t1, t2);
    }
    std::printf(
        "{\"bench\":\"forward\",\"model\":\"%s\",\"backend\":\"%s\",\"precision\":\"%s\","
        "\"kv_cache_dtype\":\"%s\",\"threads\":%d,\"prompt_tokens\":%d,\"prefill_s\":%.4f,"
        "\"prefill_tok_s\":%.1f,\"prefill_tok_s_mean\":%.1f,"
        "\"decode_tokens\":%d,\"decode_tok_s\":%.1f,\"decode_tok_s_mean\":%.1f}\n",
        s.model().gguf->path().c_str(), s.backend().name().c_str(), o.precision.c_str(),
        KvDtypeName(s.kv_dtype()), ComputeThreads(), n, best_prefill, n / best_prefill,
        sum_prefill_rate / reps, decode, decode / best_decode, sum_decode_rate / reps);
    std::fflush(stdout);
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
    std::fprintf(stderr, "forward: --isa must be avx2 or avx512, got '%s'\n", isa.c_str());
    return 2;
  }
  if (absl::GetFlag(FLAGS_threads) > 0) tripod::SetComputeThreads(absl::GetFlag(FLAGS_threads));
  return tripod::Run();
}
