// PyramidLayerBudgets; see pyramid_budgets.h.
#include "common/kv/pyramid_budgets.h"

#include <algorithm>
#include <cstdint>

namespace tripod {

std::vector<int> PyramidLayerBudgets(int budget, int window, int n_layers, int m, int beta) {
  const int64_t total = int64_t{budget} - window;  // selectable entries per layer, on average
  const int64_t cap = int64_t{m} - window;         // positions outside the window
  std::vector<int64_t> c(n_layers, total);
  if (n_layers > 1) {
    const int64_t lo = total / std::max(beta, 1);
    const int64_t hi = 2 * total - lo;
    const int64_t steps = n_layers - 1;
    int64_t sum = 0;
    for (int l = 0; l < n_layers; ++l) {
      c[l] = (hi * steps - (hi - lo) * l) / steps;  // floor of the exact linear value
      sum += c[l];
    }
    // The exact values sum to n_layers * total; the floors lose less than n_layers.
    for (int l = 0; sum < n_layers * total; ++l, ++sum) ++c[l];
  }
  int64_t excess = 0;
  for (int64_t& x : c) {
    if (x > cap) excess += x - cap, x = cap;
  }
  for (int64_t& x : c) {
    const int64_t add = std::min(cap - x, excess);
    x += add;
    excess -= add;
  }
  std::vector<int> out(n_layers);
  for (int l = 0; l < n_layers; ++l) out[l] = static_cast<int>(c[l] + window);
  return out;
}

}  // namespace tripod
