// SpecPC's prompt compression (docs/algorithms.md) from a draft's captured attention: the
// token scores and the positions kept. The same token scores drive the "draft map" (one kept set
// for every layer and head after an ordinary prefill).
#pragma once

#include <cstdint>
#include <vector>

#include "common/compute/forward.h"
#include "common/compute/max_pool.h"

namespace tripod {

struct SpecPcParams {
  int budget = 0;          // tokens kept; >= the prompt length keeps every token
  int window = 64;         // w: the last w positions are always kept (and score the rest)
  int first_layer = 0;     // l_0: draft layers >= l_0 are scored
  int pool_kernel = 32;    // kappa: max-pool width
  int neighbourhood = 32;  // N_b: positions kept around each seed
};

// Per prompt position j: the max over layers >= first_layer and KV heads of the captured
// (ramp-weighted) max. Sizes: n_keys of `att`.
std::vector<float> SpecPcTokenScores(const CapturedAttention& att, int first_layer);

// Steps 5 and 6: seeds are the `budget` highest pooled scores (ties: the earlier position); for
// each seed in score order its neighbourhood, nearest first, clamped; the last `window` positions
// (latest first) before them, repeats dropped, truncated to the budget, sorted ascending: a
// budget below the window keeps the prompt's last tokens. Every position when budget >= n.
std::vector<int32_t> SpecPcSelect(const std::vector<float>& pooled, const SpecPcParams& p);

// Steps 1-6 on one sequence's captured attention: the kept positions, ascending.
std::vector<int32_t> SpecPcKeep(const CapturedAttention& att, const SpecPcParams& p);

}  // namespace tripod
