// `tripod prefill`: one POP prefill of a prompt on a prefill worker's pruned model. Prints one
// JSON line: the plan, resident weight bytes against the full model's, and the timing; with
// --kv_out it writes the KV snapshot (K then V, [layer][kv head][slot][head_dim] of the KV
// element type, float32 under --precision fp32) for the reference tests. With --generate N it
// then decodes N greedy tokens in process (a DecodeEngine imports the KV snapshot and runs the
// last prompt token through the full model): the in-process POP path that the disaggregated
// one is checked against.
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cli/prompt_flags.h"
#include "common/compute/session.h"
#include "common/model/gguf.h"
#include "common/model/model_resolver.h"
#include "common/model/tokenizer.h"
#include "common/util/status_macros.h"
#include "common/util/thread_pool.h"
#include "decode_node/decode_engine.h"
#include "eval/greedy_from_kv.h"
#include "prefill_node/prefill_engine.h"

ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, precision);
ABSL_DECLARE_FLAG(std::string, backend);
ABSL_DECLARE_FLAG(std::string, prompt);
ABSL_DECLARE_FLAG(std::string, ids);
ABSL_DECLARE_FLAG(int, chunk);

ABSL_FLAG(std::string, pop_ratio, "", "prefill: POP pruning ratio, e.g. 1/3 (default 1/3)");
ABSL_FLAG(std::string, pop_layers, "",
          "prefill: skipped layers instead of a ratio, e.g. 20-29 or 3,7 (none: skip nothing)");
ABSL_FLAG(bool, pop_stack_kv, true, "prefill: the skipped layers' K/V as one stacked GEMM");
ABSL_FLAG(bool, compare_full, true, "prefill: also load the full model to report its bytes");
ABSL_FLAG(std::string, kv_out, "", "prefill: write the KV snapshot (K then V) to this file");
ABSL_FLAG(std::string, trim, "none",
          "prefill: KV trimming method (none, speckv, snapkv, pyramidkv, streamingllm, draftmap)");
ABSL_FLAG(int, trim_budget, 0,
          "prefill: KV entries kept per layer and head (PyramidKV: their mean over the layers)");
ABSL_FLAG(int, trim_window, 32, "prefill: SpecKV/SnapKV/PyramidKV observation window");
ABSL_FLAG(std::string, trim_lookahead, "",
          "prefill: SpecKV's lookahead token ids, comma-separated");
ABSL_FLAG(std::string, trim_keep, "", "prefill: the draft map's kept positions, comma-separated");
ABSL_FLAG(int, generate, 0,
          "prefill: then decode this many greedy tokens from the KV snapshot in process "
          "(printed as generated_ids)");

namespace tripod {
namespace {

// Greedy tokens of `prompt` from a DecodeEngine that imports `kv` (tokens 0..n-2) and runs the
// last prompt token itself, as a decode worker does with a transferred KV.
absl::StatusOr<std::vector<int32_t>> GenerateFrom(const PrefillOptions& o,
                                                  const std::vector<int32_t>& prompt,
                                                  const KvSnapshot& kv, int max_tokens) {
  DecodeEngineOptions d;
  d.model_path = o.model_path;
  d.precision = o.precision;
  d.backend = o.backend;
  ASSIGN_OR_RETURN(std::unique_ptr<DecodeEngine> engine, DecodeEngine::Create(d));
  absl::StatusOr<std::vector<int32_t>> ids = GreedyFromKv(*engine, prompt, kv, max_tokens);
  if (!ids.ok()) {
    return absl::Status(ids.status().code(),
                        absl::StrCat("prefill --generate: ", ids.status().message()));
  }
  return ids;
}

}  // namespace

absl::Status PrefillMain() {
  PrefillOptions o;
  ASSIGN_OR_RETURN(o.model_path, ResolveModel(absl::GetFlag(FLAGS_model)));
  o.precision = absl::GetFlag(FLAGS_precision);
  o.backend = absl::GetFlag(FLAGS_backend);
  o.chunk = absl::GetFlag(FLAGS_chunk);
  o.stack_kv = absl::GetFlag(FLAGS_pop_stack_kv);
  ASSIGN_OR_RETURN(o.pop,
                   ParsePopConfig(absl::GetFlag(FLAGS_pop_ratio), absl::GetFlag(FLAGS_pop_layers)));

  ASSIGN_OR_RETURN(const std::vector<int32_t> prompt, PromptFromFlags(o.model_path, "prefill"));

  size_t full_bytes = 0;
  if (absl::GetFlag(FLAGS_compare_full)) {
    ASSIGN_OR_RETURN(full_bytes, FullModelWeightBytes(o.model_path, o.precision));
  }
  TrimPolicy trim;
  ASSIGN_OR_RETURN(trim.method, ParseTrimMethod(absl::GetFlag(FLAGS_trim)));
  trim.budget = absl::GetFlag(FLAGS_trim_budget);
  trim.window = absl::GetFlag(FLAGS_trim_window);
  ASSIGN_OR_RETURN(trim.lookahead,
                   ParseIdList(absl::GetFlag(FLAGS_trim_lookahead), "prefill", "lookahead id"));
  ASSIGN_OR_RETURN(trim.keep,
                   ParseIdList(absl::GetFlag(FLAGS_trim_keep), "prefill", "kept position"));
  ASSIGN_OR_RETURN(std::unique_ptr<PrefillEngine> engine, PrefillEngine::Create(o));
  ASSIGN_OR_RETURN(PrefillResult r, engine->RunTrimmed(prompt, trim));

  const std::string kv_out = absl::GetFlag(FLAGS_kv_out);
  if (!kv_out.empty()) {
    std::ofstream f(kv_out, std::ios::binary);
    f.write(reinterpret_cast<const char*>(r.kv.k.data()),
            static_cast<std::streamsize>(r.kv.k.size()));
    f.write(reinterpret_cast<const char*>(r.kv.v.data()),
            static_cast<std::streamsize>(r.kv.v.size()));
    if (!f) return absl::InternalError(absl::StrCat("prefill: cannot write ", kv_out));
  }
  std::vector<int32_t> generated;
  const int n_generate = absl::GetFlag(FLAGS_generate);
  if (n_generate > 0) {
    ASSIGN_OR_RETURN(generated, GenerateFrom(o, prompt, r.kv, n_generate));
  }

  const ModelConfig& c = engine->model().config;
  const size_t pop_bytes = engine->resident_weight_bytes();
  std::printf(
      "{\"command\":\"prefill\",\"model\":\"%s\",\"backend\":\"%s\",\"threads\":%d,"
      "\"plan\":\"%s\",\"skipped\":\"%s\",\"prompt_tokens\":%zu,\"prefilled_tokens\":%d,"
      "\"last_token\":%d,\"last_position\":%d,\"resident_weight_bytes\":%zu,",
      o.model_path.c_str(), engine->backend().name().c_str(), ComputeThreads(),
      engine->plan().DebugString().c_str(),
      DescribeSkipped(engine->skipped_layers(), c.n_layers).c_str(), prompt.size(),
      r.prefilled_tokens, r.last_token, r.last_position, pop_bytes);
  if (full_bytes > 0) {
    std::printf("\"full_model_weight_bytes\":%zu,\"resident_fraction\":%.3f,", full_bytes,
                static_cast<double>(pop_bytes) / static_cast<double>(full_bytes));
  }
  if (n_generate > 0) {
    std::printf("\"generated_ids\":[");
    for (size_t i = 0; i < generated.size(); ++i) std::printf(i ? ",%d" : "%d", generated[i]);
    std::printf("],");
  }
  std::printf(
      "\"trim\":\"%s\",\"kv_slots\":%d,\"kv_bytes\":%zu,\"chunks\":%d,\"forward_s\":%.4f,"
      "\"tok_s\":%.1f,\"export_s\":%.4f}\n",
      TrimMethodName(trim.method), r.kv.n_slots, r.kv.kept_bytes(), r.chunks, r.forward_s,
      r.forward_s > 0 ? r.prefilled_tokens / r.forward_s : 0.0, r.export_s);
  return absl::OkStatus();
}

}  // namespace tripod
