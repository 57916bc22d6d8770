// One model, one backend and one sequence's KV cache: the single-stream generation loop the
// CLI and the forward benchmark use (prefill in chunks, then one token per step). The decode
// worker's batched engine replaces this for serving.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/compute/backend.h"
#include "common/compute/forward.h"
#include "common/compute/model.h"
#include "common/kv/contiguous_kv_cache.h"
#include "common/model/bundled_model.h"

namespace tripod {

struct SessionOptions {
  std::string model_path;          // empty: BundledModelPath()
  std::string backend = "cpu";     // cpu | cuda (bf16 weights and GEMMs on the GPU; f16 KV)
  std::string precision = "auto";  // fp32 | bf16 | int8 | int16 | auto (CpuOptionsForPrecision;
                                   // the CPU backend's)
  // KV element type: auto (the precision's: f32 for fp32, else f16) | f32 | f16 | bf16 | q8_0.
  std::string kv_cache_dtype = "auto";
  int context_tokens = 0;  // 0: the model's context length
  // Tokens per prefill forward. 512 keeps a chunk's activations (a 512 x 3072 gate/up output is
  // 6 MB) near the caches while the GEMMs stay large enough for AMX: a 2048-token prompt
  // prefilled 1.07x as fast as in chunks of 1024, 1.08x as in one (Emerald Rapids, 2 threads).
  int prefill_chunk = 512;
};

class Session {
 public:
  static absl::StatusOr<std::unique_ptr<Session>> Open(const SessionOptions& options);

  const LoadedModel& model() const { return *model_; }
  Backend& backend() { return *backend_; }
  KvDtype kv_dtype() const { return kv_->layout().dtype; }
  int n_cached() const { return static_cast<int>(tokens_.size()); }
  const std::vector<int32_t>& tokens() const { return tokens_; }

  // Drops cached tokens after the first n (keeps a common prefix for the next prompt).
  void Truncate(int n);
  // Appends `ids` (prefilled in chunks) and returns the logits of the last one ([vocab]); with
  // all_logits, the logits of every appended token ([n, vocab]).
  absl::StatusOr<std::vector<float>> Append(const std::vector<int32_t>& ids,
                                            bool all_logits = false);
  // Longest prefix of `ids` already in the cache (never all of it: the last token must run).
  int CommonPrefix(const std::vector<int32_t>& ids) const;

 private:
  Session() = default;
  SessionOptions options_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<LoadedModel> model_;
  std::unique_ptr<ContiguousKvCache> kv_;
  std::unique_ptr<ForwardWorkspace> ws_;
  ForwardPlan plan_;
  std::vector<int32_t> tokens_;
};

}  // namespace tripod
