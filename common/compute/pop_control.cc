// POP's controls; see pop_control.h.
#include "common/compute/pop_control.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/numbers.h"
#include "xxhash.h"

namespace tripod {

std::optional<double> ParsePopRatio(std::string_view raw) {
  const absl::string_view text(raw.data(), raw.size());
  const size_t slash = text.find('/');
  double num = 0, den = 1;
  if (!absl::SimpleAtod(text.substr(0, slash), &num)) return std::nullopt;
  if (slash != absl::string_view::npos &&
      (!absl::SimpleAtod(text.substr(slash + 1), &den) || den == 0)) {
    return std::nullopt;
  }
  const double r = num / den;
  if (!std::isfinite(r) || r < 0 || r >= 1) return std::nullopt;
  return r;
}

std::vector<int> PopTailLayers(int n_layers, double ratio) {
  std::vector<int> out;
  if (n_layers <= 0 || !std::isfinite(ratio) || ratio <= 0) return out;
  const int k = std::min(n_layers - 1, static_cast<int>(std::floor(n_layers * ratio + 1e-9)));
  for (int l = n_layers - k; l < n_layers; ++l) out.push_back(l);
  return out;
}

ForwardPlan PopVariantPrefillPlan(int n_layers, const std::vector<int>& skipped, PopVariant v) {
  ForwardPlan p = ForwardPlan::PopPrefill(n_layers, skipped);
  if (v == PopVariant::kNoKv || v == PopVariant::kShortGpt) {
    for (LayerMode& m : p.layers) {
      if (m == LayerMode::kKvOnly) m = LayerMode::kSkip;
    }
  }
  return p;
}

int PopControl::boundary() const {
  switch (variant) {
    case PopVariant::kShortGpt:
      return 0;
    case PopVariant::kNoBoundary:
      return prompt_tokens;
    case PopVariant::kPop:
    case PopVariant::kNoKv:
      break;
  }
  return prompt_tokens - 1;
}

ForwardPlan PopControl::PromptPlan(int n_layers) const {
  ForwardPlan p = PopVariantPrefillPlan(n_layers, skipped, variant);
  p.output_head = true;  // kNoBoundary: the last prompt token's logits come from this plan
  return p;
}

ForwardPlan PopControl::DecodePlan(int n_layers) const {
  ForwardPlan p = ForwardPlan::Full(n_layers);
  if (variant == PopVariant::kShortGpt) {
    for (int l : skipped) {
      if (l >= 0 && l < n_layers) p.layers[l] = LayerMode::kSkip;
    }
  }
  return p;
}

std::vector<bool> PopControl::HiddenLayers(int n_layers) const {
  std::vector<bool> hidden;
  if (variant != PopVariant::kNoKv) return hidden;
  hidden.assign(n_layers, false);
  for (int l : skipped) {
    if (l >= 0 && l < n_layers) hidden[l] = true;
  }
  return hidden;
}

uint64_t PopControl::MixKey(uint64_t plan_key) const {
  if (!active()) return plan_key;
  std::vector<int64_t> words = {static_cast<int64_t>(plan_key), static_cast<int64_t>(variant),
                                prompt_tokens};
  words.insert(words.end(), skipped.begin(), skipped.end());
  return XXH3_64bits(words.data(), words.size() * sizeof(int64_t));
}

}  // namespace tripod
