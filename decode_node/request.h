// What a client hands the decode engine (DecodeRequest) and what streams back, one event per
// generated token plus the finish (TokenEvent).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/kv/kv_snapshot.h"
#include "common/model/sampler.h"

namespace tripod {

enum class FinishReason : uint8_t {
  kNone,       // more tokens follow
  kStop,       // end-of-generation token or a stop string
  kLength,     // max_tokens, or the model's context is full
  kCancelled,  // Cancel() or the engine stopped
  kError,      // see TokenEvent::error
};

const char* FinishReasonName(FinishReason r);

// One event of a request's stream. Token events carry token >= 0; the last event of every
// request has finish != kNone (it may carry the last token too, or token = -1 when it only
// reports the end: cancellation, errors).
struct TokenEvent {
  int64_t request_id = 0;
  int32_t token = -1;
  int index = 0;     // 0-based index of this token among the request's generated tokens
  std::string text;  // new text that is final (UTF-8 safe, nothing of a stop string)
  float logprob = 0.0f;
  std::vector<TokenLogprob> top_logprobs;  // SamplingParams::top_logprobs entries
  FinishReason finish = FinishReason::kNone;
  std::string error;  // kError only
};

// Called on the engine's thread; must not block for long, and must not call back into the
// engine's Step/RunUntilIdle (Submit and Cancel are fine).
using TokenCallback = std::function<void(const TokenEvent&)>;

struct DecodeRequest {
  std::vector<int32_t> prompt;  // token ids, at least one
  SamplingParams sampling;
  int max_tokens = 16;            // generated tokens at most (>= 1)
  std::vector<std::string> stop;  // stop strings, matched on the decoded text
  bool ignore_eos = false;        // keep going past end-of-generation tokens
  // KV of prompt tokens 0..n-2 computed elsewhere (a prefill worker), maybe trimmed
  // (n_slots != n-1, per-head positions). The engine then runs only the last prompt token, at
  // position n-1, through the full model. Kept until the request ends: a preempted imported
  // sequence is re-imported from it, so its KV never has to be recomputed.
  std::shared_ptr<const KvSnapshot> kv;
  TokenCallback on_event;  // may be empty
};

}  // namespace tripod
