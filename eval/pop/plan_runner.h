// Small helpers the POP analyses (importance, eval-pop) share: run one sequence's tokens under
// a plan, and a KvStore view that hides the prompt from chosen layers.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "common/compute/forward.h"
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

// A view of another store in which the given layers see no slot below first_visible (POP's
// "no K/V for the skipped layers" control: those layers attend to nothing from the prompt).
class HidingKvStore final : public KvStore {
 public:
  HidingKvStore(KvStore& base, std::vector<bool> hidden_layers, int32_t first_visible)
      : base_(base), hidden_(std::move(hidden_layers)), first_visible_(first_visible) {}
  KvLayout layout() const override { return base_.layout(); }
  KvLayerRef Layer(int32_t kv_seq, int layer) override {
    KvLayerRef r = base_.Layer(kv_seq, layer);
    if (layer >= 0 && layer < static_cast<int>(hidden_.size()) && hidden_[layer]) {
      r.first_visible_slot = first_visible_;
    }
    return r;
  }

 private:
  KvStore& base_;
  std::vector<bool> hidden_;
  int32_t first_visible_;
};

}  // namespace tripod
