// How the scheduler's core says why a request failed or was refused: an absl::Status whose code
// says whose fault it is and whose "tripod-error-code" payload carries the short machine-readable
// code a client can act on ("no_workers", "server_busy", ...). Only the front ends (HTTP and
// gRPC Completion) turn it into an ApiError, the OpenAI-shaped error with an HTTP status.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "scheduler/completion_request.h"

namespace tripod::scheduler {

// `status` with the machine-readable `code` attached.
absl::Status WithErrorCode(absl::Status status, absl::string_view code);
// The code attached by WithErrorCode; empty: none.
std::string ErrorCode(const absl::Status& status);

// A worker's refusal or failure as the client's error, prefixed by `what`: its own mistake
// (INVALID_ARGUMENT, OUT_OF_RANGE) stays INVALID_ARGUMENT; overload or absence (RESOURCE_EXHAUSTED,
// UNAVAILABLE, DEADLINE_EXCEEDED) is UNAVAILABLE "worker_unavailable"; anything else INTERNAL.
absl::Status WorkerFailure(absl::string_view what, const absl::Status& status);

// The front ends' view, as for a gRPC status (openai_response.h): INVALID_ARGUMENT 400,
// RESOURCE_EXHAUSTED 429, UNAVAILABLE 503, INTERNAL 500...
int HttpStatusOf(const absl::Status& status);
ApiError ToApiError(const absl::Status& status);

}  // namespace tripod::scheduler
