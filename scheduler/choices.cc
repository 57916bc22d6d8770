// n and best_of; see choices.h.
#include "scheduler/choices.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tripod::scheduler {

std::optional<ApiError> ParseChoiceCounts(const std::optional<int64_t>& n,
                                          const std::optional<int64_t>& best_of, bool stream,
                                          CompletionRequest* request) {
  const int64_t count = n.value_or(1);
  if (count < 1 || count > kMaxChoicesLimit) {
    return InvalidRequest(
        absl::StrCat("'n' must be an integer in [1, ", kMaxChoicesLimit, "], got ", count), "n");
  }
  const int64_t candidates = best_of.value_or(count);
  if (candidates < count || candidates > kMaxChoicesLimit) {
    return InvalidRequest(absl::StrCat("'best_of' must be an integer in [n = ", count, ", ",
                                       kMaxChoicesLimit, "], got ", candidates),
                          "best_of");
  }
  if (stream && best_of.has_value() && candidates > 1) {
    return InvalidRequest(
        "'best_of' cannot be used with 'stream': the best candidates are known only at the end",
        "best_of");
  }
  request->n = static_cast<int>(count);
  request->best_of = static_cast<int>(candidates);
  return std::nullopt;
}

std::optional<ApiError> CheckChoiceLimit(const CompletionRequest& request, int max_n) {
  if (request.n > max_n) {
    return InvalidRequest(
        absl::StrCat("'n' is ", request.n, "; this server returns at most ", max_n, " choices"),
        "n");
  }
  if (request.best_of > max_n) {
    return InvalidRequest(absl::StrCat("'best_of' is ", request.best_of,
                                       "; this server generates at most ", max_n, " candidates"),
                          "best_of");
  }
  return std::nullopt;
}

double CumulativeLogprob(const ChoiceOutput& choice) {
  double sum = 0;
  for (const GeneratedToken& t : choice.tokens) {
    if (t.id >= 0) sum += t.logprob;
  }
  return sum;
}

std::vector<ChoiceOutput> BestChoices(std::vector<ChoiceOutput> candidates, int n) {
  if (n >= static_cast<int>(candidates.size())) return candidates;
  std::vector<std::pair<double, size_t>> order;
  for (size_t i = 0; i < candidates.size(); ++i) {
    order.emplace_back(CumulativeLogprob(candidates[i]), i);
  }
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<ChoiceOutput> best;
  for (int k = 0; k < n; ++k) {
    best.push_back(std::move(candidates[order[k].second]));
    best.back().index = k;
  }
  return best;
}

Candidates::Candidates(int best_of) {
  for (int i = 0; i < best_of; ++i) all_.push_back(ChoiceOutput{i, {}, ""});
}

void Candidates::AddToken(const GeneratedToken& t) {
  if (t.choice >= 0 && t.choice < static_cast<int>(all_.size())) all_[t.choice].tokens.push_back(t);
}

void Candidates::EndChoice(int choice, const std::string& finish_reason) {
  if (choice >= 0 && choice < static_cast<int>(all_.size())) {
    all_[choice].finish_reason = finish_reason;
  }
}

std::vector<ChoiceOutput> Candidates::Best(const CompletionEnd& end, int n) && {
  for (ChoiceOutput& c : all_) {
    if (c.finish_reason.empty()) c.finish_reason = end.finish_reason;
  }
  return BestChoices(std::move(all_), n);
}

}  // namespace tripod::scheduler
