// spdlog's registry, the default logger and a module logger, made before main, that is before any
// test starts a thread. Debian's libspdlog is not built with TSan, so the registry's creation
// inside it (a function-local static) is invisible to TSan: when a gRPC handler thread logged
// first while the main thread made the registry, the run failed with a race that is none. Which
// test comes first depends on how the test files are batched; made here, the registry exists
// before all of them. Only the tsan preset's test binary links this file (tests/CMakeLists.txt).
#include "common/util/log.h"

namespace {

const bool kLoggingMade = [] {
  tripod::Logger("tsan");
  return spdlog::default_logger() != nullptr;
}();

}  // namespace
