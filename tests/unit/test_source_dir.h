// The source tree the tests were built from (its models/ and data/ folders).
#pragma once

#include <string>

namespace tripod {

std::string TestSourceDir();

}  // namespace tripod
