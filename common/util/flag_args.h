// Command lines that spell flag names with dashes (--kv-budget-mb) as well as with underscores
// (--kv_budget_mb, abseil's names): the names are rewritten before abseil parses them.
#pragma once

#include <string>
#include <vector>

namespace tripod {

class UnderscoredArgs {
 public:
  // argv[0] and flag values (after '=') stay as they are; so does everything that is no flag.
  UnderscoredArgs(int argc, char** argv);
  UnderscoredArgs(const UnderscoredArgs&) = delete;  // argv() points into args_
  UnderscoredArgs& operator=(const UnderscoredArgs&) = delete;

  int argc() const { return static_cast<int>(argv_.size()); }
  char** argv() { return argv_.data(); }

 private:
  std::vector<std::string> args_;
  std::vector<char*> argv_;
};

}  // namespace tripod
