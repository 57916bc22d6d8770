// The stacked K/V projection of POP's skipped layers; see kv_stack.h.
#include "common/compute/kv_stack.h"

#include <algorithm>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/compute/model.h"
#include "common/model/quant_types.h"
#include "common/util/status_macros.h"

namespace tripod {
namespace {

// A PreparedVector from host floats, through a temporary F32 tensor description.
absl::StatusOr<std::unique_ptr<PreparedVector>> VectorFrom(Backend& backend,
                                                           const std::vector<float>& v) {
  GgufTensorInfo info;
  info.name = "kv_stack";
  info.dims = {static_cast<int64_t>(v.size())};
  info.type = GgmlType::kF32;
  info.n_elements = v.size();
  info.n_bytes = v.size() * sizeof(float);
  info.data = reinterpret_cast<const uint8_t*>(v.data());
  return backend.PrepareVector(info);
}

std::vector<float> ToFloats(const GgufTensorInfo& t) {
  std::vector<float> v(t.n_elements);
  DequantizeRow(t.type, t.data, v.data(), static_cast<int64_t>(t.n_elements));
  return v;
}

}  // namespace

size_t KvStack::resident_bytes() const {
  size_t b = w ? w->resident_bytes() : 0;
  if (bias) b += bias->size() * sizeof(float);
  if (unit) b += unit->size() * sizeof(float);
  return b;
}

absl::StatusOr<KvStack> BuildKvStack(Backend& backend, const ModelConfig& c,
                                     const ModelWeights& weights, int begin, int end) {
  if (begin < 0 || end > c.n_layers || begin >= end) {
    return absl::InvalidArgumentError(
        absl::StrCat("K/V stack: bad layer range [", begin, ", ", end, ")"));
  }
  KvStack s;
  s.begin = begin;
  s.end = end;
  const int n = end - begin;
  std::vector<std::vector<float>> norms(n);
  std::vector<const GgufTensorInfo*> parts(2 * n);
  std::vector<const float*> scales(2 * n);
  bool has_bias = false;
  for (int i = 0; i < n; ++i) {
    const LayerWeights& w = weights.layers[begin + i];
    if (!w.attn_norm || !w.wk || !w.wv) {
      return absl::FailedPreconditionError(
          absl::StrCat("K/V stack: layer ", begin + i, " has no norm or K/V weights bound"));
    }
    norms[i] = ToFloats(*w.attn_norm.tensor);
    if (static_cast<int>(norms[i].size()) != c.d_model) {
      return absl::InvalidArgumentError(
          absl::StrCat("K/V stack: layer ", begin + i, " norm has ", norms[i].size(), " weights"));
    }
    parts[i] = w.wk.tensor;  // all K first, then all V: RoPE runs once over every K head
    parts[n + i] = w.wv.tensor;
    scales[i] = scales[n + i] = norms[i].data();
    has_bias = has_bias || static_cast<bool>(w.bk);
  }
  ASSIGN_OR_RETURN(s.w, backend.PrepareScaledMatrix(parts, scales));
  if (has_bias) {
    std::vector<float> b;
    b.reserve(size_t{2} * n * c.kv_dim());
    for (int half = 0; half < 2; ++half) {
      for (int i = 0; i < n; ++i) {
        const LayerWeights& w = weights.layers[begin + i];
        const WeightRef& ref = half == 0 ? w.bk : w.bv;
        if (!ref) return absl::InvalidArgumentError("K/V stack: some layers have biases, some not");
        const std::vector<float> v = ToFloats(*ref.tensor);
        b.insert(b.end(), v.begin(), v.end());
      }
    }
    ASSIGN_OR_RETURN(s.bias, VectorFrom(backend, b));
  }
  ASSIGN_OR_RETURN(s.unit, VectorFrom(backend, std::vector<float>(c.d_model, 1.0f)));
  return s;
}

bool UsesKvStack(const KvStack& stack, const ForwardPlan& plan, int layer) {
  if (!stack.w || !stack.covers(layer)) return false;
  for (int l = stack.begin; l < stack.end; ++l) {
    if (plan.layers[l] == LayerMode::kFull) return false;
  }
  return plan.layers[layer] == LayerMode::kKvOnly;
}

void RunKvStack(const LoadedModel& model, Backend& backend, const ForwardPlan& plan,
                const StepBatch& batch, const float* h, const RopeAngles& angles, KvStore& kv,
                float* xn, float* out) {
  const ModelConfig& c = model.config;
  const KvStack& s = model.kv_stack;
  const int T = batch.n_tokens(), d = c.d_model, kvd = c.kv_dim(), hd = c.head_dim;
  const int n = s.n_layers(), W = s.width(c);
  const int half = angles.rope_dims / 2;
  for (int r0 = 0; r0 < T; r0 += kKvStackTileRows) {
    const int rows = std::min(kKvStackTileRows, T - r0);
    backend.RmsNorm(h + int64_t{r0} * d, d, *s.unit, rows, d, c.rms_eps, xn, d);
    backend.Linear(*s.w, xn, rows, d, out, W, /*accumulate=*/false);
    if (s.bias) backend.AddBias(out, W, *s.bias, rows, W);
    for (int i = 0; i < n; ++i) {
      const PreparedVector* k_norm = model.layers[s.begin + i].k_norm.get();
      if (k_norm == nullptr) continue;
      for (int head = 0; head < c.n_kv_heads; ++head) {
        float* r = out + int64_t{i} * kvd + int64_t{head} * hd;
        backend.RmsNorm(r, W, *k_norm, rows, hd, c.rms_eps, r, W);
      }
    }
    RopeAngles tile = angles;
    tile.cos += int64_t{r0} * half;
    tile.sin += int64_t{r0} * half;
    backend.Rope(out, W, rows, n * c.n_kv_heads, hd, tile);
    for (const SeqInBatch& q : batch.seqs) {
      // This sequence's rows within the tile.
      const int a = std::max(q.token_begin, r0);
      const int b = std::min(q.token_begin + q.n_tokens, r0 + rows);
      if (a >= b) continue;
      for (int i = 0; i < n; ++i) {
        const int layer = s.begin + i;
        if (plan.layers[layer] != LayerMode::kKvOnly) continue;
        const float* k = out + int64_t{a - r0} * W + int64_t{i} * kvd;
        const float* v = out + int64_t{a - r0} * W + int64_t{n + i} * kvd;
        backend.WriteKv(k, v, b - a, W, c.n_kv_heads, hd, kv.Layer(q.kv_seq, layer),
                        q.n_past + (a - q.token_begin));
      }
    }
  }
}

}  // namespace tripod
