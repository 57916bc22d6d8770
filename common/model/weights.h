// Views of a model's weight tensors inside the GGUF mapping, with shapes checked against the
// config. Nothing is copied here; backends prepare (convert, prepack) what they run.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "common/model/gguf.h"
#include "common/model/model_config.h"

namespace tripod {

// A weight matrix [rows = output features, cols = input features] or a vector (rows = 1).
struct WeightRef {
  const GgufTensorInfo* tensor = nullptr;  // null when absent (optional tensors)
  explicit operator bool() const { return tensor != nullptr; }
  int64_t rows() const { return tensor->rows(); }
  int64_t cols() const { return tensor->cols(); }
};

// What one layer's weights are needed for.
enum class LayerNeed : uint8_t {
  kFull,    // everything
  kKvOnly,  // input norm and K/V projections (POP's skipped layers on a prefill worker)
  kNone,    // nothing (past a self-draft's depth)
};

struct LayerWeights {
  WeightRef attn_norm;       // [d_model]
  WeightRef wq, wk, wv, wo;  // [q_dim, d], [kv_dim, d], [kv_dim, d], [d, q_dim]
  WeightRef bq, bk, bv;      // Qwen2 biases
  WeightRef q_norm, k_norm;  // Qwen3: [head_dim]
  WeightRef ffn_norm;        // [d_model]
  WeightRef w_gate, w_up;    // [d_ff, d]
  WeightRef w_down;          // [d, d_ff]
};

struct ModelWeights {
  WeightRef token_embd;   // [vocab, d]
  WeightRef output_norm;  // [d]
  WeightRef output;       // [vocab, d]; token_embd when the head is tied
  WeightRef rope_freqs;   // optional [rope_dims / 2] frequency divisors (Llama 3.1)
  std::vector<LayerWeights> layers;
};

struct WeightSelection {
  std::vector<LayerNeed> layers;  // empty: every layer in full
  bool output_head = true;        // final norm and output head
  // POP: the last contiguous run of kKvOnly layers is prepared as one stacked K/V matrix (one
  // GEMM for all of them) rather than one matrix per layer, where the backend supports it.
  bool stack_kv_only = true;
  // K/V-only layers also get their Q projection (and its bias and norm): their queries, projected
  // from the stream the K/V come from, score the KV when a prefill worker trims it under POP.
  bool kv_only_queries = false;
};

// Finds and shape-checks the tensors `selection` needs; a missing or misshapen tensor is an
// error naming it.
absl::StatusOr<ModelWeights> BindWeights(const GgufFile& gguf, const ModelConfig& config,
                                         const WeightSelection& selection = {});

}  // namespace tripod
