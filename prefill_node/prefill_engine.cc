// PrefillEngine; see prefill_engine.h.
#include "prefill_node/prefill_engine.h"

#include <algorithm>
#include <chrono>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/compute/cpu/cpu_backend.h"
#include "common/compute/session.h"
#include "common/kv/contiguous_kv_cache.h"
#include "common/util/status_macros.h"

namespace tripod {
namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

WeightSelection PrefillSelection(int n_layers, const std::vector<int>& skipped) {
  WeightSelection s;
  s.layers.assign(n_layers, LayerNeed::kFull);
  for (int l : skipped) s.layers[l] = LayerNeed::kKvOnly;
  s.output_head = false;
  return s;
}

absl::StatusOr<size_t> FullModelWeightBytes(const std::string& model_path,
                                            const std::string& precision) {
  ASSIGN_OR_RETURN(CpuBackendOptions cpu, CpuOptionsForPrecision(precision));
  std::unique_ptr<Backend> backend = MakeCpuBackend(cpu);
  ASSIGN_OR_RETURN(std::unique_ptr<LoadedModel> m,
                   LoadModel(model_path.empty() ? BundledModelPath() : model_path, *backend));
  return m->resident_weight_bytes();
}

absl::StatusOr<std::unique_ptr<PrefillEngine>> PrefillEngine::Create(
    const PrefillOptions& options) {
  if (options.chunk <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefill: chunk must be positive, got ", options.chunk));
  }
  std::unique_ptr<PrefillEngine> e(new PrefillEngine());
  e->options_ = options;
  ASSIGN_OR_RETURN(CpuBackendOptions cpu, CpuOptionsForPrecision(options.precision));
  e->kv_dtype_ = cpu.kv;
  e->backend_ = MakeCpuBackend(cpu);
  const std::string path = options.model_path.empty() ? BundledModelPath() : options.model_path;
  // The layer count decides the skipped set, and the skipped set decides what to load: read the
  // config first (a mapping and a header parse, no weights).
  ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::Open(path));
  ASSIGN_OR_RETURN(ModelConfig config, ReadModelConfig(*gguf));
  gguf.reset();
  ASSIGN_OR_RETURN(e->skipped_, SkippedLayers(options.pop, config.n_layers));
  WeightSelection selection = PrefillSelection(config.n_layers, e->skipped_);
  selection.stack_kv_only = options.stack_kv;
  ASSIGN_OR_RETURN(e->model_, LoadModel(path, *e->backend_, selection));
  e->plan_ = ForwardPlan::PopPrefill(config.n_layers, e->skipped_);
  e->ws_ = std::make_unique<ForwardWorkspace>(*e->backend_);
  return e;
}

absl::StatusOr<PrefillResult> PrefillEngine::Run(const std::vector<int32_t>& prompt) {
  if (prompt.empty()) return absl::InvalidArgumentError("prefill: empty prompt");
  const ModelConfig& c = model_->config;
  const int n = static_cast<int>(prompt.size());
  if (n > c.context_length) {
    return absl::OutOfRangeError(absl::StrCat(
        "prefill: prompt of ", n, " tokens exceeds the context length ", c.context_length));
  }
  for (int32_t t : prompt) {
    if (t < 0 || t >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "prefill: token id ", t, " is outside the vocabulary [0, ", c.vocab_size, ")"));
    }
  }
  const int m = n - 1;  // tokens prefilled here; the last one is the decode side's
  KvLayout layout{c.n_layers, c.n_kv_heads, c.head_dim, kv_dtype_};
  ASSIGN_OR_RETURN(std::unique_ptr<ContiguousKvCache> cache,
                   ContiguousKvCache::Create(layout, 1, std::max(m, 1)));
  PrefillResult r;
  const auto t0 = Clock::now();
  for (int begin = 0; begin < m; begin += options_.chunk) {
    const int len = std::min(options_.chunk, m - begin);
    StepBatch batch;
    batch.AddSequence(0, prompt.data() + begin, len, begin, begin, /*logits_for_last=*/false);
    RETURN_IF_ERROR(Forward(*model_, *backend_, plan_, batch, *cache, *ws_, nullptr));
    ++r.chunks;
  }
  const auto t1 = Clock::now();
  ASSIGN_OR_RETURN(r.kv, ExportSnapshot(*cache, 0, m));
  r.kv.token_ids.assign(prompt.begin(), prompt.begin() + m);
  r.kv.plan_key = plan_.KvKey();
  r.last_token = prompt.back();
  r.last_position = m;
  r.forward_s = Seconds(t0, t1);
  r.export_s = Seconds(t1, Clock::now());
  return r;
}

}  // namespace tripod
