// A model ready to run on a backend: the GGUF mapping, its config, and the weights the backend
// prepared (fused Q|K|V and gate|up), limited to what a WeightSelection asks for.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/compute/backend.h"
#include "common/compute/kv_stack.h"
#include "common/model/gguf.h"
#include "common/model/model_config.h"
#include "common/model/weights.h"

namespace tripod {

struct PreparedLayer {
  std::unique_ptr<PreparedVector> attn_norm, ffn_norm;
  std::unique_ptr<PreparedMatrix> qkv;  // [q_dim + 2 kv_dim, d]  (kFull)
  std::unique_ptr<PreparedMatrix> kv;   // [2 kv_dim, d]          (kKvOnly)
  // kKvOnly with WeightSelection::kv_only_queries: [q_dim, d] and its Qwen2 bias [q_dim]
  std::unique_ptr<PreparedMatrix> q;
  std::unique_ptr<PreparedVector> bq;
  std::unique_ptr<PreparedVector> bqkv;  // Qwen2: [q_dim + 2 kv_dim] (kFull) or [2 kv_dim]
  std::unique_ptr<PreparedVector> q_norm, k_norm;
  std::unique_ptr<PreparedMatrix> wo;       // [d, q_dim]
  std::unique_ptr<PreparedMatrix> gate_up;  // [2 d_ff, d]
  std::unique_ptr<PreparedMatrix> down;     // [d, d_ff]
};

struct LoadedModel {
  std::unique_ptr<GgufFile> gguf;  // null for a model without a file (PrepareModel)
  ModelConfig config;
  ModelWeights weights;
  WeightSelection selection;
  std::vector<PreparedLayer> layers;
  std::unique_ptr<PreparedVector> output_norm;
  std::unique_ptr<PreparedMatrix> output;
  std::vector<float> rope_inv_freq;  // [rope_dims / 2], scaling applied
  // POP: the last contiguous run of kKvOnly layers in the selection as one stacked K/V matrix
  // (their PreparedLayer then holds only k_norm); empty when there is none or it is disabled.
  KvStack kv_stack;

  // Bytes of weights this process holds for the model (prepared forms, GGUF bytes it reads).
  size_t resident_weight_bytes() const;
};

// Opens `path` and prepares what `selection` needs on `backend` (which must outlive the model).
absl::StatusOr<std::unique_ptr<LoadedModel>> LoadModel(const std::string& path, Backend& backend,
                                                       const WeightSelection& selection = {});

// The preparation step of LoadModel, for a model whose config, weights (bound tensors) and
// selection are set: RoPE frequencies, the K/V stack and every prepared layer. A model without
// a file (gguf null; tensors the caller owns, possibly without bytes) is prepared the same way:
// that is how a benchmark runs a shape-only model on a backend that makes its own weights.
absl::Status PrepareModel(LoadedModel& model, Backend& backend);

// The RoPE inverse frequencies: theta^(-2i/d), with Llama 3 scaling or rope_freqs divisors.
std::vector<float> RopeInvFreq(const ModelConfig& config, const float* freq_factors);

}  // namespace tripod
