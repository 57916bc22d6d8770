// POP's controls served per request (tripod.pop_variant): the ablations that docs/pop.md
// compares POP with, run through the same prefill and decode workers as POP itself.
//
//   kPop         POP: the skipped layers K/V-only for prompt tokens 0..n-2, the last prompt
//                token and everything after through the full model (no control).
//   kNoBoundary  all n prompt tokens through POP's pruned plan, the first output token's logits
//                from it; the generated tokens through the full model.
//   kNoKv        the skipped layers write no K/V for prompt tokens 0..n-2 (kSkip) and, from the
//                last prompt token on, see nothing of the prompt (they attend from slot n-1).
//   kShortGpt    the skipped layers removed for every token (kSkip in both stages).
//
// Which plan a row of a controlled sequence runs depends on its position only, so a sequence
// computes the same KV whether its prompt was prefilled by a prefill worker or by the decode
// worker itself, in any chunking, and after preemption.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/compute/plan.h"

namespace tripod {

enum class PopVariant : uint8_t { kPop, kNoBoundary, kNoKv, kShortGpt };

// "pop", "noboundary", "nokv", "shortgpt". Inline, with ParsePopVariant, for the scheduler,
// which validates a request's variant without linking the compute library.
inline const char* PopVariantName(PopVariant v) {
  switch (v) {
    case PopVariant::kPop:
      return "pop";
    case PopVariant::kNoBoundary:
      return "noboundary";
    case PopVariant::kNoKv:
      return "nokv";
    case PopVariant::kShortGpt:
      return "shortgpt";
  }
  return "?";
}

// The inverse of PopVariantName; nullopt for anything else.
inline std::optional<PopVariant> ParsePopVariant(std::string_view name) {
  for (PopVariant v :
       {PopVariant::kPop, PopVariant::kNoBoundary, PopVariant::kNoKv, PopVariant::kShortGpt}) {
    if (name == PopVariantName(v)) return v;
  }
  return std::nullopt;
}

// "1/3", "0.25": a ratio in [0, 1); nullopt otherwise.
std::optional<double> ParsePopRatio(std::string_view text);

// The last floor(n_layers * ratio) layers, ascending (the rule forgives decimal rounding of 1/3
// and 0.2), at most n_layers - 1 of them.
std::vector<int> PopTailLayers(int n_layers, double ratio);

// The prefill stage's plan (prompt tokens 0..n-2, no head): POP's, with the skipped layers kSkip
// instead of K/V-only for kNoKv and kShortGpt.
ForwardPlan PopVariantPrefillPlan(int n_layers, const std::vector<int>& skipped, PopVariant v);

// A controlled sequence on the decode side: its variant, skipped layers, and the original
// prompt's length n (the stage boundary; generated tokens appended to the prompt after a
// migration do not move it).
struct PopControl {
  PopVariant variant = PopVariant::kPop;
  std::vector<int> skipped;
  int prompt_tokens = 0;

  bool active() const { return variant != PopVariant::kPop && !skipped.empty(); }
  // The first position that runs the decode-stage plan: n-1 (kNoKv; kPop), n (kNoBoundary), 0
  // (kShortGpt: one plan for every row).
  int boundary() const;
  // The plan of rows before boundary() and of rows from it on (with the head).
  ForwardPlan PromptPlan(int n_layers) const;
  ForwardPlan DecodePlan(int n_layers) const;
  // kNoKv: the layers that, from the boundary on, see no slot below it; empty otherwise.
  std::vector<bool> HiddenLayers(int n_layers) const;
  // Mixed into a sequence's cache key so that its KV never meets another plan's in the prefix
  // cache.
  uint64_t MixKey(uint64_t plan_key) const;
};

}  // namespace tripod
