// Small helpers the POP analyses (importance, eval-pop) share: run one sequence's tokens under
// a plan (HidingKvStore, the view that hides the prompt from chosen layers, is common/kv's).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "common/compute/forward.h"
#include "common/kv/hiding_kv_store.h"
#include "common/kv/kv_store.h"

namespace tripod {

// Runs `ids` as sequence 0 at positions and cache slots pos0.. under `plan`. With want_logits,
// *logits gets the logits of every row ([ids.size(), vocab]).
absl::Status RunTokens(const LoadedModel& model, Backend& backend, const ForwardPlan& plan,
                       KvStore& kv, ForwardWorkspace& ws, std::span<const int32_t> ids,
                       int32_t pos0, bool want_logits, std::vector<float>* logits);

// Index of the largest value (lowest index on ties).
int32_t ArgMax(std::span<const float> v);

// log softmax of one row, in double.
void LogSoftmax(std::span<const float> logits, std::vector<double>* out);

}  // namespace tripod
