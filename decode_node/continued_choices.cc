// ContinuedChoiceSequences; see continued_choices.h.
#include "decode_node/continued_choices.h"

#include <cstdint>
#include <utility>

namespace tripod {

std::vector<ChoiceSequence> ContinuedChoiceSequences(const DecodeRequest& request) {
  std::vector<ChoiceSequence> out;
  if (request.continued_choices.empty()) return out;
  DecodeRequest base = request;
  base.continued_choices.clear();
  base.n = 1;
  for (const ContinuedChoice& c : request.continued_choices) {
    ChoiceSequence s{c.choice, base};
    DecodeRequest& r = s.request;
    r.prompt.insert(r.prompt.end(), c.tokens.begin(), c.tokens.end());
    r.continuation = !c.tokens.empty();
    r.constraint_generated = static_cast<int>(c.tokens.size());
    r.max_tokens = c.max_tokens;
    r.min_tokens = c.min_tokens;
    r.sampling.seed = request.sampling.seed + static_cast<uint64_t>(c.choice);
    if (!out.empty()) r.prompt_logprobs = -1;
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace tripod
