// PyramidKV's per-layer KV budgets (arXiv 2406.02069; docs/algorithms.md, "Baselines"): lower
// layers, whose attention is spread wide, keep more entries than upper ones, whose attention is
// concentrated, at the same total as a uniform budget. The scheduler (to reserve the decode
// worker's slots) and the prefill worker (to trim) both use this one function.
#pragma once

#include <vector>

namespace tripod {

inline constexpr int kPyramidBeta = 20;  // the paper's default: the top layer keeps (C - w) / beta

// Entries kept per layer (window included), for n_layers layers, a mean budget C (budget) of
// which the last `window` prompt positions are always kept, over m prefilled positions. The
// selectable part falls linearly from hi = 2(C - w) - lo at layer 0 to lo = (C - w) / beta at the
// last layer and sums to exactly n_layers * (C - w) (the paper's integer steps overshoot the
// budget by up to ~4%; rounding is spread instead). A layer can select at most the m - w
// positions outside the window: what the bottom layers cannot take goes to the next ones up.
// Needs n_layers >= 1 and 0 <= window <= budget < m.
std::vector<int> PyramidLayerBudgets(int budget, int window, int n_layers, int m,
                                     int beta = kPyramidBeta);

}  // namespace tripod
