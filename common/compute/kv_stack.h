// POP's batched K/V projection. The skipped layers of a contiguous run all see the same stream
// h* (skipped layers leave it unchanged), and layer l's K|V = (rmsnorm(h*) * w_l) · W_l^T =
// normalize(h*) · (W_l diag(w_l))^T. So each layer's norm weight w_l folds into the input
// columns of its K/V matrix, the run's matrices stack along n, and one GEMM of the unit-weight
// normalised stream gives every layer's K and V; bias, K-norm, RoPE and the cache write follow
// per layer (RoPE once over all of the run's K heads).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "common/compute/backend.h"
#include "common/compute/plan.h"
#include "common/compute/step_batch.h"
#include "common/kv/kv_store.h"
#include "common/model/model_config.h"
#include "common/model/weights.h"

namespace tripod {

struct LoadedModel;

struct KvStack {
  int begin = 0, end = 0;  // layers [begin, end); empty when end == begin
  // Rows [K_begin .. K_end-1 | V_begin .. V_end-1], each kv_dim; columns d, norm weights folded.
  std::unique_ptr<PreparedMatrix> w;
  std::unique_ptr<PreparedVector> bias;  // same row order (Qwen2), or null
  std::unique_ptr<PreparedVector> unit;  // [d] ones: RMS normalisation without a weight

  int n_layers() const { return end - begin; }
  bool covers(int layer) const { return layer >= begin && layer < end; }
  int width(const ModelConfig& c) const { return 2 * n_layers() * c.kv_dim(); }
  size_t resident_bytes() const;
};

// Prepares the stack for layers [begin, end). Unimplemented when the backend has no scaled
// matrices (the caller then prepares each layer's K/V matrix instead).
absl::StatusOr<KvStack> BuildKvStack(Backend& backend, const ModelConfig& config,
                                     const ModelWeights& weights, int begin, int end);

// Whether Forward uses the stack under `plan` for `layer`: the stack covers it and no layer of
// the stack runs in full under the plan (so all of them see one stream).
bool UsesKvStack(const KvStack& stack, const ForwardPlan& plan, int layer);

// Rows per tile of RunKvStack: the [rows, width] output stays in cache between the GEMM and the
// cache writes (all of [T, width] is tens of MB at long prompts), and each GEMM is still large.
inline constexpr int kKvStackTileRows = 256;

// Projects K/V for every kKvOnly layer of the stack from the stream h [T, d] and writes them to
// the cache, in tiles of rows. xn: [T, d] scratch; out: [min(T, kKvStackTileRows), stack.width]
// scratch.
void RunKvStack(const LoadedModel& model, Backend& backend, const ForwardPlan& plan,
                const StepBatch& batch, const float* h, const RopeAngles& angles, KvStore& kv,
                float* xn, float* out);

}  // namespace tripod
