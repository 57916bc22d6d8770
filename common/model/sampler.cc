// Token sampling: penalties, greedy, top-k / top-p / min-p, temperature, seeded draw, logprobs.
// Candidates are sorted only as far as a cut needs (nth_element for top-k, growing partial sorts
// for top-p), since a full sort of a 49k vocabulary per token is the dominant cost otherwise.
#include "common/model/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_format.h"

namespace tripod {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Above this top_k, one nth_element beats a heap scan.
constexpr int kHeapTopKLimit = 1024;

absl::Status RangeError(const char* field, const char* range, double value) {
  return absl::InvalidArgumentError(
      absl::StrFormat("sampling parameter %s must be %s, got %g", field, range, value));
}

// Clamps out-of-range parameters to the nearest meaningful setting, so that a Sampler built
// without Validate() still behaves (the API layer is expected to have validated).
SamplingParams Sanitize(SamplingParams p) {
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature)) {
    p.temperature = std::isinf(p.temperature) && p.temperature > 0 ? 1e30f : 0.0f;
  }
  p.top_k = std::max(p.top_k, 0);
  p.top_p = std::isnan(p.top_p) ? 1.0f : std::clamp(p.top_p, 0.0f, 1.0f);
  p.min_p = std::isnan(p.min_p) ? 0.0f : std::clamp(p.min_p, 0.0f, 1.0f);
  if (!(p.repetition_penalty > 0.0f) || !std::isfinite(p.repetition_penalty)) {
    p.repetition_penalty = 1.0f;
  }
  if (!std::isfinite(p.presence_penalty)) p.presence_penalty = 0.0f;
  if (!std::isfinite(p.frequency_penalty)) p.frequency_penalty = 0.0f;
  p.top_logprobs = std::clamp(p.top_logprobs, 0, SamplingParams::kMaxTopLogprobs);
  std::erase_if(p.logit_bias, [](const TokenBias& b) { return b.id < 0 || std::isnan(b.bias); });
  for (TokenBias& b : p.logit_bias) {
    b.bias = std::clamp(b.bias, -SamplingParams::kMaxAbsBias, SamplingParams::kMaxAbsBias);
  }
  return p;
}

// exp(x) for x <= 0 in plain float arithmetic that the compiler vectorises (libm's exp is not,
// and one exp per vocabulary entry per token is most of the sampler's cost). Relative error
// about 1e-7; exactly 0 below -87 (where float exp goes denormal) and for -inf. The range test
// is done on the bits as integers: a float compare-and-select is not if-converted (nor
// vectorised) under the default -ftrapping-math.
inline float ExpNonPositive(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693145751953125f;  // ln 2 split so k * kLn2Hi is exact
  constexpr float kLn2Lo = 1.428606765330187e-06f;
  constexpr float kRound = 12582912.0f;       // 1.5 * 2^23: adding it rounds to an integer
  constexpr uint32_t kMinus87 = 0xC2AE0000u;  // bits of -87.0f; more negative floats compare higher
  uint32_t xb;
  std::memcpy(&xb, &x, sizeof(xb));
  const bool under = xb > kMinus87;
  const uint32_t cb = under ? kMinus87 : xb;
  float xc;
  std::memcpy(&xc, &cb, sizeof(xc));
  const float k = (xc * kLog2e + kRound) - kRound;
  const float r = (xc - k * kLn2Hi) - k * kLn2Lo;  // |r| <= ln2 / 2
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = under ? 0 : (static_cast<int32_t>(k) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// NaN -> -inf, +inf -> largest float, -0 -> +0 (ArgMax's integer keys would order -0 below +0).
// On the bits as integers, so that the loop vectorises.
void SanitizeLogits(const float* in, float* out, size_t n) {
  constexpr uint32_t kPosInf = 0x7f800000u, kNegInfBits = 0xff800000u, kMax = 0x7f7fffffu;
  for (size_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, &in[i], sizeof(b));
    const bool nan = (b & 0x7fffffffu) > kPosInf;
    b = b == 0x80000000u ? 0u : b;
    b = b == kPosInf ? kMax : b;
    b = nan ? kNegInfBits : b;
    std::memcpy(&out[i], &b, sizeof(b));
  }
}

// The first index of the largest value (no NaNs, no -0). The maximum is taken over integer keys
// that order like the floats, since an integer max reduction vectorises and a float one does
// not (without -ffast-math); then one scan finds its first position.
size_t ArgMax(const std::vector<float>& v) {
  int32_t best = std::numeric_limits<int32_t>::min();
  for (float f : v) {
    int32_t b;
    std::memcpy(&b, &f, sizeof(b));
    const int32_t key = b ^ ((b >> 31) & 0x7fffffff);  // negative floats: reverse magnitude
    best = key > best ? key : best;
  }
  const int32_t b = best ^ ((best >> 31) & 0x7fffffff);  // the map is its own inverse
  float max_value;
  std::memcpy(&max_value, &b, sizeof(max_value));
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] == max_value) return i;
  }
  return 0;
}

// out[i] = exp((in[i] - shift) * scale) with in[i] <= shift, scale >= 0; returns the sum.
double ExpShifted(const float* in, float shift, float scale, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = ExpNonPositive((in[i] - shift) * scale);
  // Eight running sums, not one: a single chain of dependent adds costs more than the exps.
  double lanes[8] = {};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (size_t j = 0; j < 8; ++j) lanes[j] += out[i + j];
  }
  double sum = 0.0;
  for (; i < n; ++i) sum += out[i];
  for (double lane : lanes) sum += lane;
  return sum;
}

}  // namespace

absl::Status SamplingParams::Validate() const {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature)) {
    return RangeError("temperature", "finite and >= 0", temperature);
  }
  if (top_k < 0) return RangeError("top_k", ">= 0 (0 = off)", top_k);
  if (!(top_p > 0.0f && top_p <= 1.0f)) return RangeError("top_p", "in (0, 1]", top_p);
  if (!(min_p >= 0.0f && min_p <= 1.0f)) return RangeError("min_p", "in [0, 1]", min_p);
  if (!(repetition_penalty > 0.0f) || !std::isfinite(repetition_penalty)) {
    return RangeError("repetition_penalty", "finite and > 0 (1 = off)", repetition_penalty);
  }
  // The OpenAI API's documented range.
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) {
    return RangeError("presence_penalty", "in [-2, 2]", presence_penalty);
  }
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) {
    return RangeError("frequency_penalty", "in [-2, 2]", frequency_penalty);
  }
  if (top_logprobs < 0 || top_logprobs > kMaxTopLogprobs) {
    return RangeError("top_logprobs", "in [0, 20]", top_logprobs);
  }
  if (logit_bias.size() > kMaxLogitBias) {
    return absl::InvalidArgumentError(
        absl::StrFormat("sampling parameter logit_bias holds %d entries; at most %d are allowed",
                        logit_bias.size(), kMaxLogitBias));
  }
  for (size_t i = 0; i < logit_bias.size(); ++i) {
    const TokenBias& b = logit_bias[i];
    if (b.id < 0) return RangeError("logit_bias token id", ">= 0", b.id);
    if (i > 0 && b.id <= logit_bias[i - 1].id) {
      return absl::InvalidArgumentError(
          "sampling parameter logit_bias must be sorted by token id, each id once");
    }
    if (!(b.bias >= -kMaxAbsBias && b.bias <= kMaxAbsBias)) {
      return RangeError("logit_bias value", "in [-100, 100]", b.bias);
    }
  }
  return absl::OkStatus();
}

Sampler::Sampler(SamplingParams params, int32_t vocab_size)
    : params_(Sanitize(params)), vocab_size_(std::max(vocab_size, 0)), rng_(params.seed) {
  work_.reserve(vocab_size_);
  candidates_.reserve(vocab_size_);
}

namespace {
// Candidate order: higher logit first, lower id on ties (so greedy and top lists are stable).
struct Better {
  template <typename C>
  bool operator()(const C& a, const C& b) const {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  }
};
}  // namespace

void Sampler::ApplyPenalties(std::span<const int32_t> history, size_t output_start) {
  const bool repetition = params_.repetition_penalty != 1.0f;
  const bool additive = params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f;
  if (!repetition && !additive) return;
  const size_t n = work_.size();
  if (count_.size() < n) {
    count_.resize(n, 0);
    seen_.resize(n, 0);
  }
  touched_.clear();
  for (size_t i = 0; i < history.size(); ++i) {
    const int32_t id = history[i];
    if (id < 0 || static_cast<size_t>(id) >= n) continue;
    if (!seen_[id]) {
      seen_[id] = 1;
      touched_.push_back(id);
    }
    if (i >= output_start) ++count_[id];
  }
  const float rp = params_.repetition_penalty;
  for (int32_t id : touched_) {
    float& l = work_[id];
    if (repetition) l = l > 0.0f ? l / rp : l * rp;
    const int32_t c = count_[id];
    if (c > 0) {
      l -= params_.frequency_penalty * static_cast<float>(c) + params_.presence_penalty;
    }
    count_[id] = 0;
    seen_[id] = 0;
  }
}

void Sampler::BestK(size_t k, std::vector<Candidate>* best) const {
  // A heap of the k best with the worst on top: one pass, O(n log k), and for most entries a
  // single compare against the current k-th best.
  best->clear();
  k = std::min(k, work_.size());
  if (k == 0) return;
  Better better;
  for (size_t i = 0; i < work_.size(); ++i) {
    const Candidate c{work_[i], static_cast<int32_t>(i)};
    if (best->size() < k) {
      best->push_back(c);
      std::push_heap(best->begin(), best->end(), better);
    } else if (better(c, best->front())) {
      std::pop_heap(best->begin(), best->end(), better);
      best->back() = c;
      std::push_heap(best->begin(), best->end(), better);
    }
  }
  std::sort(best->begin(), best->end(), better);
}

void Sampler::FillTopLogprobs(double log_sum_exp, SampledToken* out) {
  if (params_.top_logprobs == 0) return;
  BestK(params_.top_logprobs, &top_heap_);
  out->top.reserve(top_heap_.size());
  for (const Candidate& c : top_heap_) {
    out->top.push_back({c.id, static_cast<float>(c.logit - log_sum_exp)});
  }
}

void Sampler::ApplyMask(std::span<const uint64_t> allowed) {
  // Word by word: a structured output's masks are mostly all-ones or all-zeros words.
  const size_t n = work_.size();
  for (size_t w = 0; w * 64 < n; ++w) {
    const uint64_t bits = w < allowed.size() ? allowed[w] : 0;
    if (bits == ~uint64_t{0}) continue;
    const size_t end = std::min(n, w * 64 + 64);
    for (size_t i = w * 64; i < end; ++i) {
      if (!((bits >> (i - w * 64)) & 1)) work_[i] = kNegInf;
    }
  }
}

double Sampler::UniformDouble() {
  // 53 random bits; std::uniform_real_distribution is not pinned down by the standard.
  return static_cast<double>(rng_() >> 11) * 0x1.0p-53;
}

void Sampler::EnsureSortedPrefix(size_t m) {
  m = std::min(m, candidates_.size());
  if (m <= sorted_prefix_) return;
  // The first sorted_prefix_ entries already are the best ones, in order. nth_element then a
  // sort of the new stretch: O(n + m log m), where partial_sort would be O(n log m).
  const auto first = candidates_.begin() + sorted_prefix_;
  const auto mid = candidates_.begin() + m;
  std::nth_element(first, mid - 1, candidates_.end(), Better());
  std::sort(first, mid, Better());
  sorted_prefix_ = m;
}

int32_t Sampler::Draw(float max_logit) {
  // Weights relative to the best logit keep exp() in (0, 1]. At temperature 1 the weights are
  // the exponentials computed for the log-probs.
  const size_t m = candidates_.size();
  weights_.resize(m);
  double sum = 0.0;
  if (params_.temperature == 1.0f) {
    for (size_t i = 0; i < m; ++i) {
      weights_[i] = exp_[candidates_[i].id];
      sum += weights_[i];
    }
  } else {
    const float inv_t = 1.0f / params_.temperature;
    for (size_t i = 0; i < m; ++i) weights_[i] = candidates_[i].logit;
    sum = ExpShifted(weights_.data(), max_logit, inv_t, weights_.data(), m);
  }
  const double u = UniformDouble() * sum;
  double acc = 0.0;
  for (size_t i = 0; i < m; ++i) {
    acc += weights_[i];
    if (u < acc) return candidates_[i].id;
  }
  // Rounding left u at the very top: the last candidate with any weight.
  for (size_t i = m; i-- > 0;) {
    if (weights_[i] > 0.0f) return candidates_[i].id;
  }
  return candidates_.front().id;
}

SampledToken Sampler::Sample(std::span<const float> logits, std::span<const int32_t> history,
                             size_t output_start, std::span<const int32_t> suppress,
                             std::span<const uint64_t> allowed) {
  SampledToken out{-1, kNegInf, {}};
  const size_t n = logits.size();
  if (n == 0) return out;

  work_.resize(n);
  SanitizeLogits(logits.data(), work_.data(), n);
  for (const TokenBias& b : params_.logit_bias) {
    if (static_cast<size_t>(b.id) < n) work_[b.id] += b.bias;  // -inf stays -inf
  }
  for (int32_t id : suppress) {
    if (id >= 0 && static_cast<size_t>(id) < n) work_[id] = kNegInf;
  }
  ApplyPenalties(history, output_start);
  if (!allowed.empty()) ApplyMask(allowed);

  size_t argmax = ArgMax(work_);
  float max_logit = work_[argmax];
  if (max_logit == kNegInf) {
    // Nothing is possible; treat every id (every allowed one) as equally likely rather than
    // failing.
    std::fill(work_.begin(), work_.end(), 0.0f);
    if (!allowed.empty()) ApplyMask(allowed);
    argmax = ArgMax(work_);
    max_logit = 0.0f;
  }
  exp_.resize(n);
  const double sum = ExpShifted(work_.data(), max_logit, 1.0f, exp_.data(), n);
  const double log_sum_exp = max_logit + std::log(sum);

  if (params_.temperature == 0.0f) {
    out.id = static_cast<int32_t>(argmax);
  } else {
    sorted_prefix_ = 0;
    bool cut = false;
    if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < n &&
        params_.top_k <= kHeapTopKLimit) {
      // Small k (the usual 20..100): straight from the logits, already in order. -inf entries
      // can only be among the k when fewer than k are finite; drop them.
      BestK(params_.top_k, &candidates_);
      while (!candidates_.empty() && candidates_.back().logit == kNegInf) candidates_.pop_back();
      sorted_prefix_ = candidates_.size();
      cut = true;
    } else {
      candidates_.clear();
      for (size_t i = 0; i < n; ++i) {
        if (work_[i] > kNegInf) candidates_.push_back({work_[i], static_cast<int32_t>(i)});
      }
      if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < candidates_.size()) {
        const size_t k = params_.top_k;
        std::nth_element(candidates_.begin(), candidates_.begin() + (k - 1), candidates_.end(),
                         Better());
        candidates_.resize(k);
        cut = true;
      }
    }
    if (params_.top_p < 1.0f && candidates_.size() > 1) {
      // The smallest prefix (by probability) whose mass reaches top_p; at least one token.
      // Probabilities are at temperature 1 and renormalised over the current candidates.
      double total = sum;  // everything above -inf is still a candidate
      if (cut) {
        total = 0.0;
        for (const Candidate& c : candidates_) total += exp_[c.id];
      }
      const double target = static_cast<double>(params_.top_p) * total;
      double acc = 0.0;
      size_t keep = candidates_.size();
      size_t scanned = 0;
      // Most LLM distributions put top_p of their mass in a few dozen tokens: sort 64 first
      // and widen only when needed.
      for (size_t m = 64;; m *= 4) {
        EnsureSortedPrefix(m);
        const size_t upto = sorted_prefix_;
        for (; scanned < upto; ++scanned) {
          acc += exp_[candidates_[scanned].id];
          if (acc >= target) break;
        }
        if (scanned < upto) {
          keep = scanned + 1;
          break;
        }
        if (upto == candidates_.size()) break;  // rounding: keep everything
      }
      candidates_.resize(keep);
    }
    if (params_.min_p > 0.0f) {
      // p >= min_p * p_max  <=>  logit >= max_logit + log(min_p); the max always stays.
      const double threshold = max_logit + std::log(static_cast<double>(params_.min_p));
      std::erase_if(candidates_, [&](const Candidate& c) { return double{c.logit} < threshold; });
    }
    out.id = Draw(max_logit);
  }
  out.logprob = static_cast<float>(work_[out.id] - log_sum_exp);
  FillTopLogprobs(log_sum_exp, &out);
  return out;
}

}  // namespace tripod
