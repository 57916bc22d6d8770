#include "common/model/bundled_model.h"

#include <unistd.h>

#include "common/model/model_catalogue.h"
#include "common/model/model_resolver.h"

namespace tripod {

std::string BundledModelPath() {
  const std::string rel =
      "/models/" + BuiltinModelCatalogue().Find(BuiltinModelCatalogue().default_model)->file;
  for (const std::string& root : CheckoutDirs()) {
    const std::string p = root + rel;
    if (access(p.c_str(), R_OK) == 0) return p;
  }
  return TRIPOD_SOURCE_DIR + rel;
}

}  // namespace tripod
