// PopConfig: which layers a POP prefill worker skips (runs K/V-only). Either a ratio r (the
// last floor(L * r) layers, contiguous; r = 1/3 by default) or an explicit list.
//
// Legal: any set of layers that keeps layer 0 and at least one layer in full. Layer 0 must run
// in full because a skipped layer projects its K/V from the stream as it leaves a kept layer
// (h*); with layer 0 skipped there is none, and the paper finds pruning anything but the tail
// destroys accuracy. Non-tail lists are allowed (for experiments), but the default and ratios
// always give the contiguous tail, the one shape the batched K/V GEMM serves in one matrix.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tripod {

struct PopConfig {
  double ratio = 1.0 / 3;                  // used when `layers` is unset; in [0, 1)
  std::optional<std::vector<int>> layers;  // explicit skipped layers (overrides ratio)
};

// The skipped layers, ascending, for a model of n_layers; errors name what is wrong.
absl::StatusOr<std::vector<int>> SkippedLayers(const PopConfig& config, int n_layers);

// From flag text: ratio "0.25" or "1/3" (empty: the default); layers "20-29" or "20,22,25"
// (ranges inclusive), "none" for an explicit empty list, empty for not given. Giving both a
// ratio and layers is an error.
absl::StatusOr<PopConfig> ParsePopConfig(absl::string_view ratio, absl::string_view layers);

// "ratio 1/3 -> layers 20-29 (10 of 30)".
std::string DescribeSkipped(const std::vector<int>& skipped, int n_layers);

}  // namespace tripod
