// Module loggers; see log.h.
#include "common/util/log.h"

#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "spdlog/sinks/stdout_color_sinks.h"

namespace tripod {
namespace {

// [time] [module] [level] message: the module in every line instead of a prefix typed by hand.
constexpr char kPattern[] = "[%Y-%m-%d %H:%M:%S.%e] [%n] [%^%l%$] %v";

// One sink for all, so that lines from several threads and modules never interleave mid-line.
const std::shared_ptr<spdlog::sinks::stderr_color_sink_mt>& Sink() {
  static const auto* sink = new std::shared_ptr<spdlog::sinks::stderr_color_sink_mt>(
      std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  return *sink;
}

std::shared_ptr<spdlog::logger> Make(const std::string& name) {
  auto logger = std::make_shared<spdlog::logger>(name, Sink());
  logger->set_pattern(kPattern);
  // The registry's level (SetUpLogging's), which may have been set before this logger existed.
  logger->set_level(spdlog::get_level());
  return logger;
}

}  // namespace

absl::StatusOr<spdlog::level::level_enum> ParseLogLevel(absl::string_view name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (n == "trace") return spdlog::level::trace;
  if (n == "debug") return spdlog::level::debug;
  if (n == "info") return spdlog::level::info;
  if (n == "warn" || n == "warning") return spdlog::level::warn;
  if (n == "error") return spdlog::level::err;
  return absl::InvalidArgumentError(
      absl::StrCat("--log_level=", name, ": expected trace, debug, info, warn or error"));
}

void SetUpLogging(absl::string_view process, spdlog::level::level_enum level) {
  spdlog::set_level(level);  // every registered logger, and the default for new ones
  auto main = Make(std::string(process));
  spdlog::set_default_logger(main);
}

spdlog::logger& Logger(absl::string_view module) {
  const std::string name(module);
  std::shared_ptr<spdlog::logger> logger = spdlog::get(name);
  if (logger == nullptr) {
    logger = Make(name);
    // Two threads may both miss; the one that registers second keeps the first's logger.
    try {
      spdlog::register_logger(logger);
    } catch (const spdlog::spdlog_ex&) {
      logger = spdlog::get(name);
    }
  }
  return *logger;  // the registry holds it
}

std::string RequestTag(uint64_t request_id) {
  if (request_id == 0) return "";
  return absl::StrCat("req ", request_id, ": ");
}

}  // namespace tripod
