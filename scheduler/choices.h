// Several choices for one prompt (the OpenAI API's n and best_of): the counts' checks, and the
// pick of the n best of best_of candidates. The prompt runs once; the decode worker forks its
// KV into the candidates (GenerateRequest.n; decode_node/request.h, DecodeRequest::n), whose
// tokens come back tagged with their choice (GeneratedToken::choice).
//
//   n        1..max_n (--max_n): choices returned, indices 0..n-1
//   best_of  n..max_n: candidates generated (default n); the n with the highest cumulative
//            log-probability are returned (vLLM's rule), re-indexed 0..n-1 in that order.
//            Refused with stream (the best are known only at the end), as OpenAI and vLLM do.
// The same over HTTP and gRPC (whose chunks carry the choice's index).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "scheduler/completion_events.h"
#include "scheduler/completion_request.h"
#include "scheduler/openai_json.h"

namespace tripod::scheduler {

// What a request can ever ask for, whatever --max_n says (the decode worker's bound is larger).
inline constexpr int kMaxChoicesLimit = 128;

// n and best_of as given (absent: nullopt) into request->n and request->best_of.
std::optional<ApiError> ParseChoiceCounts(const std::optional<int64_t>& n,
                                          const std::optional<int64_t>& best_of, bool stream,
                                          CompletionRequest* request);

// 400 (param n or best_of) when the request asks for more than max_n candidates.
std::optional<ApiError> CheckChoiceLimit(const CompletionRequest& request, int max_n);

// Sum of the choice's sampled tokens' log-probabilities.
double CumulativeLogprob(const ChoiceOutput& choice);

// The n candidates with the highest cumulative log-probability, best first (ties: the lower
// index), re-indexed 0..n-1. All of them, in their order, when n >= their count.
std::vector<ChoiceOutput> BestChoices(std::vector<ChoiceOutput> candidates, int n);

// A whole (not streamed) answer's candidates as their tokens and ends come in, for both front
// ends. Not thread-safe.
class Candidates {
 public:
  explicit Candidates(int best_of);
  void AddToken(const GeneratedToken& t);  // to its choice's candidate
  void EndChoice(int choice, const std::string& finish_reason);
  // The n returned (BestChoices); a candidate without its own end ends as the request did.
  std::vector<ChoiceOutput> Best(const CompletionEnd& end, int n) &&;

 private:
  std::vector<ChoiceOutput> all_;
};

}  // namespace tripod::scheduler
