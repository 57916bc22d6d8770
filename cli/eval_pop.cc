// `tripod eval-pop`: POP's quality against the full model and its controls on the evaluation
// corpus (eval/pop/pop_eval.h); prints JSON.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/compute/cpu/cpu_backend.h"
#include "common/compute/model.h"
#include "common/compute/session.h"
#include "common/model/model_resolver.h"
#include "common/model/tokenizer.h"
#include "common/util/status_macros.h"
#include "eval/pop/corpus_windows.h"
#include "eval/pop/pop_eval.h"

ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, precision);
ABSL_DECLARE_FLAG(std::string, out);
ABSL_DECLARE_FLAG(uint64_t, seed);
ABSL_DECLARE_FLAG(std::string, corpus);

ABSL_FLAG(int, prompts, 100, "eval-pop: number of prompts");
ABSL_FLAG(int, min_tokens, 256, "eval-pop: shortest prompt (tokens)");
ABSL_FLAG(int, continuation_tokens, 32, "eval-pop: teacher-forced continuation tokens");
ABSL_FLAG(int, generate_tokens, 32, "eval-pop: greedy tokens compared with the full model");
ABSL_FLAG(std::string, configs, "",
          "eval-pop: comma-separated KIND:RATIO (pop, shortgpt, noboundary, nokv), e.g. "
          "pop:0.25,nokv:1/3 (default: POP at 0, 0.2, 0.25, 1/3, 0.4, 0.5 and the three "
          "controls at 1/3)");
ABSL_DECLARE_FLAG(int, max_tokens);
ABSL_FLAG(std::string, shard, "",
          "eval-pop: I/N evaluates prompts i with i % N == I (run N processes, then --merge)");
ABSL_FLAG(std::string, length_spread, "linear",
          "eval-pop: prompt lengths spread evenly (linear) or evenly in log-length (log)");
ABSL_FLAG(std::string, merge, "",
          "eval-pop: comma-separated JSON outputs of shards to merge into one result");

namespace tripod {
namespace {

absl::Status Emit(const nlohmann::json& j) {
  const std::string dump = j.dump(1);
  std::printf("%s\n", dump.c_str());
  if (!absl::GetFlag(FLAGS_out).empty()) {
    std::ofstream f(absl::GetFlag(FLAGS_out));
    f << dump << "\n";
    if (!f) return absl::InternalError(absl::StrCat("cannot write ", absl::GetFlag(FLAGS_out)));
  }
  return absl::OkStatus();
}

absl::Status Merge() {
  std::vector<nlohmann::json> shards;
  for (absl::string_view p : absl::StrSplit(absl::GetFlag(FLAGS_merge), ',', absl::SkipEmpty())) {
    ASSIGN_OR_RETURN(std::string text, ReadTextFile(std::string(p)));
    nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(p, ": not JSON"));
    shards.push_back(std::move(j));
  }
  ASSIGN_OR_RETURN(PopEvalResult res, MergePopEvalJson(shards));
  nlohmann::json j = PopEvalToJson(res);
  for (const char* key : {"model", "corpus", "precision", "seed", "lengths"}) {
    if (shards[0].contains(key)) j[key] = shards[0][key];
  }
  j["shards"] = shards.size();
  return Emit(j);
}

// Prompt lengths: evenly spread (linear) or evenly spread in log-length (more short prompts,
// the same range; cheaper). Both shuffled with the seed.
std::vector<int> Lengths(int n, int lo, int hi, uint64_t seed, bool log_spread) {
  std::vector<int> l = SpreadLengths(n, lo, hi, seed);
  if (!log_spread) return l;
  for (int& x : l) {
    const double f = hi == lo ? 0.0 : static_cast<double>(x - lo) / (hi - lo);
    x = static_cast<int>(std::lround(lo * std::pow(static_cast<double>(hi) / lo, f)));
  }
  return l;
}

}  // namespace

// --max-tokens is generate's flag (default 256); for eval-pop it is the longest prompt, 2048
// unless given.
absl::Status EvalPopMain(int argc, char** argv) {
  if (!absl::GetFlag(FLAGS_merge).empty()) return Merge();
  bool max_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    max_given |= a.rfind("--max-tokens", 0) == 0 || a.rfind("--max_tokens", 0) == 0;
  }
  const std::string corpus_path =
      absl::GetFlag(FLAGS_corpus).empty() ? "data/corpus/eval.txt" : absl::GetFlag(FLAGS_corpus);
  ASSIGN_OR_RETURN(std::string text, ReadTextFile(corpus_path));
  std::vector<PopMethod> methods = DefaultPopMethods();
  if (!absl::GetFlag(FLAGS_configs).empty()) {
    ASSIGN_OR_RETURN(methods, ParsePopMethods(absl::GetFlag(FLAGS_configs)));
  }
  const int n = absl::GetFlag(FLAGS_prompts);
  const int lo = absl::GetFlag(FLAGS_min_tokens);
  const int hi = max_given ? absl::GetFlag(FLAGS_max_tokens) : 2048;
  if (n < 1 || lo < 3 || hi < lo) {
    return absl::InvalidArgumentError(
        absl::StrCat("need --prompts >= 1 and 3 <= --min-tokens <= --max-tokens (got ", n, ", ", lo,
                     ", ", hi, ")"));
  }
  if (absl::GetFlag(FLAGS_continuation_tokens) < 1 || absl::GetFlag(FLAGS_generate_tokens) < 1) {
    return absl::InvalidArgumentError("--continuation-tokens and --generate-tokens must be >= 1");
  }
  const std::string lengths = absl::GetFlag(FLAGS_length_spread);
  if (lengths != "linear" && lengths != "log") {
    return absl::InvalidArgumentError("--lengths must be linear or log");
  }
  const std::string precision = absl::GetFlag(FLAGS_precision);
  ASSIGN_OR_RETURN(CpuBackendOptions cpu, CpuOptionsForPrecision(precision));
  std::unique_ptr<Backend> backend = MakeCpuBackend(cpu);
  ASSIGN_OR_RETURN(const std::string path, ResolveModel(absl::GetFlag(FLAGS_model)));
  ASSIGN_OR_RETURN(std::unique_ptr<LoadedModel> model, LoadModel(path, *backend));
  ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, Tokenizer::FromGguf(*model->gguf));
  ASSIGN_OR_RETURN(
      std::vector<CorpusWindow> windows,
      CutWindows(*tok, text, Lengths(n, lo, hi, absl::GetFlag(FLAGS_seed), lengths == "log"),
                 absl::GetFlag(FLAGS_continuation_tokens)));
  if (!absl::GetFlag(FLAGS_shard).empty()) {
    int si = 0, sn = 0;
    if (std::sscanf(absl::GetFlag(FLAGS_shard).c_str(), "%d/%d", &si, &sn) != 2 || sn < 1 ||
        si < 0 || si >= sn) {
      return absl::InvalidArgumentError("--shard must be I/N with 0 <= I < N");
    }
    std::vector<CorpusWindow> mine;
    for (size_t i = si; i < windows.size(); i += sn) mine.push_back(std::move(windows[i]));
    windows = std::move(mine);
  }
  PopEvalOptions opt;
  opt.generate_tokens = absl::GetFlag(FLAGS_generate_tokens);
  opt.kv_dtype = precision == "fp32" ? KvDtype::kF32 : KvDtype::kF16;
  const int count = static_cast<int>(windows.size());
  std::fprintf(stderr, "eval-pop: %d prompts of %d..%d tokens (%s), %zu configs, corpus %s\n",
               count, lo, hi, lengths.c_str(), methods.size(), corpus_path.c_str());
  ASSIGN_OR_RETURN(PopEvalResult res, EvalPop(*model, *backend, windows, methods, opt, [&](int i) {
                     std::fprintf(stderr, "\reval-pop: %d / %d prompts", i + 1, count);
                     std::fflush(stderr);
                   }));
  std::fprintf(stderr, "\n");
  nlohmann::json j = PopEvalToJson(res);
  j["model"] = path;
  j["corpus"] = corpus_path;
  j["precision"] = precision;
  j["seed"] = absl::GetFlag(FLAGS_seed);
  j["lengths"] = lengths;
  if (!absl::GetFlag(FLAGS_shard).empty()) j["shard"] = absl::GetFlag(FLAGS_shard);
  return Emit(j);
}

}  // namespace tripod
