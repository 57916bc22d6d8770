// A view of another store in which chosen layers see no slot below first_visible (POP's "no K/V
// for the skipped layers" control: from the boundary token on, those layers attend to nothing
// of the prompt). Writes go through to the base store unchanged.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "common/kv/kv_store.h"

namespace tripod {

class HidingKvStore final : public KvStore {
 public:
  HidingKvStore(KvStore& base, std::vector<bool> hidden_layers, int32_t first_visible)
      : base_(base), hidden_(std::move(hidden_layers)), first_visible_(first_visible) {}
  KvLayout layout() const override { return base_.layout(); }
  KvLayerRef Layer(int32_t kv_seq, int layer) override {
    KvLayerRef r = base_.Layer(kv_seq, layer);
    if (layer >= 0 && layer < static_cast<int>(hidden_.size()) && hidden_[layer]) {
      r.first_visible_slot = std::max(r.first_visible_slot, first_visible_);
    }
    return r;
  }
  const KvMemory* memory() const override { return base_.memory(); }

 private:
  KvStore& base_;
  std::vector<bool> hidden_;
  int32_t first_visible_;
};

}  // namespace tripod
