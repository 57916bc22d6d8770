// ForwardPlan builders; see plan.h.
#include "common/compute/plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "xxhash.h"

namespace tripod {

uint64_t ForwardPlan::KvKey() const {
  return XXH3_64bits(layers.data(), layers.size() * sizeof(LayerMode));
}

ForwardPlan ForwardPlan::Full(int n_layers) {
  ForwardPlan p;
  p.layers.assign(n_layers, LayerMode::kFull);
  return p;
}

ForwardPlan ForwardPlan::PopPrefill(int n_layers, const std::vector<int>& skipped) {
  ForwardPlan p = Full(n_layers);
  for (int l : skipped) {
    if (l >= 0 && l < n_layers) p.layers[l] = LayerMode::kKvOnly;
  }
  p.output_head = false;
  return p;
}

ForwardPlan ForwardPlan::SelfDraft(int n_layers, int depth) {
  ForwardPlan p = Full(n_layers);
  for (int l = std::max(depth, 0); l < n_layers; ++l) p.layers[l] = LayerMode::kSkip;
  return p;
}

int ForwardPlan::count(LayerMode mode) const {
  return static_cast<int>(std::count(layers.begin(), layers.end(), mode));
}

std::string ForwardPlan::DebugString() const {
  std::string s;
  char cur = 0;
  int run = 0;
  auto flush = [&] {
    if (run > 0) absl::StrAppend(&s, s.empty() ? "" : " ", std::string(1, cur), run);
  };
  for (LayerMode m : layers) {
    const char c = m == LayerMode::kFull ? 'F' : m == LayerMode::kKvOnly ? 'K' : 'S';
    if (c != cur) {
      flush();
      cur = c;
      run = 0;
    }
    ++run;
  }
  flush();
  if (output_head) absl::StrAppend(&s, " head");
  return s;
}

}  // namespace tripod
