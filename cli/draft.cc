// `tripod draft`: one draft pass over a prompt, as a draft worker runs it (DraftEngine). Prints
// one JSON line: the draft's depth and first scored layer, SpecPC's per-token scores (steps 1-3)
// and kept positions for --budget, the greedy lookahead tokens, and the timing. The reference
// test checks the scores against attention computed in NumPy.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cli/prompt_flags.h"
#include "common/model/gguf.h"
#include "common/model/model_resolver.h"
#include "common/model/tokenizer.h"
#include "common/util/status_macros.h"
#include "draft_node/draft_engine.h"

ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, precision);
ABSL_DECLARE_FLAG(std::string, backend);
ABSL_DECLARE_FLAG(std::string, prompt);
ABSL_DECLARE_FLAG(std::string, ids);
ABSL_DECLARE_FLAG(int, chunk);

ABSL_FLAG(int, draft_layers, 0,
          "draft: self-draft depth, the first N layers of --model (0: --model is the draft, run "
          "in full); serve: the draft workers' self-draft depth (0: tripod-draft's default, 8)");
ABSL_FLAG(std::string, lookahead_layers, "all",
          "draft, eval-longctx, serve: a self-draft's depth for SpecKV's lookahead: all or N >= "
          "--draft_layers (as tripod-draft's)");
ABSL_FLAG(std::string, draft_target, "", "draft: target model whose vocabulary must match");
ABSL_FLAG(int, window, 64, "draft: SpecPC window w (queries scored, positions always kept)");
ABSL_FLAG(int, budget, 0, "draft: SpecPC budget in tokens (0: scores only)");
ABSL_FLAG(int, first_layer, -1, "draft: first scored layer l_0 (-1: 8, or half a shallow draft)");
ABSL_FLAG(int, pool, 32, "draft: SpecPC max-pool kernel");
ABSL_FLAG(int, neighbourhood, 32, "draft: SpecPC neighbourhood kept around each seed");
ABSL_FLAG(int, lookahead, 0, "draft: greedy lookahead tokens (SpecKV)");

namespace tripod {

absl::Status DraftMain() {
  DraftEngineOptions o;
  ASSIGN_OR_RETURN(o.model_path, ResolveModel(absl::GetFlag(FLAGS_model)));
  o.self_draft_layers = absl::GetFlag(FLAGS_draft_layers);
  ASSIGN_OR_RETURN(o.lookahead_layers, ParseLookaheadLayers(absl::GetFlag(FLAGS_lookahead_layers)));
  if (!absl::GetFlag(FLAGS_draft_target).empty()) {
    ASSIGN_OR_RETURN(o.target_model_path, ResolveModel(absl::GetFlag(FLAGS_draft_target)));
  }
  o.precision = absl::GetFlag(FLAGS_precision);
  o.backend = absl::GetFlag(FLAGS_backend);
  o.prefill_chunk = absl::GetFlag(FLAGS_chunk);

  DraftRequest r;
  ASSIGN_OR_RETURN(r.prompt, PromptFromFlags(o.model_path, "draft"));
  r.specpc.window = absl::GetFlag(FLAGS_window);
  r.specpc.budget = absl::GetFlag(FLAGS_budget);
  r.specpc.pool_kernel = absl::GetFlag(FLAGS_pool);
  r.specpc.neighbourhood = absl::GetFlag(FLAGS_neighbourhood);
  r.first_layer = absl::GetFlag(FLAGS_first_layer);
  r.lookahead = absl::GetFlag(FLAGS_lookahead);
  if (r.specpc.pool_kernel <= 0 || r.specpc.neighbourhood <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("draft: --pool and --neighbourhood must be positive, got ",
                     r.specpc.pool_kernel, " and ", r.specpc.neighbourhood));
  }
  o.context_tokens = static_cast<int>(r.prompt.size()) + std::max(0, r.lookahead);
  ASSIGN_OR_RETURN(std::unique_ptr<DraftEngine> engine, DraftEngine::Create(o));
  ASSIGN_OR_RETURN(DraftResult d, engine->Score(r));
  nlohmann::json j;
  j["command"] = "draft";
  j["model"] = o.model_path;
  j["depth"] = engine->depth();
  j["first_layer"] = d.first_layer;
  j["prompt_tokens"] = r.prompt.size();
  j["window"] = r.specpc.window;
  j["budget"] = r.specpc.budget;
  j["token_scores"] = d.token_scores;
  j["keep"] = d.keep;
  j["lookahead"] = d.lookahead;
  j["prefill_s"] = d.prefill_s;
  j["lookahead_s"] = d.lookahead_s;
  std::printf("%s\n", j.dump().c_str());
  return absl::OkStatus();
}

}  // namespace tripod
