// A migrated request of several choices (DecodeRequest::continued_choices) made into the
// sequences the engine runs: one per choice, each over the prompt plus that choice's own tokens so
// far, as a single choice that continues them.
#pragma once

#include <vector>

#include "decode_node/request.h"

namespace tripod {

struct ChoiceSequence {
  int choice = 0;         // the request's choice index its events carry
  DecodeRequest request;  // n = 1, no continued_choices
};

// `request`'s continued choices, in their order. Choice c's sequence: the prompt then its tokens
// (a continuation when there are any, the constraint walked over them), its own max_tokens and
// min_tokens, sampling seeded seed + c (the rule of a request's choices); only the first asks
// for the prompt's log-probabilities (they are the same prompt's). Empty when it has none.
std::vector<ChoiceSequence> ContinuedChoiceSequences(const DecodeRequest& request);

}  // namespace tripod
