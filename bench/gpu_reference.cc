// The CPU side of bench/gpu_check.sh: the bundled model on the exact fp32 CPU path, greedy
// tokens and the logits after the prompt, written as JSON for gpu_check to compare against on
// the GPU machine (which runs no CPU reference itself: its binary carries no oneDNN).
//   gpu_reference --model M --out ref.json
#include <chrono>
#include <cstdio>
#include <fstream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/gpu_check_common.h"
#include "common/compute/cpu/cpu_backend.h"
#include "common/model/model_resolver.h"
#include "common/model/tokenizer.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, model, "",
          "a GGUF file or a model catalogue name (scripts/fetch_model --list); default: the "
          "bundled model");
ABSL_FLAG(std::string, out, "gpu_reference.json", "output JSON");

namespace tripod {
namespace {

absl::Status Run() {
  ASSIGN_OR_RETURN(const std::string path, ResolveModel(absl::GetFlag(FLAGS_model)));
  ASSIGN_OR_RETURN(CpuBackendOptions opts, CpuOptionsForPrecision("fp32"));
  std::unique_ptr<Backend> backend = MakeCpuBackend(opts);
  ASSIGN_OR_RETURN(std::unique_ptr<LoadedModel> m, LoadModel(path, *backend));
  ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, Tokenizer::FromGguf(*m->gguf));
  std::vector<int32_t> prompt = tok->Encode(gpu_check::kPrompt);
  ASSIGN_OR_RETURN(gpu_check::GreedyRun run,
                   gpu_check::RunGreedy<std::chrono::steady_clock>(
                       *m, *backend, prompt, gpu_check::kGreedyTokens, KvDtype::kF32));
  // The draft engine on the CPU (fp32): what the GPU's draft must agree with.
  DraftEngineOptions dopt = gpu_check::DraftOptions(path);
  dopt.precision = "fp32";
  ASSIGN_OR_RETURN(std::unique_ptr<DraftEngine> draft, DraftEngine::Create(dopt));
  ASSIGN_OR_RETURN(DraftResult dr, draft->Score(gpu_check::DraftRequestFor(prompt)));
  nlohmann::json j;
  j["draft"] = {{"token_scores", dr.token_scores}, {"keep", dr.keep}, {"lookahead", dr.lookahead}};
  j["model"] = path;
  j["path"] = "cpu fp32, f32 KV";
  j["prompt_ids"] = prompt;
  j["greedy"] = run.tokens;
  // What the API answers for the first k greedy tokens (bench/gpu_serve_check.py), k = 0..32.
  std::vector<std::string> texts;
  for (size_t k = 0; k <= run.tokens.size(); ++k) {
    texts.push_back(tok->Decode(std::span<const int32_t>(run.tokens.data(), k)));
  }
  j["greedy_texts"] = texts;
  j["first_logits"] = run.first_logits;
  std::ofstream(absl::GetFlag(FLAGS_out)) << j.dump();
  std::printf("reference: %zu prompt tokens, %zu greedy tokens -> %s\n", prompt.size(),
              run.tokens.size(), absl::GetFlag(FLAGS_out).c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace tripod

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::Status s = tripod::Run(); !s.ok()) {
    std::fprintf(stderr, "gpu_reference: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
