// Where the bundled model (the model catalogue's default, SmolLM2-135M-Instruct, fetched by
// scripts/setup) lives: models/ under the working directory, else under the directories above
// the running binary (build/<preset>/), else under the source tree the binary was built from
// (CheckoutDirs in model_resolver.h). ResolveModel("") finds it in the model cache too.
#pragma once

#include <string>

namespace tripod {

std::string BundledModelPath();

}  // namespace tripod
