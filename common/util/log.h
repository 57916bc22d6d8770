// Logging: one spdlog logger per module (named "decode.engine", "prefill", "model", ...), all
// writing to stderr through one sink, with one pattern that names the module, at one level that
// each process sets from --log_level. Library and worker code logs through these, never with
// fprintf, so that a process's whole output shares its timestamps, levels and filtering.
//
//   Logger("decode.engine").warn("{}step failed: {}", RequestTag(id), status.ToString());
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "spdlog/spdlog.h"

namespace tripod {

// trace | debug | info | warn | error (what --log_level takes).
absl::StatusOr<spdlog::level::level_enum> ParseLogLevel(absl::string_view name);

// Sets the level of every logger, those made before and after, and makes `process` (e.g.
// "tripod-decode") the default logger's name, so that spdlog::info(...) names the process.
void SetUpLogging(absl::string_view process, spdlog::level::level_enum level);

// The logger of `module`, made on first use. The reference stays valid for the process's life.
spdlog::logger& Logger(absl::string_view module);

// "req 42: ", the prefix that ties a line to a request (nothing for 0, an anonymous request).
std::string RequestTag(uint64_t request_id);

}  // namespace tripod
