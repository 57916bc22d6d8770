// `tripod eval-longctx`'s harness: one long-context sample (longctx_tasks.h) through the full KV
// and every compression method at each budget, with POP on and off, in one process on the same
// engines the workers run: the draft engine's importance map, the prefill engine's (trimmed) KV,
// the decode engine generating greedily from it as a decode worker does from a transfer. The
// draft runs once per sample and the scored prefill once per sample and POP setting; each budget
// selects from them, exactly as the service would at that budget (the selection depends on the
// budget alone).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "decode_node/decode_engine.h"
#include "draft_node/draft_engine.h"
#include "eval/longctx_tasks.h"
#include "prefill_node/prefill_engine.h"

namespace tripod {

struct LongCtxOptions {
  std::string model_path;  // empty: the bundled model
  std::string precision = "auto";
  std::string backend = "cpu";  // every engine's (MakeBackend)
  // A separate draft model (a GGUF of the target's vocabulary, run in full, as `tripod serve`'s
  // draft workers run the catalogue's draft); empty: a self-draft of model_path.
  std::string draft_model_path;
  int draft_layers = 8;               // the self-draft's depth (as tripod-draft's default)
  int lookahead_layers = kAllLayers;  // its depth for SpecKV's lookahead (as tripod-draft's)
  int chunk = 512;                    // prefill chunk
  std::string pop_ratio = "1/3";      // the POP-on rows' plan
  int trim_window = 32;               // SpecKV / SnapKV observation window (as the scheduler's)
  int trim_pool = 7;          // SpecKV / SnapKV max-pool of the scores (the worker's default)
  int speckv_lookahead = 64;  // at most; also at most the task's answer length
};

// "full", "speckv", "specpc", "draftmap", "snapkv", "pyramidkv", "streamingllm", "keeplast".
const std::vector<std::string>& LongCtxMethodNames();

struct LongCtxRow {
  std::string task;
  int length = 0;         // the target length; prompt_tokens is the sample's own
  std::string method;     // "full" or a method
  double budget = 1.0;    // fraction of the prompt (1 for full)
  int budget_tokens = 0;  // KV entries per layer and head (SpecPC: prompt tokens)
  bool pop = false;
  int pop_kv_only_layers = 0;  // the prefill plan's layers that only projected their K/V
  int prompt_tokens = 0;
  double accuracy = 0;
  double prefill_s = 0;  // the prefill's forward passes (SpecPC: of the kept prompt)
  double draft_s = 0;    // the draft's map (0 for methods without a draft)
  int64_t kv_bytes = 0;  // the KV a prefill worker would send
  std::string output;
};

class LongCtxEvaluator {
 public:
  static absl::StatusOr<std::unique_ptr<LongCtxEvaluator>> Create(const LongCtxOptions& options);

  // Rows for `sample`: "full" once per POP setting, every other method of `methods` once per
  // budget (fractions of the prompt) and POP setting.
  absl::StatusOr<std::vector<LongCtxRow>> Evaluate(const LongCtxSample& sample,
                                                   const std::vector<std::string>& methods,
                                                   const std::vector<double>& budgets,
                                                   const std::vector<bool>& pops);

  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const std::string& model_path() const { return options_.model_path; }

 private:
  LongCtxEvaluator() = default;
  // Greedy text from the decode engine importing `kv` (prompt[0..n-2]).
  absl::StatusOr<std::string> Generate(const std::vector<int32_t>& prompt, const KvSnapshot& kv,
                                       int max_tokens);

  LongCtxOptions options_;
  std::unique_ptr<GgufFile> gguf_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<PrefillEngine> prefill_;  // full weights: runs POP plans and the full one
  std::unique_ptr<DraftEngine> draft_;
  std::unique_ptr<DecodeEngine> decode_;
  ForwardPlan pop_plan_;
};

}  // namespace tripod
