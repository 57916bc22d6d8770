// PrefillFlops; see prefill_flops.h.
#include "prefill_node/prefill_flops.h"

namespace tripod {

double PrefillFlops(const ModelConfig& c, const ForwardPlan& plan, int n_tokens) {
  const double d = c.d_model, qd = c.q_dim(), kvd = c.kv_dim(), ff = c.d_ff;
  const double m = n_tokens;
  const double full_linear = 2 * d * (qd + 2 * kvd) + 2 * qd * d + 2 * d * 2 * ff + 2 * ff * d;
  // Query i sees keys 0..i: m(m+1)/2 pairs, each a head_dim dot product (QK^T) and a head_dim
  // axpy (PV) per query head.
  const double attention = 2 * 2 * c.n_heads * static_cast<double>(c.head_dim) * (m * (m + 1) / 2);
  const double kv_only = 2 * d * 2 * kvd;
  double total = 0;
  for (LayerMode mode : plan.layers) {
    if (mode == LayerMode::kFull) total += m * full_linear + attention;
    if (mode == LayerMode::kKvOnly) total += m * kv_only;
  }
  return total;
}

}  // namespace tripod
