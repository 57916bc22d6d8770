// UnderscoredArgs; see flag_args.h.
#include "common/util/flag_args.h"

#include <algorithm>

namespace tripod {

UnderscoredArgs::UnderscoredArgs(int argc, char** argv) : args_(argv, argv + argc), argv_(argc) {
  for (int i = 0; i < argc; ++i) {
    std::string& a = args_[i];
    if (i > 0 && a.size() > 2 && a[0] == '-' && a[1] == '-') {
      const size_t end = std::min(a.find('='), a.size());
      std::replace(a.begin() + 2, a.begin() + end, '-', '_');
    }
    argv_[i] = a.data();
  }
}

}  // namespace tripod
