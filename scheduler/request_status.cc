#include "scheduler/request_status.h"

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "scheduler/openai_response.h"

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
  // absl's codes are gRPC's, number for number.
  return HttpStatusForGrpcCode(static_cast<grpc::StatusCode>(status.code()));
}

ApiError ToApiError(const absl::Status& status) {
  ApiError e;
  e.http_status = HttpStatusOf(status);
  e.message = std::string(status.message());
  e.type = DefaultErrorType(e.http_status);
  e.code = ErrorCode(status);
  return e;
}

}  // namespace tripod::scheduler
