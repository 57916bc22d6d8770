// KV trimming on the prefill worker (docs/algorithms.md, SpecKV and the baselines): which prompt
// positions' K/V each layer and KV head keeps, and the trimmed snapshot made of them. The scores
// come from the target's own attention (ForwardPlan's capture) of the observation window, the last
// prompt token and, for SpecKV, the draft's lookahead tokens; StreamingLLM and the draft map need
// none.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/compute/forward.h"
#include "common/kv/kv_snapshot.h"

namespace tripod {

enum class TrimMethod {
  kNone,          // every entry
  kSpecKv,        // max over the window's, the last token's and the lookahead's queries
  kSnapKv,        // sum over the window's and the last token's queries
  kStreamingLlm,  // the first sink_tokens and the most recent rest
  kDraftMap,      // the draft's kept positions, the same in every layer and head
  kPyramidKv,     // SnapKV's scores, a budget per layer falling from the bottom layer to the top
};

const char* TrimMethodName(TrimMethod m);
// "none", "speckv", "snapkv", "streamingllm", "draftmap", "pyramidkv".
absl::StatusOr<TrimMethod> ParseTrimMethod(std::string_view name);

struct TrimPolicy {
  TrimMethod method = TrimMethod::kNone;
  int budget = 0;       // C: entries kept per layer and KV head (>= the prefilled tokens: all)
  int window = 32;      // w: the last w prefilled positions are kept and their queries score
  int pool_kernel = 7;  // max-pool of the scores along the positions
  int sink_tokens = 4;  // StreamingLLM's first tokens
  std::vector<int32_t> lookahead;  // SpecKV: the draft's greedy tokens after the prompt
  std::vector<int32_t> keep;       // draft map: positions to keep (< the prefilled tokens)
  // PyramidKV: entries kept per layer, window included (PyramidLayerBudgets of budget, which is
  // then their mean); empty: the engine computes them.
  std::vector<int> layer_budgets;
};

// INVALID_ARGUMENT saying what is wrong with `p` for m prefilled tokens (0..m-1).
absl::Status ValidateTrimPolicy(const TrimPolicy& p, int m);

// Whether `p` keeps every one of m prefilled positions (no method, or a budget >= m).
bool KeepsEverything(const TrimPolicy& p, int m);

// One (layer, head)'s kept positions from its scores over the m prefilled positions: the
// window [m - w, m) and the top C - w of the max-pooled scores over [0, m - w) (ties: the earlier
// position), ascending. m > C >= w assumed (ValidateTrimPolicy).
std::vector<int32_t> SelectByScore(const float* scores, int m, int budget, int window,
                                   int pool_kernel);

// Per (layer, head), [n_layers][n_kv_heads][C] positions, for methods without scores.
std::vector<int32_t> FixedPositions(const TrimPolicy& p, int m, int n_layers, int n_kv_heads);

// Slots per (layer, head) of the trimmed KV: the budget, or PyramidKV's largest layer budget.
int TrimmedSlots(const TrimPolicy& p);

// Per (layer, head) from captured attention (max for SpecKV, sum for SnapKV and PyramidKV),
// [n_layers][n_kv_heads][TrimmedSlots(p)]; a PyramidKV layer keeping fewer than that is padded
// with -1 in front (KvSnapshot::layer_first).
std::vector<int32_t> ScoredPositions(const TrimPolicy& p, const CapturedAttention& att, int m);

// The entries of `full` (untrimmed, m slots) at `positions` ([layers][heads][n_slots]); leading
// -1s, as many in every head of a layer, are padding (zero rows, KvSnapshot::layer_first).
absl::StatusOr<KvSnapshot> TrimSnapshot(const KvSnapshot& full,
                                        const std::vector<int32_t>& positions, int n_slots);

}  // namespace tripod
