// The same-length 1-D max-pool that importance scores go through before a top-k (SpecPC's
// kernel kappa, SpecKV's and SnapKV's kernel 7): out[j] = max of s over [j - (k - 1) / 2,
// j + k - 1 - (k - 1) / 2], clamped to the sequence (zero padding: scores are >= 0).
#pragma once

#include <algorithm>
#include <vector>

namespace tripod {

inline std::vector<float> MaxPool1d(const std::vector<float>& s, int kernel) {
  const int n = static_cast<int>(s.size());
  const int k = std::max(kernel, 1);
  const int left = (k - 1) / 2, right = k - 1 - left;
  std::vector<float> out(n);
  for (int j = 0; j < n; ++j) {
    float m = 0.0f;
    for (int i = std::max(0, j - left); i <= std::min(n - 1, j + right); ++i) m = std::max(m, s[i]);
    out[j] = m;
  }
  return out;
}

}  // namespace tripod
