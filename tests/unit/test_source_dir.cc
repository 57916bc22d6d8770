// The one test file that knows the source tree's path (tests/CMakeLists.txt defines
// TRIPOD_SOURCE_DIR for it alone, so that the other test files compile alike in every clone).
#include "tests/unit/test_source_dir.h"

namespace tripod {

std::string TestSourceDir() { return TRIPOD_SOURCE_DIR; }

}  // namespace tripod
