// From a parsed request to one the workers can run, the checks that need the model: the model's
// name (404 for another), the prompt's token ids (the chat template applied), the context
// length (a prompt, or prompt + max_tokens, that cannot fit is a 400 as OpenAI's
// context_length_exceeded), max_tokens when absent (what the context leaves), and a seed when
// the client gave none. Shared by the HTTP and gRPC front ends.
#pragma once

#include "scheduler/completion_request.h"
#include "scheduler/dispatcher.h"
#include "scheduler/openai_json.h"
#include "scheduler/served_model.h"

namespace tripod::scheduler {

// 404 unless `model` is empty (gRPC's "the served model"), the served name or an alias of it.
std::optional<ApiError> CheckModelName(const std::string& model, const ServedModel& served);

// context_length_exceeded for a text prompt (or messages) so long that it cannot fit whatever
// its tokens, judged from its bytes and the longest token (Tokenizer::max_token_bytes) before it
// is encoded: encoding megabytes of text takes a second or more of a thread.
std::optional<ApiError> RefuseUnreadTooLong(const CompletionRequest& request,
                                            const ServedModel& served);

ApiResult<PreparedRequest> PrepareRequest(const CompletionRequest& request,
                                          const ServedModel& served);

}  // namespace tripod::scheduler
