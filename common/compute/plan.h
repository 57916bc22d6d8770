// ForwardPlan: what one forward pass computes, per layer and for the output. Every node drives
// the same forward pass with a plan; the forward pass never asks which node it runs in.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tripod {

enum class LayerMode : uint8_t {
  kFull,    // attention and FFN, writes its K/V
  kKvOnly,  // POP's skipped layer: only its K/V, projected from the stream as it stands
  kSkip,    // nothing (past a self-draft's depth)
};

// Attention to record for draft scoring (SpecPC, SpecKV, SnapKV): in each captured layer, the
// softmax probabilities of each sequence's last `window` queries of the batch over every cache
// slot they see, reduced per KV head and slot (see AttentionScoreArgs). Only kFull layers.
struct AttentionCapture {
  int window = 0;               // 0: nothing is captured
  std::vector<uint8_t> layers;  // per model layer, 1 = captured (empty = none)
  bool ramp_weights = false;    // SpecPC's weights i / (w - 1) on the window's queries in the max

  bool captures(int layer) const {
    return window > 0 && layer < static_cast<int>(layers.size()) && layers[layer] != 0;
  }
};

struct ForwardPlan {
  std::vector<LayerMode> layers;
  bool output_head = true;  // final norm + head for StepBatch::logit_rows
  // Per-layer branch gates (empty = all 1): a kFull layer's attention and FFN outputs are scaled
  // by gates[l] before they join the residual stream (0: the layer is an identity for these
  // tokens, though it still writes its K/V). For the stage-aware importance analysis.
  std::vector<float> gates;
  AttentionCapture capture;

  static ForwardPlan Full(int n_layers);
  // POP's prefill plan: the given layers K/V-only, the rest full, no head (the boundary token
  // runs through the full model on the decode side).
  static ForwardPlan PopPrefill(int n_layers, const std::vector<int>& skipped);
  // A self-draft: the first `depth` layers in full, the rest skipped, with the head.
  static ForwardPlan SelfDraft(int n_layers, int depth);

  int count(LayerMode mode) const;
  // Identifies the KV this plan writes (its layer modes): KV of different keys never mixes in
  // the prefix cache. Full plans of the same depth share a key whatever their head.
  uint64_t KvKey() const;
  std::string DebugString() const;  // e.g. "F20 K10 head"
};

}  // namespace tripod
