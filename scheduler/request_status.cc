#include "scheduler/request_status.h"

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace tripod::scheduler {
namespace {

constexpr char kErrorCodeUrl[] = "tripod-error-code";

}  // namespace

absl::Status WithErrorCode(absl::Status status, absl::string_view code) {
  status.SetPayload(kErrorCodeUrl, absl::Cord(code));
  return status;
}

std::string ErrorCode(const absl::Status& status) {
  const auto code = status.GetPayload(kErrorCodeUrl);
  return code.has_value() ? std::string(*code) : std::string();
}

absl::Status WorkerFailure(absl::string_view what, const absl::Status& status) {
  const std::string message = absl::StrCat(what, ": ", status.message());
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return absl::InvalidArgumentError(message);
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return WithErrorCode(absl::UnavailableError(message), "worker_unavailable");
    default:
      return absl::InternalError(message);
  }
}

int HttpStatusOf(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
      return 400;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kUnavailable:
      return 503;
    default:
      return 500;
  }
}

ApiError ToApiError(const absl::Status& status) {
  ApiError e;
  e.http_status = HttpStatusOf(status);
  e.message = std::string(status.message());
  e.type = e.http_status == 400   ? "invalid_request_error"
           : e.http_status == 429 ? "rate_limit_error"
                                  : "server_error";
  e.code = ErrorCode(status);
  return e;
}

}  // namespace tripod::scheduler
