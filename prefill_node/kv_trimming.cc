#include "prefill_node/kv_trimming.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/compute/max_pool.h"
#include "common/util/status_macros.h"

namespace tripod {

const char* TrimMethodName(TrimMethod m) {
  switch (m) {
    case TrimMethod::kNone:
      return "none";
    case TrimMethod::kSpecKv:
      return "speckv";
    case TrimMethod::kSnapKv:
      return "snapkv";
    case TrimMethod::kStreamingLlm:
      return "streamingllm";
    case TrimMethod::kDraftMap:
      return "draftmap";
    case TrimMethod::kPyramidKv:
      return "pyramidkv";
  }
  return "unknown";
}

absl::StatusOr<TrimMethod> ParseTrimMethod(std::string_view name) {
  for (TrimMethod m : {TrimMethod::kNone, TrimMethod::kSpecKv, TrimMethod::kSnapKv,
                       TrimMethod::kStreamingLlm, TrimMethod::kDraftMap, TrimMethod::kPyramidKv}) {
    if (name == TrimMethodName(m)) return m;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown KV trimming method '", std::string(name),
                   "': none, speckv, snapkv, streamingllm, draftmap or pyramidkv"));
}

bool KeepsEverything(const TrimPolicy& p, int m) {
  return p.method == TrimMethod::kNone || p.budget >= m;
}

absl::Status ValidateTrimPolicy(const TrimPolicy& p, int m) {
  if (p.method == TrimMethod::kNone) return absl::OkStatus();
  if (p.budget <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("trimming: budget must be positive, got ", p.budget));
  }
  if (p.pool_kernel <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("trimming: pool kernel must be positive, got ", p.pool_kernel));
  }
  if ((p.method == TrimMethod::kSpecKv || p.method == TrimMethod::kSnapKv ||
       p.method == TrimMethod::kPyramidKv) &&
      (p.window <= 0 || p.window > p.budget)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "trimming: the window must be in [1, budget], got ", p.window, " for budget ", p.budget));
  }
  if (p.method != TrimMethod::kPyramidKv && !p.layer_budgets.empty()) {
    return absl::InvalidArgumentError("trimming: per-layer budgets are PyramidKV's only");
  }
  if (p.method == TrimMethod::kPyramidKv && !KeepsEverything(p, m)) {
    int64_t sum = 0;
    for (size_t l = 0; l < p.layer_budgets.size(); ++l) {
      const int b = p.layer_budgets[l];
      if (b < p.window || b > m) {
        return absl::InvalidArgumentError(absl::StrCat("trimming: layer ", l, "'s budget ", b,
                                                       " is outside [window ", p.window,
                                                       ", prefilled tokens ", m, "]"));
      }
      sum += b;
    }
    // A mean above the budget would reserve, send and hold more than asked for.
    if (sum > int64_t{p.budget} * static_cast<int64_t>(p.layer_budgets.size())) {
      return absl::InvalidArgumentError(absl::StrCat("trimming: the per-layer budgets sum to ", sum,
                                                     ", above ", p.layer_budgets.size(),
                                                     " layers x budget ", p.budget));
    }
  }
  if (p.method == TrimMethod::kStreamingLlm && (p.sink_tokens < 0 || p.sink_tokens > p.budget)) {
    return absl::InvalidArgumentError(
        absl::StrCat("trimming: sink tokens must be in [0, budget], got ", p.sink_tokens));
  }
  if (p.method == TrimMethod::kDraftMap && !KeepsEverything(p, m)) {
    if (static_cast<int>(p.keep.size()) != p.budget) {
      return absl::InvalidArgumentError(absl::StrCat(
          "trimming: the draft map keeps ", p.keep.size(), " positions, budget ", p.budget));
    }
    for (size_t i = 0; i < p.keep.size(); ++i) {
      if (p.keep[i] < 0 || p.keep[i] >= m || (i > 0 && p.keep[i] <= p.keep[i - 1])) {
        return absl::InvalidArgumentError(absl::StrCat(
            "trimming: draft-map positions must ascend inside [0, ", m, "), got ", p.keep[i]));
      }
    }
  }
  return absl::OkStatus();
}

std::vector<int32_t> SelectByScore(const float* scores, int m, int budget, int window,
                                   int pool_kernel) {
  const int outside = m - window;
  const std::vector<float> pooled =
      MaxPool1d(std::vector<float>(scores, scores + outside), pool_kernel);
  std::vector<int32_t> order(outside);
  std::iota(order.begin(), order.end(), 0);
  const int top = std::min(budget - window, outside);
  std::partial_sort(order.begin(), order.begin() + top, order.end(), [&](int32_t a, int32_t b) {
    return pooled[a] != pooled[b] ? pooled[a] > pooled[b] : a < b;
  });
  std::vector<int32_t> keep(order.begin(), order.begin() + top);
  for (int j = outside; j < m; ++j) keep.push_back(j);
  std::sort(keep.begin(), keep.end());
  return keep;
}

std::vector<int32_t> FixedPositions(const TrimPolicy& p, int m, int n_layers, int n_kv_heads) {
  std::vector<int32_t> one;
  if (p.method == TrimMethod::kDraftMap) {
    one = p.keep;
  } else {  // StreamingLLM
    const int sinks = std::min(p.sink_tokens, p.budget);
    for (int j = 0; j < sinks; ++j) one.push_back(j);
    for (int j = m - (p.budget - sinks); j < m; ++j) one.push_back(j);
  }
  std::vector<int32_t> all;
  all.reserve(one.size() * n_layers * n_kv_heads);
  for (int i = 0; i < n_layers * n_kv_heads; ++i) all.insert(all.end(), one.begin(), one.end());
  return all;
}

int TrimmedSlots(const TrimPolicy& p) {
  if (p.method == TrimMethod::kPyramidKv && !p.layer_budgets.empty()) {
    return *std::max_element(p.layer_budgets.begin(), p.layer_budgets.end());
  }
  return p.budget;
}

std::vector<int32_t> ScoredPositions(const TrimPolicy& p, const CapturedAttention& att, int m) {
  const int slots = TrimmedSlots(p);
  const bool pyramid = p.method == TrimMethod::kPyramidKv && !p.layer_budgets.empty();
  std::vector<int32_t> all;
  all.reserve(size_t{1} * att.n_layers * att.n_kv_heads * slots);
  for (int l = 0; l < att.n_layers; ++l) {
    const int budget = pyramid ? p.layer_budgets[l] : p.budget;
    for (int h = 0; h < att.n_kv_heads; ++h) {
      const float* s = p.method == TrimMethod::kSpecKv ? att.max_at(l, h) : att.sum_at(l, h);
      const std::vector<int32_t> keep = SelectByScore(s, m, budget, p.window, p.pool_kernel);
      all.insert(all.end(), slots - keep.size(), -1);
      all.insert(all.end(), keep.begin(), keep.end());
    }
  }
  return all;
}

absl::StatusOr<KvSnapshot> TrimSnapshot(const KvSnapshot& full,
                                        const std::vector<int32_t>& positions, int n_slots) {
  const KvLayout& l = full.layout;
  if (full.trimmed()) return absl::InvalidArgumentError("trimming: the KV is already trimmed");
  if (positions.size() != size_t{1} * l.n_layers * l.n_kv_heads * n_slots) {
    return absl::InvalidArgumentError("trimming: positions do not match the layout and budget");
  }
  KvSnapshot t;
  t.layout = l;
  t.n_slots = n_slots;
  t.positions = positions;
  t.plan_key = full.plan_key;
  // Each layer's padding: its leading -1s, as many in every head.
  std::vector<int32_t> first(l.n_layers, 0);
  for (int layer = 0; layer < l.n_layers; ++layer) {
    for (int h = 0; h < l.n_kv_heads; ++h) {
      const int32_t* row = &positions[(size_t{1} * layer * l.n_kv_heads + h) * n_slots];
      const int pad = static_cast<int>(
          std::find_if(row, row + n_slots, [](int32_t p) { return p != -1; }) - row);
      if (h > 0 && pad != first[layer]) {
        return absl::InvalidArgumentError(
            absl::StrCat("trimming: layer ", layer, "'s heads keep different numbers of entries"));
      }
      first[layer] = pad;
    }
  }
  if (std::any_of(first.begin(), first.end(), [](int32_t f) { return f > 0; })) {
    t.layer_first = first;
  }
  const size_t row = full.row_bytes();
  t.k.resize(size_t{1} * l.n_layers * l.n_kv_heads * n_slots * row);
  t.v.resize(t.k.size());
  for (int layer = 0; layer < l.n_layers; ++layer) {
    for (int h = 0; h < l.n_kv_heads; ++h) {
      for (int s = first[layer]; s < n_slots; ++s) {
        const int32_t p = positions[(size_t{1} * layer * l.n_kv_heads + h) * n_slots + s];
        if (p < 0 || p >= full.n_slots) {
          return absl::InvalidArgumentError(
              absl::StrCat("trimming: position ", p, " outside the KV's ", full.n_slots, " slots"));
        }
        std::memcpy(&t.k[t.offset(layer, h, s)], &full.k[full.offset(layer, h, p)], row);
        std::memcpy(&t.v[t.offset(layer, h, s)], &full.v[full.offset(layer, h, p)], row);
      }
    }
  }
  RETURN_IF_ERROR(ValidateSnapshot(t, full.n_slots));
  return t;
}

}  // namespace tripod
