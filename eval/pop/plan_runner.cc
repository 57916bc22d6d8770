// Plan runner helpers; see plan_runner.h.
#include "eval/pop/plan_runner.h"

#include <algorithm>
#include <cmath>

namespace tripod {

absl::Status RunTokens(const LoadedModel& model, Backend& backend, const ForwardPlan& plan,
                       KvStore& kv, ForwardWorkspace& ws, std::span<const int32_t> ids,
                       int32_t pos0, bool want_logits, std::vector<float>* logits) {
  if (ids.empty()) return absl::OkStatus();
  StepBatch batch;
  batch.AddSequence(0, ids.data(), static_cast<int>(ids.size()), pos0, pos0, false);
  if (want_logits) {
    for (int r = 0; r < batch.n_tokens(); ++r) batch.logit_rows.push_back(r);
  }
  return Forward(model, backend, plan, batch, kv, ws, want_logits ? logits : nullptr);
}

int32_t ArgMax(std::span<const float> v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

void LogSoftmax(std::span<const float> logits, std::vector<double>* out) {
  out->resize(logits.size());
  double mx = -INFINITY;
  for (float x : logits) mx = std::max(mx, static_cast<double>(x));
  double sum = 0;
  for (float x : logits) sum += std::exp(x - mx);
  const double lse = mx + std::log(sum);
  for (size_t i = 0; i < logits.size(); ++i) (*out)[i] = logits[i] - lse;
}

}  // namespace tripod
