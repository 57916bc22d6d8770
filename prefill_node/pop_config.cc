// PopConfig validation and parsing; see pop_config.h.
#include "prefill_node/pop_config.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tripod {

absl::StatusOr<std::vector<int>> SkippedLayers(const PopConfig& config, int n_layers) {
  if (n_layers <= 0) return absl::InvalidArgumentError("POP: the model has no layers");
  std::vector<int> skipped;
  if (config.layers.has_value()) {
    skipped = *config.layers;
    std::sort(skipped.begin(), skipped.end());
    for (size_t i = 0; i < skipped.size(); ++i) {
      const int l = skipped[i];
      if (l < 0 || l >= n_layers) {
        return absl::InvalidArgumentError(
            absl::StrCat("POP: layer ", l, " is outside the model's layers [0, ", n_layers, ")"));
      }
      if (i > 0 && skipped[i - 1] == l) {
        return absl::InvalidArgumentError(absl::StrCat("POP: layer ", l, " is listed twice"));
      }
    }
    if (!skipped.empty() && skipped.front() == 0) {
      return absl::InvalidArgumentError(
          "POP: layer 0 cannot be skipped (skipped layers project K/V from the stream a kept "
          "layer leaves; the first layer must run in full)");
    }
    return skipped;
  }
  const double r = config.ratio;
  if (!std::isfinite(r) || r < 0 || r >= 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("POP: ratio ", r, " is outside [0, 1) (at least one layer must run)"));
  }
  // floor(L * r), forgiving the rounding of ratios like 1/3 and 0.2 given in decimal.
  const int k = std::min(n_layers - 1, static_cast<int>(std::floor(n_layers * r + 1e-9)));
  for (int l = n_layers - k; l < n_layers; ++l) skipped.push_back(l);
  return skipped;
}

absl::StatusOr<PopConfig> ParsePopConfig(absl::string_view ratio, absl::string_view layers) {
  PopConfig c;
  ratio = absl::StripAsciiWhitespace(ratio);
  layers = absl::StripAsciiWhitespace(layers);
  if (!ratio.empty() && !layers.empty()) {
    return absl::InvalidArgumentError("POP: give a ratio or a list of layers, not both");
  }
  if (!ratio.empty()) {
    const std::vector<absl::string_view> frac = absl::StrSplit(ratio, '/');
    double num = 0, den = 1;
    const bool ok = frac.size() <= 2 && absl::SimpleAtod(frac[0], &num) &&
                    (frac.size() == 1 || (absl::SimpleAtod(frac[1], &den) && den != 0));
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("POP: ratio '", ratio, "' is not a number or a fraction like 1/3"));
    }
    c.ratio = num / den;
    return c;
  }
  if (layers.empty()) return c;
  c.layers.emplace();
  if (layers == "none") return c;
  for (absl::string_view item : absl::StrSplit(layers, ',')) {
    item = absl::StripAsciiWhitespace(item);
    const std::vector<absl::string_view> range = absl::StrSplit(item, '-');
    int a = 0, b = 0;
    const bool ok =
        range.size() <= 2 && absl::SimpleAtoi(range[0], &a) && absl::SimpleAtoi(range.back(), &b);
    if (!ok || b < a) {
      return absl::InvalidArgumentError(
          absl::StrCat("POP: '", item, "' is not a layer or an ascending range like 20-29"));
    }
    for (int l = a; l <= b; ++l) c.layers->push_back(l);
  }
  return c;
}

std::string DescribeSkipped(const std::vector<int>& skipped, int n_layers) {
  std::vector<std::string> runs;
  for (size_t i = 0; i < skipped.size();) {
    size_t j = i;
    while (j + 1 < skipped.size() && skipped[j + 1] == skipped[j] + 1) ++j;
    runs.push_back(i == j ? absl::StrCat(skipped[i]) : absl::StrCat(skipped[i], "-", skipped[j]));
    i = j + 1;
  }
  return absl::StrCat("skipped layers ", runs.empty() ? "none" : absl::StrJoin(runs, ","), " (",
                      skipped.size(), " of ", n_layers, ")");
}

}  // namespace tripod
