// Binds GGUF tensor names to LayerWeights/ModelWeights and checks shapes; see weights.h.
// GGUF names are shared by the Llama and Qwen families; ArchTraits says which optional ones exist.
#include "common/model/weights.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"

namespace tripod {
namespace {

// Looks up `name` and checks it is [rows, cols] (cols innermost); rows 0 = a vector of cols.
absl::StatusOr<WeightRef> Bind(const GgufFile& gguf, const std::string& name, int64_t rows,
                               int64_t cols, bool required = true) {
  const GgufTensorInfo* t = gguf.FindTensor(name);
  if (t == nullptr) {
    if (!required) return WeightRef{};
    return absl::NotFoundError(absl::StrCat("tensor '", name, "' is missing from ", gguf.path()));
  }
  const bool is_vector = rows == 0;
  const bool ok = is_vector ? (t->dims.size() == 1 && t->dims[0] == cols)
                            : (t->dims.size() == 2 && t->dims[0] == cols && t->dims[1] == rows);
  if (!ok) {
    std::string dims;
    for (int64_t d : t->dims) absl::StrAppend(&dims, dims.empty() ? "" : ", ", d);
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' has dims [", dims,
                                                   "], expected [", cols,
                                                   is_vector ? "" : absl::StrCat(", ", rows), "]"));
  }
  return WeightRef{t};
}

}  // namespace

absl::StatusOr<ModelWeights> BindWeights(const GgufFile& gguf, const ModelConfig& c,
                                         const WeightSelection& selection) {
  if (!selection.layers.empty() && static_cast<int>(selection.layers.size()) != c.n_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weight selection names ", selection.layers.size(), " layers, model has ", c.n_layers));
  }
  ModelWeights w;
  const int64_t d = c.d_model;
  ASSIGN_OR_RETURN(w.token_embd, Bind(gguf, "token_embd.weight", c.vocab_size, d));
  if (selection.output_head) {
    ASSIGN_OR_RETURN(w.output_norm, Bind(gguf, "output_norm.weight", 0, d));
    ASSIGN_OR_RETURN(w.output, Bind(gguf, "output.weight", c.vocab_size, d, /*required=*/false));
    if (!w.output) w.output = w.token_embd;
  }
  ASSIGN_OR_RETURN(w.rope_freqs, Bind(gguf, "rope_freqs.weight", 0, c.rope_dims / 2, false));
  w.layers.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerNeed need = selection.layers.empty() ? LayerNeed::kFull : selection.layers[l];
    if (need == LayerNeed::kNone) continue;
    LayerWeights& lw = w.layers[l];
    const std::string p = absl::StrCat("blk.", l, ".");
    ASSIGN_OR_RETURN(lw.attn_norm, Bind(gguf, p + "attn_norm.weight", 0, d));
    ASSIGN_OR_RETURN(lw.wk, Bind(gguf, p + "attn_k.weight", c.kv_dim(), d));
    ASSIGN_OR_RETURN(lw.wv, Bind(gguf, p + "attn_v.weight", c.kv_dim(), d));
    if (c.traits.qkv_bias) {
      ASSIGN_OR_RETURN(lw.bk, Bind(gguf, p + "attn_k.bias", 0, c.kv_dim()));
      ASSIGN_OR_RETURN(lw.bv, Bind(gguf, p + "attn_v.bias", 0, c.kv_dim()));
    }
    if (c.traits.qk_norm) {
      ASSIGN_OR_RETURN(lw.k_norm, Bind(gguf, p + "attn_k_norm.weight", 0, c.head_dim));
    }
    if (need == LayerNeed::kKvOnly && !selection.kv_only_queries) continue;
    ASSIGN_OR_RETURN(lw.wq, Bind(gguf, p + "attn_q.weight", c.q_dim(), d));
    if (c.traits.qkv_bias) {
      ASSIGN_OR_RETURN(lw.bq, Bind(gguf, p + "attn_q.bias", 0, c.q_dim()));
    }
    if (c.traits.qk_norm) {
      ASSIGN_OR_RETURN(lw.q_norm, Bind(gguf, p + "attn_q_norm.weight", 0, c.head_dim));
    }
    if (need == LayerNeed::kKvOnly) continue;
    ASSIGN_OR_RETURN(lw.wo, Bind(gguf, p + "attn_output.weight", d, c.q_dim()));
    ASSIGN_OR_RETURN(lw.ffn_norm, Bind(gguf, p + "ffn_norm.weight", 0, d));
    ASSIGN_OR_RETURN(lw.w_gate, Bind(gguf, p + "ffn_gate.weight", c.d_ff, d));
    ASSIGN_OR_RETURN(lw.w_up, Bind(gguf, p + "ffn_up.weight", c.d_ff, d));
    ASSIGN_OR_RETURN(lw.w_down, Bind(gguf, p + "ffn_down.weight", d, c.d_ff));
  }
  return w;
}

}  // namespace tripod
