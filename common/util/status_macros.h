// RETURN_IF_ERROR and ASSIGN_OR_RETURN over absl::Status / absl::StatusOr; nothing else.
// Abseil does not ship these macros in its public API, hence this small header.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define TRIPOD_CONCAT_INNER(a, b) a##b
#define TRIPOD_CONCAT(a, b) TRIPOD_CONCAT_INNER(a, b)

#define RETURN_IF_ERROR(expr)                        \
  do {                                               \
    ::absl::Status tripod_status_ = (expr);          \
    if (!tripod_status_.ok()) return tripod_status_; \
  } while (0)

#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL(TRIPOD_CONCAT(tripod_statusor_, __LINE__), lhs, expr)

#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                          \
  if (!tmp.ok()) return tmp.status();         \
  lhs = std::move(tmp).value()
