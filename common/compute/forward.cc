// The forward pass over a Backend; see forward.h. Pre-norm transformer block:
//   h += Wo · Attn(RoPE(Wq·n_a(h)), RoPE(Wk·n_a(h)), Wv·n_a(h));  h += Wd · (silu(Wg·n_f(h)) ⊙
//   Wu·n_f(h))
#include "common/compute/forward.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tripod {
namespace {

// Workspace slots.
enum Slot {
  kH,
  kXn,
  kQkv,
  kAttn,
  kGu,
  kAct,
  kRopeCos,
  kRopeSin,
  kLogitRows,
  kLogits,
  kBranch,
  kKvStack,
  kCaptureQ,
  kNumSlots
};

absl::Status CheckBatch(const LoadedModel& model, const ForwardPlan& plan, const StepBatch& b,
                        KvStore& kv) {
  const ModelConfig& c = model.config;
  if (static_cast<int>(plan.layers.size()) != c.n_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan has ", plan.layers.size(), " layers, model has ", c.n_layers));
  }
  if (!plan.gates.empty() && static_cast<int>(plan.gates.size()) != c.n_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan has ", plan.gates.size(), " gates, model has ", c.n_layers, " layers"));
  }
  if (b.positions.size() != b.tokens.size()) {
    return absl::InvalidArgumentError("batch: positions and tokens differ in length");
  }
  int32_t next = 0;
  for (const SeqInBatch& s : b.seqs) {
    if (s.token_begin != next || s.n_tokens < 0 || s.n_past < 0) {
      return absl::InvalidArgumentError("batch: sequences must cover the rows in order");
    }
    next += s.n_tokens;
  }
  if (next != b.n_tokens()) return absl::InvalidArgumentError("batch: rows not covered");
  for (int32_t t : b.tokens) {
    if (t < 0 || t >= c.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", t, " is outside the vocabulary [0, ", c.vocab_size, ")"));
    }
  }
  for (int32_t r : b.logit_rows) {
    if (r < 0 || r >= b.n_tokens()) return absl::InvalidArgumentError("batch: bad logit row");
  }
  if (!b.logit_rows.empty() && (!plan.output_head || !model.output)) {
    return absl::InvalidArgumentError("logits asked for, but the plan or model has no head");
  }
  const KvLayout layout = kv.layout();
  if (layout.n_layers != c.n_layers || layout.n_kv_heads != c.n_kv_heads ||
      layout.head_dim != c.head_dim) {
    return absl::InvalidArgumentError("KV store layout does not match the model");
  }
  for (int l = 0; l < c.n_layers; ++l) {
    const PreparedLayer& p = model.layers[l];
    const bool ok = plan.layers[l] == LayerMode::kSkip ||
                    (plan.layers[l] == LayerMode::kFull && p.qkv) ||
                    (plan.layers[l] == LayerMode::kKvOnly &&
                     (p.qkv || p.kv || UsesKvStack(model.kv_stack, plan, l)));
    if (!ok) {
      return absl::FailedPreconditionError(
          absl::StrCat("layer ", l, ": the plan needs weights this process did not load"));
    }
  }
  return absl::OkStatus();
}

// Scoring of one sequence's last w queries (q: the first of them, RoPE applied) against layer
// `layer`'s KV, into its captured rows.
AttentionScoreArgs WindowScoreArgs(const ModelConfig& c, const ForwardPlan& plan,
                                   const SeqInBatch& s, int w, const float* q, int q_stride,
                                   KvLayerRef layer_kv, int layer, CapturedAttention& ca) {
  AttentionScoreArgs sa;
  sa.q = q;
  sa.q_stride = q_stride;
  sa.n_q = w;
  sa.q_slot0 = s.n_past + s.n_tokens - w;
  sa.n_keys = ca.n_keys;
  sa.n_heads = c.n_heads;
  sa.n_kv_heads = c.n_kv_heads;
  sa.head_dim = c.head_dim;
  sa.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  sa.kv = layer_kv;
  sa.ramp_weights = plan.capture.ramp_weights;
  sa.max_out = ca.max.data() + size_t{1} * layer * c.n_kv_heads * ca.n_keys;
  sa.sum_out = ca.sum.data() + size_t{1} * layer * c.n_kv_heads * ca.n_keys;
  return sa;
}

}  // namespace

ForwardWorkspace::~ForwardWorkspace() {
  for (auto& [p, n] : buffers_) {
    if (p != nullptr) backend_.Free(p);
  }
}

float* ForwardWorkspace::Get(int slot, size_t floats) {
  if (static_cast<int>(buffers_.size()) <= slot) buffers_.resize(slot + 1, {nullptr, 0});
  auto& [p, n] = buffers_[slot];
  if (n < floats) {
    if (p != nullptr) backend_.Free(p);
    n = std::max(floats, n + n / 2);
    p = backend_.Alloc(n);
  }
  return p;
}

absl::Status Forward(const LoadedModel& model, Backend& backend, const ForwardPlan& plan,
                     const StepBatch& batch, KvStore& kv, ForwardWorkspace& ws,
                     std::vector<float>* logits, const KvLayersDone& on_kv,
                     std::vector<CapturedAttention>* captured) {
  if (absl::Status s = CheckBatch(model, plan, batch, kv); !s.ok()) return s;
  const ModelConfig& c = model.config;
  const int T = batch.n_tokens();
  if (T == 0) return absl::OkStatus();
  const bool capturing = plan.capture.window > 0;
  if (capturing) {
    if (captured == nullptr) {
      return absl::InvalidArgumentError("the plan captures attention but no output was given");
    }
    if (static_cast<int>(plan.capture.layers.size()) != c.n_layers) {
      return absl::InvalidArgumentError(absl::StrCat("capture names ", plan.capture.layers.size(),
                                                     " layers, model has ", c.n_layers));
    }
    for (int l = 0; l < c.n_layers; ++l) {
      if (!plan.capture.captures(l) || plan.layers[l] == LayerMode::kFull) continue;
      const PreparedLayer& p = model.layers[l];
      if (plan.layers[l] != LayerMode::kKvOnly || p.attn_norm == nullptr ||
          (p.q == nullptr && p.qkv == nullptr)) {
        return absl::InvalidArgumentError(
            absl::StrCat("capture of layer ", l,
                         ": only full layers, and K/V-only layers whose Q projection was loaded "
                         "(WeightSelection::kv_only_queries), have queries"));
      }
    }
    captured->assign(batch.seqs.size(), CapturedAttention{});
    for (size_t i = 0; i < batch.seqs.size(); ++i) {
      CapturedAttention& ca = (*captured)[i];
      ca.n_layers = c.n_layers;
      ca.n_kv_heads = c.n_kv_heads;
      ca.n_keys = batch.seqs[i].n_past + batch.seqs[i].n_tokens;
      ca.max.assign(size_t{1} * c.n_layers * c.n_kv_heads * ca.n_keys, 0.0f);
      ca.sum.assign(ca.max.size(), 0.0f);
    }
  }
  std::vector<AttentionScoreArgs> score_args;
  const int d = c.d_model, qd = c.q_dim(), kvd = c.kv_dim(), ff = c.d_ff, hd = c.head_dim;
  const int qkv_w = qd + 2 * kvd;

  float* h = ws.Get(kH, size_t{1} * T * d);          // [T, d] residual stream
  float* xn = ws.Get(kXn, size_t{1} * T * d);        // [T, d] normed stream
  float* qkv = ws.Get(kQkv, size_t{1} * T * qkv_w);  // [T, q | k | v]
  float* attn = ws.Get(kAttn, size_t{1} * T * qd);   // [T, q_dim]
  float* gu = ws.Get(kGu, size_t{1} * T * 2 * ff);   // [T, gate | up]
  float* act = ws.Get(kAct, size_t{1} * T * ff);     // [T, d_ff]

  // A decode step (one token per sequence, logits out, nothing heard or captured between ops)
  // is a whole that a backend may replay as one graph; the ops are the same either way.
  if (logits != nullptr && !batch.logit_rows.empty() && !capturing && !on_kv &&
      std::all_of(batch.seqs.begin(), batch.seqs.end(),
                  [](const SeqInBatch& s) { return s.n_tokens == 1; }) &&
      std::none_of(plan.layers.begin(), plan.layers.end(),
                   [](LayerMode m) { return m == LayerMode::kKvOnly; })) {
    backend.BeginGraphStep();
  }

  // RoPE angles once per batch; every layer reuses them.
  const int half = c.rope_dims / 2;
  float* rc = ws.Get(kRopeCos, size_t{1} * T * half);
  float* rs = ws.Get(kRopeSin, size_t{1} * T * half);
  {
    // Computed on the host and copied in: the buffers may be device memory.
    thread_local std::vector<float> host;
    host.resize(size_t{2} * T * half);
    float* hc = host.data();
    float* hs = hc + size_t{1} * T * half;
    for (int t = 0; t < T; ++t) {
      for (int i = 0; i < half; ++i) {
        const double a = static_cast<double>(batch.positions[t]) * model.rope_inv_freq[i];
        hc[t * half + i] = static_cast<float>(std::cos(a));
        hs[t * half + i] = static_cast<float>(std::sin(a));
      }
    }
    backend.FromHost(hc, size_t{1} * T * half, rc);
    backend.FromHost(hs, size_t{1} * T * half, rs);
  }
  const RopeAngles angles{rc, rs, c.rope_dims, c.traits.rope_style == RopeStyle::kHalves};

  backend.Embed(*model.weights.token_embd.tensor, batch.tokens, h, d);

  // A captured K/V-only layer (POP) has no queries in the pass itself: each sequence's window is
  // projected from the stream its K/V came from (h*, leaving the last full layer), with the
  // layer's own norm and Q projection, and scores the layer's KV. Our choice for trimming under
  // POP (docs/draft.md), not the paper's.
  auto capture_kv_only = [&](int l) {
    const PreparedLayer& p = model.layers[l];
    for (size_t i = 0; i < batch.seqs.size(); ++i) {
      const SeqInBatch& s = batch.seqs[i];
      const int w = std::min(plan.capture.window, s.n_tokens);
      if (w == 0) continue;
      const int r0 = s.token_begin + s.n_tokens - w;
      const int stride = p.q != nullptr ? qd : qkv_w;
      float* qs = ws.Get(kCaptureQ, size_t{1} * w * stride);
      backend.RmsNorm(h + int64_t{r0} * d, d, *p.attn_norm, w, d, c.rms_eps, xn, d);
      if (p.q != nullptr) {
        backend.Linear(*p.q, xn, w, d, qs, qd, false);
        if (p.bq) backend.AddBias(qs, qd, *p.bq, w, qd);
      } else {
        backend.Linear(*p.qkv, xn, w, d, qs, qkv_w, false);  // full weights: Q is the first part
        if (p.bqkv && p.bqkv->size() == qkv_w) backend.AddBias(qs, qkv_w, *p.bqkv, w, qkv_w);
      }
      if (p.q_norm) {
        for (int hh = 0; hh < c.n_heads; ++hh) {
          float* rows = qs + int64_t{hh} * hd;
          backend.RmsNorm(rows, stride, *p.q_norm, w, hd, c.rms_eps, rows, stride);
        }
      }
      RopeAngles at = angles;
      at.cos = rc + int64_t{r0} * half;
      at.sin = rs + int64_t{r0} * half;
      backend.Rope(qs, stride, w, c.n_heads, hd, at);
      const AttentionScoreArgs sa =
          WindowScoreArgs(c, plan, s, w, qs, stride, kv.Layer(s.kv_seq, l), l, (*captured)[i]);
      backend.AttentionScores(std::span<const AttentionScoreArgs>(&sa, 1));
    }
  };

  std::vector<AttentionArgs> attn_args(batch.seqs.size());
  bool kv_stack_done = false;
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerMode mode = plan.layers[l];
    if (mode == LayerMode::kSkip) continue;
    const PreparedLayer& p = model.layers[l];
    if (UsesKvStack(model.kv_stack, plan, l)) {
      // POP: all K/V-only layers of the stack see this same stream; one GEMM serves them all.
      if (!kv_stack_done) {
        const int rows = std::min(T, kKvStackTileRows);
        float* out = ws.Get(kKvStack, size_t{1} * rows * model.kv_stack.width(c));
        RunKvStack(model, backend, plan, batch, h, angles, kv, xn, out);
        kv_stack_done = true;
        if (on_kv) {
          // The stack's K/V-only layers (all of them, unless the plan skips some) as ranges.
          const KvStack& st = model.kv_stack;
          for (int a = st.begin; a < st.end;) {
            if (plan.layers[a] != LayerMode::kKvOnly) {
              ++a;
              continue;
            }
            int b = a + 1;
            while (b < st.end && plan.layers[b] == LayerMode::kKvOnly) ++b;
            if (absl::Status s = on_kv(a, b); !s.ok()) return s;
            a = b;
          }
        }
        if (capturing) {
          for (int a = model.kv_stack.begin; a < model.kv_stack.end; ++a) {
            if (plan.layers[a] == LayerMode::kKvOnly && plan.capture.captures(a)) {
              capture_kv_only(a);
            }
          }
        }
      }
      continue;
    }

    // K/V (and Q for full layers) from the normed stream.
    backend.RmsNorm(h, d, *p.attn_norm, T, d, c.rms_eps, xn, d);
    float* q = qkv;
    float* k = qkv + qd;
    float* v = qkv + qd + kvd;
    if (mode == LayerMode::kFull) {
      backend.Linear(*p.qkv, xn, T, d, qkv, qkv_w, /*accumulate=*/false);
    } else if (p.kv) {
      backend.Linear(*p.kv, xn, T, d, k, qkv_w, false);
    } else {
      backend.Linear(*p.qkv, xn, T, d, qkv, qkv_w, false);  // full weights loaded: use them
    }
    if (p.bqkv) {
      if (p.bqkv->size() == qkv_w) {
        backend.AddBias(qkv, qkv_w, *p.bqkv, T, qkv_w);
      } else {
        backend.AddBias(k, qkv_w, *p.bqkv, T, 2 * kvd);
      }
    }
    if (p.k_norm) {
      // Per-head RMSNorm (Qwen3): head h of every token is a row of head_dim, qkv_w apart.
      for (int h = 0; h < c.n_kv_heads; ++h) {
        float* rows = k + int64_t{h} * hd;
        backend.RmsNorm(rows, qkv_w, *p.k_norm, T, hd, c.rms_eps, rows, qkv_w);
      }
    }
    backend.Rope(k, qkv_w, T, c.n_kv_heads, hd, angles);
    for (const SeqInBatch& s : batch.seqs) {
      const int64_t r = s.token_begin;
      backend.WriteKv(k + r * qkv_w, v + r * qkv_w, s.n_tokens, qkv_w, c.n_kv_heads, hd,
                      kv.Layer(s.kv_seq, l), s.n_past);
    }
    if (on_kv) {
      if (absl::Status s = on_kv(l, l + 1); !s.ok()) return s;
    }
    if (mode == LayerMode::kKvOnly) {
      if (capturing && plan.capture.captures(l)) capture_kv_only(l);
      continue;
    }
    if (l == c.n_layers - 1 && (logits == nullptr || batch.logit_rows.empty()) &&
        !plan.capture.captures(l)) {
      // The last layer's outputs feed only the logits: with none asked for (a prefill worker's
      // pass), its K/V, written above, are all the pass leaves behind (llama.cpp likewise
      // computes the last layer only for the rows it outputs).
      break;
    }

    if (p.q_norm) {
      for (int h = 0; h < c.n_heads; ++h) {
        float* rows = q + int64_t{h} * hd;
        backend.RmsNorm(rows, qkv_w, *p.q_norm, T, hd, c.rms_eps, rows, qkv_w);
      }
    }
    backend.Rope(q, qkv_w, T, c.n_heads, hd, angles);
    for (size_t i = 0; i < batch.seqs.size(); ++i) {
      const SeqInBatch& s = batch.seqs[i];
      AttentionArgs& a = attn_args[i];
      a.q = q + int64_t{s.token_begin} * qkv_w;
      a.q_stride = qkv_w;
      a.n_q = s.n_tokens;
      a.n_past = s.n_past;
      a.n_heads = c.n_heads;
      a.n_kv_heads = c.n_kv_heads;
      a.head_dim = hd;
      a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
      a.kv = kv.Layer(s.kv_seq, l);
      a.out = attn + int64_t{s.token_begin} * qd;
      a.out_stride = qd;
    }
    if (plan.capture.captures(l)) {
      // The window: each sequence's last `window` rows of this batch (RoPE applied above).
      score_args.clear();
      for (size_t i = 0; i < batch.seqs.size(); ++i) {
        const SeqInBatch& s = batch.seqs[i];
        const int w = std::min(plan.capture.window, s.n_tokens);
        score_args.push_back(WindowScoreArgs(c, plan, s, w,
                                             q + int64_t{s.token_begin + s.n_tokens - w} * qkv_w,
                                             qkv_w, kv.Layer(s.kv_seq, l), l, (*captured)[i]));
      }
      backend.AttentionScores(score_args);
    }
    backend.Attention(attn_args);
    // A gate other than 1 scales the branch on its way into the stream; gate 1 keeps the
    // accumulating GEMM, so ungated plans are unchanged bit for bit.
    const float gate = plan.gates.empty() ? 1.0f : plan.gates[l];
    float* branch = gate == 1.0f ? nullptr : ws.Get(kBranch, size_t{1} * T * d);
    if (branch == nullptr) {
      backend.Linear(*p.wo, attn, T, qd, h, d, /*accumulate=*/true);
    } else {
      backend.Linear(*p.wo, attn, T, qd, branch, d, false);
      backend.AddScaled(branch, d, gate, T, d, h, d);
    }

    backend.RmsNorm(h, d, *p.ffn_norm, T, d, c.rms_eps, xn, d);
    backend.Linear(*p.gate_up, xn, T, d, gu, 2 * ff, false);
    backend.SwiGlu(gu, 2 * ff, T, ff, act, ff);
    if (branch == nullptr) {
      backend.Linear(*p.down, act, T, ff, h, d, /*accumulate=*/true);
    } else {
      backend.Linear(*p.down, act, T, ff, branch, d, false);
      backend.AddScaled(branch, d, gate, T, d, h, d);
    }
  }

  if (logits == nullptr || batch.logit_rows.empty()) return absl::OkStatus();
  const int R = static_cast<int>(batch.logit_rows.size());
  float* rows = ws.Get(kLogitRows, size_t{1} * R * d);
  backend.GatherRows(h, d, batch.logit_rows, d, rows, d);
  backend.RmsNorm(rows, d, *model.output_norm, R, d, c.rms_eps, rows, d);
  float* out = ws.Get(kLogits, size_t{1} * R * c.vocab_size);
  backend.Linear(*model.output, rows, R, d, out, c.vocab_size, false);
  logits->resize(size_t{1} * R * c.vocab_size);
  backend.ToHost(out, logits->size(), logits->data());
  return absl::OkStatus();
}

}  // namespace tripod
