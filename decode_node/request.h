// What a client hands the decode engine (DecodeRequest) and what streams back, one event per
// generated token plus the finish (TokenEvent).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/compute/pop_control.h"
#include "common/kv/kv_snapshot.h"
#include "common/model/sampler.h"
#include "common/structured/token_constraint.h"

namespace tripod {

enum class FinishReason : uint8_t {
  kNone,       // more tokens follow
  kStop,       // end-of-generation token or a stop string
  kLength,     // max_tokens, or the model's context is full
  kCancelled,  // Cancel() or the engine stopped
  kError,      // see TokenEvent::error
};

const char* FinishReasonName(FinishReason r);

// A prompt token's log-probability under the full model, from the logits of the position before
// it (position_logprobs.h: raw, before bias and penalties).
struct PromptTokenLogprob {
  int position = 0;  // 1..n-1: the prompt token's index (token 0 has no logits before it)
  int32_t token = 0;
  float logprob = 0.0f;
  int32_t rank = 0;
  std::vector<TokenLogprob> top;  // DecodeRequest::prompt_logprobs entries, most likely first
};

// One event of a request's stream. Token events carry token >= 0; the last event of every
// request has finish != kNone (it may carry the last token too, or token = -1 when it only
// reports the end: cancellation, errors).
struct TokenEvent {
  int64_t request_id = 0;
  int32_t token = -1;
  int index = 0;     // 0-based index of this token among the choice's generated tokens
  int choice = 0;    // which of the request's n choices (DecodeRequest::n) it belongs to
  std::string text;  // new text that is final (UTF-8 safe, nothing of a stop string)
  float logprob = 0.0f;
  std::vector<TokenLogprob> top_logprobs;  // SamplingParams::top_logprobs entries
  FinishReason finish = FinishReason::kNone;
  std::string error;       // kError only
  bool text_held = false;  // decoded text held back after this event (TokenEvent's text)
  // Prompt tokens whose log-probabilities this step computed (token -1, finish kNone; before
  // the first token's event), in position order.
  std::vector<PromptTokenLogprob> prompt_logprobs;
  // On the last event only:
  int cached_tokens = 0;      // prompt tokens whose KV came from the prefix cache
  double queue_seconds = -1;  // Submit -> the sequence first ran (-1: it never ran)
};

// Called on the engine's thread; must not block for long, and must not call back into the
// engine's Step/RunUntilIdle (Submit and Cancel are fine).
using TokenCallback = std::function<void(const TokenEvent&)>;

inline constexpr size_t kMaxStopTokenIds = 64;
inline constexpr int kMaxChoices = 256;  // DecodeRequest::n at most
// Rows of logits held at once for a request's prompt log-probabilities (x vocabulary floats).
inline constexpr int kPromptLogprobRows = 64;

// One choice of a migrated request of several (DecodeRequest::continued_choices).
struct ContinuedChoice {
  int choice = 0;               // its index among the request's choices
  std::vector<int32_t> tokens;  // its output so far, streamed by a decode worker that died
  int max_tokens = 1;           // what is left of it
  int min_tokens = 0;           // what is left of it
};

struct DecodeRequest {
  std::vector<int32_t> prompt;  // token ids, at least one
  SamplingParams sampling;
  // Generated tokens at most (>= 0; 0: the prompt runs, no token is drawn, the request ends as
  // kLength: the prompt's log-probabilities alone).
  int max_tokens = 16;
  std::vector<std::string> stop;  // stop strings, matched on the decoded text
  bool include_stop_str = false;  // the matched stop string ends the output (vLLM's)
  // Tokens that end the request as a stop (vLLM's stop_token_ids): sorted, each once. The
  // token's text is part of the output unless it is a control token.
  std::vector<int32_t> stop_token_ids;
  // No end-of-generation or stop token before this many tokens (vLLM's min_tokens: they are
  // kept out of the draw; stop strings still apply).
  int min_tokens = 0;
  bool ignore_eos = false;  // keep going past end-of-generation tokens
  // The prompt ends with this request's own earlier output (moved from a decode worker that
  // died): the decoded text continues it (GenerateRequest.continuation).
  bool continuation = false;
  // KV of prompt tokens 0..n-2 computed elsewhere (a prefill worker), maybe trimmed
  // (n_slots != n-1, per-head positions). The engine then runs only the last prompt token, at
  // position n-1, through the full model. Kept until the request ends: a preempted imported
  // sequence is re-imported from it, so its KV never has to be recomputed.
  std::shared_ptr<const KvSnapshot> kv;
  // Or KV of prompt tokens 0..n-2 already written in place into a reservation
  // (DecodeEngine::ReserveKv; a KV transfer filled its blocks): the request adopts those blocks,
  // no copy. reserved_slots must be the reservation's slots (n-1 unless trimmed). A preempted
  // adopting sequence has no snapshot to re-import: it recomputes its prompt with the engine's
  // own (full) plan, which for trimmed or pruned-plan KV may change its later tokens.
  int32_t reserved_kv_seq = -1;
  int reserved_slots = 0;
  bool reserved_trimmed = false;  // the slots are kept positions (SpecKV), not tokens 0..n-2
  // A POP control (tripod.pop_variant; common/compute/pop_control.h): this sequence's rows run
  // the control's plans instead of the engine's full one. Inactive: the engine's plan, as before.
  PopControl pop_control;
  // A structured output (common/structured): every generated token keeps the text on a path to
  // a full match of the constraint; the end-of-generation tokens only where it is complete, and
  // one ends the request even with ignore_eos. Null: unconstrained.
  std::shared_ptr<structured::TokenConstraint> constraint;
  // The prompt's last constraint_generated tokens are this request's earlier output (a
  // migration's continuation): the constraint starts after them.
  int constraint_generated = 0;
  // Choices (the OpenAI API's n, or best_of's candidates): the prompt runs once, then n
  // sequences decode from its KV (PagedKvCache::Fork: the prompt's blocks shared), each with its
  // own sampler seeded sampling.seed + choice, stop strings and max_tokens, and its own engine id.
  // Every choice streams its events (TokenEvent::choice) and ends with its own final event;
  // Cancel of the id Submit returned ends them all.
  int n = 1;
  // A request of several choices moved here from a decode worker that died (the scheduler's
  // migration): the choices not ended there, each run as its own sequence over the prompt plus
  // its own tokens (continued_choices.h), under the one id Submit returns. With them n is 1,
  // continuation false, and max_tokens, min_tokens and constraint_generated are the choices'.
  std::vector<ContinuedChoice> continued_choices;
  // >= 0: every prompt token's log-probability (positions 1..n-1) with this many alternatives
  // (<= SamplingParams::kMaxTopLogprobs), streamed in events before the first token. The engine
  // runs the whole prompt with its full plan for them: not with imported or adopted KV nor a POP
  // control (refused), and the prefix cache is bypassed (cached positions have no logits). The
  // prompt runs in chunks of at most kPromptLogprobRows rows, the logits of which are all that
  // is held at once.
  int prompt_logprobs = -1;
  TokenCallback on_event;  // may be empty
};

}  // namespace tripod
