// The compression methods as the scheduler applies them to one request (docs/algorithms.md):
// which need the draft worker, what to ask it, and how its importance map changes the
// request. SpecPC replaces the prompt by the kept tokens (an ordinary prompt to the prefill
// worker, so POP still applies); SpecKV hands the draft's lookahead to the prefill worker, which
// scores its own KV with it; the draft map names the KV positions kept; SnapKV and StreamingLLM
// trim on the prefill worker without a draft; keep-last (SpecPC's baseline) keeps the prompt's end.
// Free functions over the wire messages, so that the request lifecycle (request_call.h) only moves
// them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "scheduler/completion_request.h"
#include "tripod/v1/draft.pb.h"
#include "tripod/v1/prefill.pb.h"

namespace tripod::scheduler {

// "none", "speckv", "specpc", "draftmap", "snapkv", "streamingllm", "pyramidkv", "keeplast".
const char* DraftMethodName(DraftMethod m);
// The names above ("" is none); nullopt for any other.
std::optional<DraftMethod> ParseDraftMethod(std::string_view name);

// Methods that need the draft worker's importance map.
bool NeedsDraft(DraftMethod m);
// Methods that trim the KV on the prefill worker (everything but none and the next two).
bool TrimsKv(DraftMethod m);
// Methods that replace the prompt by some of its tokens (SpecPC, keep-last).
bool CompressesPrompt(DraftMethod m);

// Tokens kept for a prompt of n tokens: the budget in tokens as asked, or round(fraction * n) but
// at least min(min_kept, n) and 1. The floor keeps a fraction from gutting a short prompt (a
// 130-token code prompt at 1/4 leaves the model nothing to work from; SnapKV's fixed capacity
// plays the same part); a prompt of min_kept tokens or fewer then runs as without the method.
int ResolveBudget(const MethodChoice& choice, int n, int min_kept);

// Whether `budget` keeps everything a method could drop from a prompt of n tokens: the whole
// prompt (SpecPC, keep-last), or the KV of all n - 1 prefilled tokens (the rest). Then the request
// runs as without the method, bit for bit.
bool BudgetKeepsAll(DraftMethod m, int budget, int n);

struct DraftMethodParams {
  int speckv_lookahead = 64;  // SpecKV's greedy draft tokens at most (also <= max_tokens)
  int trim_window = 32;       // SpecKV and SnapKV's observation window (<= the budget)
  int min_kept = 512;         // a fractional budget keeps at least this many tokens (ResolveBudget)
};

// What the draft worker is asked for a method that needs it (NeedsDraft).
v1::ScoreRequest ScoreRequestFor(DraftMethod m, uint64_t request_id,
                                 const std::vector<int32_t>& prompt, int budget, int max_tokens,
                                 const DraftMethodParams& params);

// A method applied to a request: the prompt the workers see and the prefill worker's trimming.
struct AppliedMethod {
  std::vector<int32_t> prompt;
  v1::Trimming trimming;  // TRIM_NONE: the KV is not trimmed
  int kv_entries = 0;     // entries per layer and head the trimmed KV holds (0: untrimmed)
  std::string error;      // the map cannot be applied (malformed): the request runs without it
};

// `map` is the draft's answer (nullptr for methods without a draft). budget < what
// BudgetKeepsAll needs.
AppliedMethod ApplyMethod(DraftMethod m, int budget, const std::vector<int32_t>& prompt,
                          const v1::ImportanceMap* map, const DraftMethodParams& params);

}  // namespace tripod::scheduler
