// The model file the unit tests load: $TRIPOD_MODEL (ctest sets it), else the bundled model that
// scripts/setup fetched into this source tree.
#pragma once

#include <cstdlib>
#include <string>

#include "tests/unit/test_source_dir.h"

namespace tripod {

inline std::string TestModelPath() {
  const char* env = std::getenv("TRIPOD_MODEL");
  if (env != nullptr && *env != '\0') return env;
  return TestSourceDir() + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

}  // namespace tripod
