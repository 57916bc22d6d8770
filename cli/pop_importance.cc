// `tripod pop-importance`: stage-aware layer importance for POP on calibration prompts
// (eval/pop/pop_importance.h); writes JSON to --out and prints a table.
#include "eval/pop/pop_importance.h"

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/compute/cpu/cpu_backend.h"
#include "common/compute/model.h"
#include "common/compute/session.h"
#include "common/model/model_resolver.h"
#include "common/model/tokenizer.h"
#include "common/util/status_macros.h"
#include "eval/pop/corpus_windows.h"

ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, precision);
ABSL_DECLARE_FLAG(std::string, out);
ABSL_DECLARE_FLAG(uint64_t, seed);

ABSL_FLAG(std::string, corpus, "",
          "pop-importance / eval-pop: text corpus (default data/corpus/calib.txt, eval.txt)");
ABSL_FLAG(int, samples, 16,
          "pop-importance: calibration prompts; eval-longctx: samples per task and length");
ABSL_FLAG(int, prompt_tokens, 256, "pop-importance: tokens per calibration prompt");
ABSL_FLAG(int, answer_tokens, 32, "pop-importance: answer tokens sampled from the model");
ABSL_FLAG(double, eps, 0.05, "pop-importance: finite-difference step of the gates");

namespace tripod {

absl::Status PopImportanceMain() {
  const std::string corpus_path =
      absl::GetFlag(FLAGS_corpus).empty() ? "data/corpus/calib.txt" : absl::GetFlag(FLAGS_corpus);
  ASSIGN_OR_RETURN(std::string text, ReadTextFile(corpus_path));
  const int n = absl::GetFlag(FLAGS_samples), len = absl::GetFlag(FLAGS_prompt_tokens);
  if (n < 1 || len < 3 || absl::GetFlag(FLAGS_answer_tokens) < 1) {
    return absl::InvalidArgumentError(
        "need --samples >= 1, --prompt-tokens >= 3 and --answer-tokens >= 1");
  }
  // Central differences need arithmetic that is smooth in the gates: bf16 rounding noise is as
  // large as the loss changes being measured, so "auto" means fp32 here.
  const std::string flag = absl::GetFlag(FLAGS_precision);
  const std::string precision = flag == "auto" ? "fp32" : flag;
  ASSIGN_OR_RETURN(CpuBackendOptions cpu, CpuOptionsForPrecision(precision));
  std::unique_ptr<Backend> backend = MakeCpuBackend(cpu);
  ASSIGN_OR_RETURN(const std::string path, ResolveModel(absl::GetFlag(FLAGS_model)));
  ASSIGN_OR_RETURN(std::unique_ptr<LoadedModel> model, LoadModel(path, *backend));
  ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, Tokenizer::FromGguf(*model->gguf));
  ASSIGN_OR_RETURN(std::vector<CorpusWindow> windows,
                   CutWindows(*tok, text, std::vector<int>(n, len), 0));
  std::vector<std::vector<int32_t>> prompts;
  for (CorpusWindow& w : windows) prompts.push_back(std::move(w.prompt));
  PopImportanceOptions opt;
  opt.answer_tokens = absl::GetFlag(FLAGS_answer_tokens);
  opt.eps = absl::GetFlag(FLAGS_eps);
  opt.seed = absl::GetFlag(FLAGS_seed);
  // fp32 KV: the finite differences should see the gates, not f16 rounding.
  opt.kv_dtype = KvDtype::kF32;
  std::fprintf(stderr, "pop-importance: %d samples of %d tokens, corpus %s\n", n, len,
               corpus_path.c_str());
  ASSIGN_OR_RETURN(PopImportanceResult res,
                   PopImportance(*model, *backend, prompts, opt, [&](int i) {
                     std::fprintf(stderr, "\rpop-importance: %d / %d samples", i + 1, n);
                     std::fflush(stderr);
                   }));
  std::fprintf(stderr, "\n");
  nlohmann::json j = PopImportanceToJson(res);
  j["model"] = path;
  j["corpus"] = corpus_path;
  j["precision"] = precision;
  if (!absl::GetFlag(FLAGS_out).empty()) {
    std::ofstream f(absl::GetFlag(FLAGS_out));
    f << j.dump(1) << "\n";
    if (!f) return absl::InternalError(absl::StrCat("cannot write ", absl::GetFlag(FLAGS_out)));
  } else {
    std::printf("%s\n", j.dump(1).c_str());
  }
  std::printf("%s", PopImportanceTable(res).c_str());
  return absl::OkStatus();
}

}  // namespace tripod
