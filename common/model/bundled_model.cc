#include "common/model/bundled_model.h"

#include <unistd.h>

namespace tripod {

std::string BundledModelPath() {
  const std::string rel = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (access(rel.c_str(), R_OK) == 0) return rel;
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    exe[n] = 0;
    std::string dir(exe);
    // The binary lives in build/<preset>/ or build/<preset>/bench/: look upwards for models/.
    for (int up = 0; up < 4; ++up) {
      dir = dir.substr(0, dir.rfind('/'));
      const std::string p = dir + "/" + rel;
      if (access(p.c_str(), R_OK) == 0) return p;
    }
  }
  return TRIPOD_SOURCE_DIR "/" + rel;
}

}  // namespace tripod
