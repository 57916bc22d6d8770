// LogprobsAt; see position_logprobs.h.
#include "common/model/position_logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace tripod {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// As the sampler reads logits: NaN is impossible, +inf the largest float.
float Clean(float x) {
  if (std::isnan(x)) return kNegInf;
  return std::min(x, std::numeric_limits<float>::max());
}

// a ranks above b: likelier, or as likely with a lower id.
bool Above(float la, int32_t a, float lb, int32_t b) { return la > lb || (la == lb && a < b); }

}  // namespace

PositionLogprobs LogprobsAt(std::span<const float> logits, int32_t token, int top_k) {
  PositionLogprobs out;
  const size_t n = logits.size();
  if (n == 0 || token < 0 || static_cast<size_t>(token) >= n) return out;
  float max_logit = kNegInf;
  for (float x : logits) max_logit = std::max(max_logit, Clean(x));
  // Nothing possible: every id equally likely, as the sampler has it.
  const bool flat = max_logit == kNegInf;
  if (flat) max_logit = 0.0f;
  auto value = [&](size_t i) { return flat ? 0.0f : Clean(logits[i]); };
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(value(i)) - max_logit);
  const double log_sum_exp = max_logit + std::log(sum);
  const float own = value(token);
  out.logprob = static_cast<float>(own - log_sum_exp);
  int32_t above = 0;
  for (size_t i = 0; i < n; ++i) above += Above(value(i), static_cast<int32_t>(i), own, token);
  out.rank = above + 1;

  const size_t k = static_cast<size_t>(std::clamp(top_k, 0, static_cast<int>(n)));
  if (k == 0) return out;
  // A min-heap (the worst of the k best on top) over one pass.
  std::vector<std::pair<float, int32_t>> best;
  best.reserve(k + 1);
  auto worse = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return Above(a.first, a.second, b.first, b.second);
  };
  for (size_t i = 0; i < n; ++i) {
    const std::pair<float, int32_t> c{value(i), static_cast<int32_t>(i)};
    if (best.size() < k) {
      best.push_back(c);
      std::push_heap(best.begin(), best.end(), worse);
    } else if (worse(c, best.front())) {
      std::pop_heap(best.begin(), best.end(), worse);
      best.back() = c;
      std::push_heap(best.begin(), best.end(), worse);
    }
  }
  std::sort(best.begin(), best.end(), worse);
  out.top.reserve(k);
  for (const auto& [logit, id] : best) {
    out.top.push_back({id, static_cast<float>(logit - log_sum_exp)});
  }
  return out;
}

}  // namespace tripod
