#include "draft_node/specpc.h"

#include <algorithm>
#include <numeric>

namespace tripod {

std::vector<float> SpecPcTokenScores(const CapturedAttention& att, int first_layer) {
  std::vector<float> s(att.n_keys, 0.0f);
  for (int l = std::max(0, first_layer); l < att.n_layers; ++l) {
    for (int h = 0; h < att.n_kv_heads; ++h) {
      const float* m = att.max_at(l, h);
      for (int j = 0; j < att.n_keys; ++j) s[j] = std::max(s[j], m[j]);
    }
  }
  return s;
}

std::vector<int32_t> SpecPcSelect(const std::vector<float>& pooled, const SpecPcParams& p) {
  const int n = static_cast<int>(pooled.size());
  std::vector<int32_t> keep;
  if (p.budget >= n) {
    keep.resize(n);
    std::iota(keep.begin(), keep.end(), 0);
    return keep;
  }
  if (p.budget <= 0) return keep;
  // Seeds: the budget highest scores, in score order (stable: the earlier position on ties).
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return pooled[a] > pooled[b]; });
  order.resize(p.budget);
  // The window first, latest first (a budget below the window keeps the prompt's end, its last
  // token always), then each seed's neighbourhood, nearest first; repeats dropped.
  std::vector<uint8_t> taken(n, 0);
  auto take = [&](int32_t j) {
    if (!taken[j]) {
      taken[j] = 1;
      keep.push_back(j);
    }
  };
  for (int j = n - 1; j >= std::max(0, n - p.window); --j) take(j);
  const int nb = std::max(p.neighbourhood, 1);
  const int lo = (nb - 1) / 2, hi = nb - 1 - lo;
  for (int32_t seed : order) {
    if (static_cast<int>(keep.size()) >= p.budget) break;
    take(seed);
    for (int d = 1; d <= std::max(lo, hi); ++d) {
      if (d <= lo) take(std::max(0, seed - d));
      if (d <= hi) take(std::min(n - 1, seed + d));
    }
  }
  if (static_cast<int>(keep.size()) > p.budget) keep.resize(p.budget);
  std::sort(keep.begin(), keep.end());
  return keep;
}

std::vector<int32_t> SpecPcKeep(const CapturedAttention& att, const SpecPcParams& p) {
  return SpecPcSelect(MaxPool1d(SpecPcTokenScores(att, p.first_layer), p.pool_kernel), p);
}

}  // namespace tripod
