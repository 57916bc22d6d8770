// API keys: with any configured, every API call must carry one (HTTP `Authorization: Bearer
// KEY`, gRPC `authorization` metadata with the same value); /metrics and
// /health's bare status stay open (its workers' detail needs a key).
// Keys are compared in constant time (no early exit on the first differing byte, every key
// tried) and never logged.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/completion_request.h"

namespace tripod::scheduler {

class ApiKeys {
 public:
  ApiKeys() = default;
  // `key`: one key (may be empty); `file`: one key per line (blank lines and lines starting with
  // '#' skipped; may be empty). A named file that cannot be read, or holds no key, is an error.
  static absl::StatusOr<ApiKeys> Load(const std::string& key, const std::string& file);

  bool enabled() const { return !keys_.empty(); }
  // nullopt when the call may proceed; else the 401 to answer. `authorization`: the header's
  // value (nullptr: absent).
  std::optional<ApiError> Check(const std::string* authorization) const;

 private:
  std::vector<std::string> keys_;
};

// Equal contents, in time that depends only on the lengths.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

}  // namespace tripod::scheduler
