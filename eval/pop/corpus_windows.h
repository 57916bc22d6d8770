// Token windows cut from a text corpus for the POP analyses (importance, eval-pop): each window
// is a prompt followed by a continuation, taken from consecutive, non-overlapping stretches of
// the tokenised text so that no two windows share text.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/tokenizer.h"

namespace tripod {

struct CorpusWindow {
  std::vector<int32_t> prompt;        // starts with BOS when the tokenizer adds one
  std::vector<int32_t> continuation;  // the tokens that follow the prompt in the text
};

// The prompt lengths (BOS included) of n windows: evenly spread over [min_tokens, max_tokens],
// in an order shuffled with `seed`, so that length and place in the corpus are independent.
std::vector<int> SpreadLengths(int n, int min_tokens, int max_tokens, uint64_t seed);

// Cuts windows with the given prompt lengths (and `continuation` tokens each) from the start of
// the tokenised text, in order. Fails with a clear message when the text is too short.
absl::StatusOr<std::vector<CorpusWindow>> CutWindows(const Tokenizer& tok, const std::string& text,
                                                     const std::vector<int>& prompt_lengths,
                                                     int continuation);

// Reads a whole text file.
absl::StatusOr<std::string> ReadTextFile(const std::string& path);

}  // namespace tripod
