// LoadModel: binds GGUF tensors and has the backend prepare them; see model.h.
#include "common/compute/model.h"

#include <cmath>
#include <numbers>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"

namespace tripod {
namespace {

// Concatenates the fp32 values of 1-D tensors (biases) into one prepared vector by building a
// temporary F32 tensor info over host memory.
absl::StatusOr<std::unique_ptr<PreparedVector>> ConcatVectors(
    Backend& backend, std::span<const GgufTensorInfo* const> parts, std::vector<float>& storage) {
  storage.clear();
  for (const GgufTensorInfo* t : parts) {
    std::vector<float> row(t->cols());
    DequantizeRow(t->type, t->data, row.data(), t->cols());
    storage.insert(storage.end(), row.begin(), row.end());
  }
  GgufTensorInfo info;
  info.name = parts.empty() ? "bias" : parts[0]->name;
  info.dims = {static_cast<int64_t>(storage.size())};
  info.type = GgmlType::kF32;
  info.n_elements = storage.size();
  info.n_bytes = storage.size() * sizeof(float);
  info.data = reinterpret_cast<const uint8_t*>(storage.data());
  return backend.PrepareVector(info);
}

}  // namespace

std::vector<float> RopeInvFreq(const ModelConfig& c, const float* freq_factors) {
  const int half = c.rope_dims / 2;
  std::vector<float> inv(half);
  for (int i = 0; i < half; ++i) {
    double f = std::pow(static_cast<double>(c.rope_theta), -2.0 * i / c.rope_dims);
    if (freq_factors != nullptr) {
      f /= freq_factors[i];
    } else if (c.rope_scaling.llama3) {
      // Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, smooth between.
      const RopeScaling& s = c.rope_scaling;
      const double wavelen = 2 * std::numbers::pi / f;
      const double low_wavelen = s.original_context / s.low_freq_factor;
      const double high_wavelen = s.original_context / s.high_freq_factor;
      if (wavelen > low_wavelen) {
        f /= s.factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth = (s.original_context / wavelen - s.low_freq_factor) /
                              (s.high_freq_factor - s.low_freq_factor);
        f = (1 - smooth) * f / s.factor + smooth * f;
      }
    }
    inv[i] = static_cast<float>(f / c.rope_scaling.linear_factor);
  }
  return inv;
}

size_t LoadedModel::resident_weight_bytes() const {
  size_t total = 0;
  auto add_m = [&](const std::unique_ptr<PreparedMatrix>& m) {
    if (m) total += m->resident_bytes();
  };
  auto add_v = [&](const std::unique_ptr<PreparedVector>& v) {
    if (v) total += v->size() * sizeof(float);
  };
  for (const PreparedLayer& l : layers) {
    add_v(l.attn_norm), add_v(l.ffn_norm), add_v(l.bqkv), add_v(l.q_norm), add_v(l.k_norm);
    add_v(l.bq), add_m(l.q);
    add_m(l.qkv), add_m(l.kv), add_m(l.wo), add_m(l.gate_up), add_m(l.down);
  }
  add_v(output_norm);
  add_m(output);
  total += kv_stack.resident_bytes();
  // The embedding table is read row by row from the mapping: count it once unless the head is it.
  if (!selection.output_head || weights.output.tensor != weights.token_embd.tensor) {
    total += weights.token_embd.tensor->n_bytes;
  }
  return total;
}

absl::StatusOr<std::unique_ptr<LoadedModel>> LoadModel(const std::string& path, Backend& backend,
                                                       const WeightSelection& selection) {
  auto m = std::make_unique<LoadedModel>();
  ASSIGN_OR_RETURN(m->gguf, GgufFile::Open(path));
  ASSIGN_OR_RETURN(m->config, ReadModelConfig(*m->gguf));
  ASSIGN_OR_RETURN(m->weights, BindWeights(*m->gguf, m->config, selection));
  m->selection = selection;
  RETURN_IF_ERROR(PrepareModel(*m, backend));
  return m;
}

absl::Status PrepareModel(LoadedModel& model, Backend& backend) {
  LoadedModel* m = &model;
  const WeightSelection& selection = m->selection;
  const ModelConfig& c = m->config;

  std::vector<float> factors;
  if (m->weights.rope_freqs) {
    factors.resize(c.rope_dims / 2);
    DequantizeRow(m->weights.rope_freqs.tensor->type, m->weights.rope_freqs.tensor->data,
                  factors.data(), c.rope_dims / 2);
  }
  m->rope_inv_freq = RopeInvFreq(c, factors.empty() ? nullptr : factors.data());

  // The last contiguous run of K/V-only layers becomes one stacked matrix (POP's batched K/V
  // GEMM); a backend without scaled matrices keeps one K/V matrix per layer.
  if (selection.stack_kv_only && !selection.layers.empty()) {
    int end = c.n_layers;
    while (end > 0 && selection.layers[end - 1] != LayerNeed::kKvOnly) --end;
    int begin = end;
    while (begin > 0 && selection.layers[begin - 1] == LayerNeed::kKvOnly) --begin;
    if (begin < end) {
      absl::StatusOr<KvStack> stack = BuildKvStack(backend, c, m->weights, begin, end);
      if (stack.ok()) {
        m->kv_stack = std::move(stack).value();
      } else if (!absl::IsUnimplemented(stack.status())) {
        return stack.status();
      }
    }
  }

  // Matrices through PrepareMatrix; their file pages are released at the end where the
  // backend keeps copies (then only the copies are resident), and shared with every process that
  // maps the file where it reads them in place.
  std::vector<const GgufTensorInfo*> copied;
  auto prepare = [&](std::span<const GgufTensorInfo* const> parts) {
    for (const GgufTensorInfo* t : parts) {
      if (backend.CopiesTensor(*t)) copied.push_back(t);
    }
    return backend.PrepareMatrix(parts);
  };
  std::vector<float> scratch;
  m->layers.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerNeed need = selection.layers.empty() ? LayerNeed::kFull : selection.layers[l];
    if (need == LayerNeed::kNone) continue;
    const LayerWeights& w = m->weights.layers[l];
    PreparedLayer& p = m->layers[l];
    if (w.k_norm) {
      ASSIGN_OR_RETURN(p.k_norm, backend.PrepareVector(*w.k_norm.tensor));
    }
    if (need == LayerNeed::kKvOnly && selection.kv_only_queries) {
      // The layer's queries for scoring (Forward's capture): norm, Q projection, bias, q_norm.
      ASSIGN_OR_RETURN(p.attn_norm, backend.PrepareVector(*w.attn_norm.tensor));
      const GgufTensorInfo* q[] = {w.wq.tensor};
      ASSIGN_OR_RETURN(p.q, prepare(q));
      if (w.bq) {
        ASSIGN_OR_RETURN(p.bq, backend.PrepareVector(*w.bq.tensor));
      }
      if (w.q_norm) {
        ASSIGN_OR_RETURN(p.q_norm, backend.PrepareVector(*w.q_norm.tensor));
      }
    }
    if (need == LayerNeed::kKvOnly && m->kv_stack.covers(l)) continue;  // the stack has the rest
    if (p.attn_norm == nullptr) {
      ASSIGN_OR_RETURN(p.attn_norm, backend.PrepareVector(*w.attn_norm.tensor));
    }
    if (need == LayerNeed::kKvOnly) {
      const GgufTensorInfo* kv[] = {w.wk.tensor, w.wv.tensor};
      ASSIGN_OR_RETURN(p.kv, prepare(kv));
      if (w.bk) {
        const GgufTensorInfo* b[] = {w.bk.tensor, w.bv.tensor};
        ASSIGN_OR_RETURN(p.bqkv, ConcatVectors(backend, b, scratch));
      }
      continue;
    }
    const GgufTensorInfo* qkv[] = {w.wq.tensor, w.wk.tensor, w.wv.tensor};
    ASSIGN_OR_RETURN(p.qkv, prepare(qkv));
    if (w.bq) {
      const GgufTensorInfo* b[] = {w.bq.tensor, w.bk.tensor, w.bv.tensor};
      ASSIGN_OR_RETURN(p.bqkv, ConcatVectors(backend, b, scratch));
    }
    if (w.q_norm) {
      ASSIGN_OR_RETURN(p.q_norm, backend.PrepareVector(*w.q_norm.tensor));
    }
    const GgufTensorInfo* wo[] = {w.wo.tensor};
    ASSIGN_OR_RETURN(p.wo, prepare(wo));
    ASSIGN_OR_RETURN(p.ffn_norm, backend.PrepareVector(*w.ffn_norm.tensor));
    const GgufTensorInfo* gu[] = {w.w_gate.tensor, w.w_up.tensor};
    ASSIGN_OR_RETURN(p.gate_up, prepare(gu));
    const GgufTensorInfo* down[] = {w.w_down.tensor};
    ASSIGN_OR_RETURN(p.down, prepare(down));
  }
  if (selection.output_head) {
    ASSIGN_OR_RETURN(m->output_norm, backend.PrepareVector(*m->weights.output_norm.tensor));
    const GgufTensorInfo* head[] = {m->weights.output.tensor};
    ASSIGN_OR_RETURN(m->output, prepare(head));
  }
  if (m->gguf) {
    for (const GgufTensorInfo* t : copied) m->gguf->ReleasePages(*t);
  }
  return absl::OkStatus();
}

}  // namespace tripod
