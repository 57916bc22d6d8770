// Token sampling from one position's logits: penalties, greedy, top-k / top-p / min-p truncation,
// temperature, a seeded draw, and the log-probabilities reported back to the client.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "absl/status/status.h"

namespace tripod {

// A bias added to one token's logit before anything else (OpenAI's logit_bias): -100 all but
// bans it, +100 all but forces it.
struct TokenBias {
  int32_t id;
  float bias;
  bool operator==(const TokenBias&) const = default;
};

// Sampling parameters of one request. Defaults sample from the model's own distribution.
struct SamplingParams {
  float temperature = 1.0f;         // 0 = greedy (argmax; ties -> lowest id)
  int top_k = 0;                    // 0 = off
  float top_p = 1.0f;               // 1 = off
  float min_p = 0.0f;               // 0 = off
  float repetition_penalty = 1.0f;  // CTRL-style: logit>0 ? logit/p : logit*p, over tokens seen
  float presence_penalty = 0.0f;    // OpenAI semantics: -= presence if count>0
  float frequency_penalty = 0.0f;   // -= frequency * count
  uint64_t seed = 0;
  // 0..20: how many most likely tokens to report. Log-probabilities are the log-softmax of the
  // logits after the logit bias and the penalties, before temperature and truncation: the
  // model's distribution as the bias and penalties shaped it, independent of how adventurous the
  // draw is (vLLM reports the raw model log-probs by default; with no penalties set, the two
  // agree).
  int top_logprobs = 0;
  // Sorted by id, each id once, biases in [-100, 100]; ids past the vocabulary are ignored.
  std::vector<TokenBias> logit_bias;

  static constexpr int kMaxTopLogprobs = 20;
  static constexpr size_t kMaxLogitBias = 1024;  // entries: a bound on a request's size
  static constexpr float kMaxAbsBias = 100.0f;

  // Checks every field's range; the message names the field and the value.
  absl::Status Validate() const;
};

struct TokenLogprob {
  int32_t id;
  float logprob;
};

struct SampledToken {
  int32_t id;
  float logprob;                  // of `id`, in the distribution described at top_logprobs
  std::vector<TokenLogprob> top;  // top_logprobs entries, most likely first (ties: lower id)
};

// Samples one token per call. Not thread-safe (it owns an RNG and scratch buffers); one per
// sequence. The pipeline, like llama.cpp's default chain:
//   logit bias -> penalties -> (greedy if temperature == 0) -> top-k -> top-p -> min-p ->
//   temperature -> softmax -> draw.
// top-p and min-p therefore see the temperature-1 distribution (renormalised over what top-k
// kept); temperature only reshapes what survives truncation.
class Sampler {
 public:
  // params should have passed Validate(); out-of-range values are clamped to the nearest
  // meaningful setting rather than crashing. The RNG is std::mt19937_64 seeded with params.seed:
  // the same seed and inputs give the same tokens (the engine's sequence is fixed by the C++
  // standard; candidate order after nth_element is fixed only per standard library).
  Sampler(SamplingParams params, int32_t vocab_size);

  // logits: [vocab] of one position (a shorter or longer span is used as given: ids are
  // 0..logits.size()-1). history: token ids so far (prompt + generated) for the penalties;
  // ids outside the vocabulary are ignored. The repetition penalty counts all of history; the
  // presence and frequency penalties count history[output_start:] only (OpenAI / vLLM apply
  // them to generated tokens; pass the prompt length for that, 0 counts everything).
  // NaN logits count as -inf, +inf as the largest float; if no logit is above -inf every id is
  // equally likely. Empty logits give id -1.
  // suppress: ids that must not be drawn this time (their logits -inf after the bias; vLLM's
  // min_tokens keeps the end-of-generation and stop tokens out this way).
  // allowed: empty, or a bitmask over the ids (bit id % 64 of word id / 64; a structured
  // output's token mask): ids outside it are -inf after the bias, so the log-probabilities are
  // those of the masked distribution (as vLLM reports them). Should the mask and `suppress`
  // leave nothing, the draw is uniform over the mask rather than over every id.
  SampledToken Sample(std::span<const float> logits, std::span<const int32_t> history,
                      size_t output_start = 0, std::span<const int32_t> suppress = {},
                      std::span<const uint64_t> allowed = {});

  const SamplingParams& params() const { return params_; }
  int32_t vocab_size() const { return vocab_size_; }

 private:
  struct Candidate {
    float logit;
    int32_t id;
  };

  void ApplyPenalties(std::span<const int32_t> history, size_t output_start);
  void ApplyMask(std::span<const uint64_t> allowed);  // ids outside it -> -inf
  // The min(k, vocab) best of work_ into *best, best first (logit desc, id asc).
  void BestK(size_t k, std::vector<Candidate>* best) const;
  void FillTopLogprobs(double log_sum_exp, SampledToken* out);
  int32_t Draw(float max_logit);
  // Sorts candidates_ so that its first m entries are the m best (logit desc, id asc), in order.
  void EnsureSortedPrefix(size_t m);
  double UniformDouble();  // in [0, 1)

  SamplingParams params_;
  int32_t vocab_size_;
  std::mt19937_64 rng_;

  std::vector<float> work_;       // logits after penalties
  std::vector<int32_t> count_;    // per-id count over history[output_start:] (zeroed after use)
  std::vector<uint8_t> seen_;     // per-id: appears anywhere in history (cleared after use)
  std::vector<int32_t> touched_;  // ids whose count_/seen_ entries are set
  std::vector<Candidate> top_heap_;
  std::vector<Candidate> candidates_;
  size_t sorted_prefix_ = 0;
  std::vector<float> exp_;      // exp(work_ - max logit), shared by log-probs and top-p
  std::vector<float> weights_;  // draw weights of the candidates
};

}  // namespace tripod
