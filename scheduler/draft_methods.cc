#include "scheduler/draft_methods.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace tripod::scheduler {
namespace {

constexpr struct {
  DraftMethod method;
  const char* name;
} kNames[] = {
    {DraftMethod::kNone, "none"},           {DraftMethod::kSpecKv, "speckv"},
    {DraftMethod::kSpecPc, "specpc"},       {DraftMethod::kDraftMap, "draftmap"},
    {DraftMethod::kSnapKv, "snapkv"},       {DraftMethod::kStreamingLlm, "streamingllm"},
    {DraftMethod::kPyramidKv, "pyramidkv"}, {DraftMethod::kKeepLast, "keeplast"},
};

// Positions strictly ascending inside [0, limit).
bool Ascending(const google::protobuf::RepeatedField<int32_t>& keep, int limit) {
  for (int i = 0; i < keep.size(); ++i) {
    if (keep[i] < 0 || keep[i] >= limit || (i > 0 && keep[i] <= keep[i - 1])) return false;
  }
  return true;
}

}  // namespace

const char* DraftMethodName(DraftMethod m) {
  for (const auto& e : kNames) {
    if (e.method == m) return e.name;
  }
  return "none";
}

std::optional<DraftMethod> ParseDraftMethod(std::string_view name) {
  if (name.empty()) return DraftMethod::kNone;
  for (const auto& e : kNames) {
    if (name == e.name) return e.method;
  }
  return std::nullopt;
}

bool NeedsDraft(DraftMethod m) {
  return m == DraftMethod::kSpecKv || m == DraftMethod::kSpecPc || m == DraftMethod::kDraftMap;
}

bool TrimsKv(DraftMethod m) { return m != DraftMethod::kNone && !CompressesPrompt(m); }

bool CompressesPrompt(DraftMethod m) {
  return m == DraftMethod::kSpecPc || m == DraftMethod::kKeepLast;
}

int ResolveBudget(const MethodChoice& choice, int n, int min_kept) {
  if (choice.budget_tokens > 0) return choice.budget_tokens;
  const int kept = static_cast<int>(std::lround(choice.budget_fraction * n));
  return std::max({1, kept, std::min(min_kept, n)});
}

bool BudgetKeepsAll(DraftMethod m, int budget, int n) {
  if (m == DraftMethod::kNone) return true;
  return CompressesPrompt(m) ? budget >= n : budget >= n - 1;
}

v1::ScoreRequest ScoreRequestFor(DraftMethod m, uint64_t request_id,
                                 const std::vector<int32_t>& prompt, int budget, int max_tokens,
                                 const DraftMethodParams& params) {
  v1::ScoreRequest r;
  r.set_request_id(request_id);
  r.mutable_prompt()->Assign(prompt.begin(), prompt.end());
  switch (m) {
    case DraftMethod::kSpecPc:
      r.set_budget(budget);
      break;
    case DraftMethod::kDraftMap:
      // SpecPC's selection always keeps the last position (it is in the forced window), which the
      // decode worker runs itself: one more, dropped, leaves `budget` KV positions.
      r.set_budget(budget + 1);
      break;
    case DraftMethod::kSpecKv:
      r.set_lookahead(std::max(0, std::min(params.speckv_lookahead, max_tokens)));
      break;
    default:
      break;
  }
  return r;
}

AppliedMethod ApplyMethod(DraftMethod m, int budget, const std::vector<int32_t>& prompt,
                          const v1::ImportanceMap* map, const DraftMethodParams& params) {
  AppliedMethod a;
  a.prompt = prompt;
  const int n = static_cast<int>(prompt.size());
  if (NeedsDraft(m) && map == nullptr) {
    a.error = "no importance map";
    return a;
  }
  v1::Trimming& t = a.trimming;
  switch (m) {
    case DraftMethod::kSpecPc: {
      if (map->keep_size() == 0 || !Ascending(map->keep(), n) || map->keep_size() > budget ||
          map->keep(map->keep_size() - 1) != n - 1) {
        a.error = absl::StrCat("the draft's kept positions (", map->keep_size(),
                               ") are not an ascending subset of the prompt ending at its last "
                               "token, within the budget");
        return a;
      }
      a.prompt.clear();
      for (int32_t i : map->keep()) a.prompt.push_back(prompt[i]);
      return a;
    }
    case DraftMethod::kKeepLast:
      // What vLLM's truncate_prompt_tokens does: the prompt's end, an ordinary prompt.
      a.prompt.assign(prompt.end() - std::min(budget, n), prompt.end());
      return a;
    case DraftMethod::kDraftMap: {
      std::vector<int32_t> keep;
      if (Ascending(map->keep(), n)) {
        for (int32_t i : map->keep()) {
          if (i < n - 1) keep.push_back(i);
        }
      }
      if (static_cast<int>(keep.size()) != budget) {
        a.error = absl::StrCat("the draft kept ", keep.size(), " valid positions, budget ", budget);
        return a;
      }
      t.set_method(v1::TRIM_DRAFTMAP);
      t.mutable_keep()->Assign(keep.begin(), keep.end());
      break;
    }
    case DraftMethod::kSpecKv:
      t.set_method(v1::TRIM_SPECKV);
      t.mutable_lookahead()->Assign(map->lookahead().begin(), map->lookahead().end());
      t.set_window(std::min(params.trim_window, budget));
      break;
    case DraftMethod::kSnapKv:
      t.set_method(v1::TRIM_SNAPKV);
      t.set_window(std::min(params.trim_window, budget));
      break;
    case DraftMethod::kPyramidKv:
      // The per-layer budgets follow once the model's layer count is known (request_call.cc).
      t.set_method(v1::TRIM_PYRAMIDKV);
      t.set_window(std::min(params.trim_window, budget));
      break;
    case DraftMethod::kStreamingLlm:
      t.set_method(v1::TRIM_STREAMINGLLM);
      t.set_sink_tokens(std::min(4, budget));
      break;
    default:
      a.error = absl::StrCat(DraftMethodName(m), " is not available");
      return a;
  }
  t.set_budget(budget);
  a.kv_entries = budget;
  return a;
}

}  // namespace tripod::scheduler
