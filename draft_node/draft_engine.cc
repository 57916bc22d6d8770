#include "draft_node/draft_engine.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/kv/kv_dtype.h"
#include "common/model/bundled_model.h"
#include "common/model/gguf.h"
#include "common/model/model_config.h"
#include "common/model/vocabulary_match.h"
#include "common/util/status_macros.h"

namespace tripod {
namespace {

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int32_t Argmax(const std::vector<float>& logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

}  // namespace

absl::StatusOr<int> ParseLookaheadLayers(const std::string& text) {
  if (text == "all") return kAllLayers;
  int n = 0;
  if (!absl::SimpleAtoi(text, &n) || n <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "draft: lookahead layers must be 'all' or a positive layer count, got '", text, "'"));
  }
  return n;
}

int DefaultFirstLayer(int depth) { return depth < 16 ? depth / 2 : 8; }

absl::StatusOr<std::unique_ptr<DraftEngine>> DraftEngine::Create(const DraftEngineOptions& options,
                                                                 std::unique_ptr<Backend> backend,
                                                                 KvDtype kv) {
  if (options.prefill_chunk <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("draft: prefill chunk must be positive, got ", options.prefill_chunk));
  }
  std::unique_ptr<DraftEngine> e(new DraftEngine());
  e->options_ = options;
  const std::string path = options.model_path.empty() ? BundledModelPath() : options.model_path;
  ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::Open(path));
  ASSIGN_OR_RETURN(ModelConfig config, ReadModelConfig(*gguf));
  gguf.reset();
  if (options.self_draft_layers < 0 || options.self_draft_layers > config.n_layers) {
    return absl::InvalidArgumentError(absl::StrCat("draft: self-draft layers must be in [1, ",
                                                   config.n_layers, "], got ",
                                                   options.self_draft_layers));
  }
  e->depth_ = options.self_draft_layers > 0 ? options.self_draft_layers : config.n_layers;
  const int look = options.lookahead_layers;
  if (options.self_draft_layers == 0 && look > 0 && look != config.n_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "draft: lookahead layers apply to a self-draft; a separate draft model runs in full (",
        config.n_layers, " layers), got ", look));
  }
  if (look < kAllLayers || (look > 0 && (look < e->depth_ || look > config.n_layers))) {
    return absl::InvalidArgumentError(
        absl::StrCat("draft: lookahead layers must be in [", e->depth_, ", ", config.n_layers,
                     "] (the self-draft's depth to the model's) or all, got ", look));
  }
  e->lookahead_depth_ = look == kAllLayers ? config.n_layers : look == 0 ? e->depth_ : look;
  if (!options.target_model_path.empty() && options.target_model_path != path) {
    RETURN_IF_ERROR(CheckSameVocabulary(path, options.target_model_path));
  }
  RETURN_IF_ERROR(backend->Supports(config, kv));
  e->backend_ = std::move(backend);
  WeightSelection selection;
  selection.layers.assign(config.n_layers, LayerNeed::kFull);
  for (int l = e->lookahead_depth_; l < config.n_layers; ++l) {
    selection.layers[l] = LayerNeed::kNone;
  }
  ASSIGN_OR_RETURN(e->model_, LoadModel(path, *e->backend_, selection));
  e->plan_ = ForwardPlan::SelfDraft(config.n_layers, e->depth_);
  e->lookahead_plan_ = ForwardPlan::SelfDraft(config.n_layers, e->lookahead_depth_);
  KvLayout layout;
  layout.n_layers = config.n_layers;
  layout.n_kv_heads = config.n_kv_heads;
  layout.head_dim = config.head_dim;
  layout.dtype = kv;
  e->kv_layout_ = layout;
  e->context_ = options.context_tokens > 0 ? options.context_tokens : config.context_length;
  e->ws_ = std::make_unique<ForwardWorkspace>(*e->backend_);
  return e;
}

absl::StatusOr<DraftResult> DraftEngine::Score(const DraftRequest& r, const CancelToken* cancel) {
  const ModelConfig& c = model_->config;
  const int n = static_cast<int>(r.prompt.size());
  if (n == 0) return absl::InvalidArgumentError("draft: empty prompt");
  if (r.lookahead < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("draft: lookahead must be >= 0, got ", r.lookahead));
  }
  if (r.specpc.window <= 0 || r.specpc.budget < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("draft: window must be positive and budget >= 0, got window ", r.specpc.window,
                     ", budget ", r.specpc.budget));
  }
  if (n + r.lookahead > context_) {
    return absl::OutOfRangeError(absl::StrCat("draft: ", n, " prompt + ", r.lookahead,
                                              " lookahead tokens exceed the draft's context of ",
                                              context_));
  }
  for (int i = 0; i < n; ++i) {
    if (r.prompt[i] < 0 || r.prompt[i] >= c.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("draft: token id ", r.prompt[i], " at position ", i,
                       " is outside the vocabulary [0, ", c.vocab_size, ")"));
    }
  }
  DraftResult out;
  out.first_layer = r.first_layer >= 0 ? r.first_layer : DefaultFirstLayer(depth_);
  if (out.first_layer >= depth_) {
    return absl::InvalidArgumentError(absl::StrCat("draft: first scored layer ", out.first_layer,
                                                   " is past the draft's ", depth_, " layers"));
  }
  MutexLock lock(&mu_);
  const auto t0 = std::chrono::steady_clock::now();
  // The request's own KV, as long as it needs: freed when the map is made (this function's end),
  // so an idle draft worker holds none.
  ASSIGN_OR_RETURN(
      std::unique_ptr<ContiguousKvCache> kv,
      ContiguousKvCache::Create(kv_layout_, 1, n + r.lookahead, backend_->DeviceKvMemory()));
  // The last forward holds the whole window (its queries are captured): the prompt's tail of
  // max(window, the chunking's remainder) tokens, the rest in full chunks before it.
  const int chunk = options_.prefill_chunk;
  const int tail = std::min(n, std::max(r.specpc.window, (n - 1) % chunk + 1));
  // With lookahead tokens to generate, the prompt's pass runs as deep as they need; the first
  // depth_ layers compute the same either way, so the map does not change.
  const ForwardPlan& prompt_plan = r.lookahead > 0 ? lookahead_plan_ : plan_;
  ForwardPlan capture_plan = prompt_plan;
  capture_plan.capture.window = r.specpc.window;
  capture_plan.capture.ramp_weights = true;
  capture_plan.capture.layers.assign(c.n_layers, 0);
  for (int l = out.first_layer; l < depth_; ++l) capture_plan.capture.layers[l] = 1;
  std::vector<float> logits;
  std::vector<CapturedAttention> captured;
  const auto cancelled = [&](int done, const std::string& what) {
    return absl::CancelledError(absl::StrCat("draft: cancelled after ", done, " of ", n, what));
  };
  for (int begin = 0; begin < n;) {
    if (cancel != nullptr && cancel->cancelled()) return cancelled(begin, " prompt tokens");
    const bool last = begin == n - tail;
    const int len = last ? tail : std::min(chunk, n - tail - begin);
    StepBatch batch;
    batch.AddSequence(0, r.prompt.data() + begin, len, begin, begin, last);
    RETURN_IF_ERROR(Forward(*model_, *backend_, last ? capture_plan : prompt_plan, batch, *kv, *ws_,
                            last ? &logits : nullptr, {}, last ? &captured : nullptr));
    begin += len;
  }
  out.token_scores = SpecPcTokenScores(captured.at(0), out.first_layer);
  out.token_scores.resize(n);
  if (r.specpc.budget > 0) {
    out.keep = SpecPcSelect(MaxPool1d(out.token_scores, r.specpc.pool_kernel), r.specpc);
  }
  out.prefill_s = Since(t0);
  const auto t1 = std::chrono::steady_clock::now();
  for (int i = 0; i < r.lookahead; ++i) {
    const int32_t next = Argmax(logits);
    out.lookahead.push_back(next);
    if (i + 1 == r.lookahead) break;
    if (cancel != nullptr && cancel->cancelled()) {
      return cancelled(n, absl::StrCat(" prompt tokens and ", i + 1, " lookahead tokens"));
    }
    StepBatch batch;
    batch.AddSequence(0, &next, 1, n + i, n + i, true);
    RETURN_IF_ERROR(Forward(*model_, *backend_, lookahead_plan_, batch, *kv, *ws_, &logits));
  }
  out.lookahead_s = Since(t1);
  return out;
}

}  // namespace tripod
