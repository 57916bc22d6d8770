// UnderscoredArgs: flag names with dashes become abseil's underscores; values, argv[0] and
// positional arguments stay as they are.
#include "common/util/flag_args.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tripod {
namespace {

TEST(UnderscoredArgsTest, RewritesFlagNamesOnly) {
  std::vector<std::string> in = {"tripod-decode",
                                 "--kv-budget-mb=64",
                                 "--log-level",
                                 "debug",
                                 "--model=my-model.gguf",
                                 "-x-y",
                                 "--",
                                 "pos-it-ional"};
  std::vector<char*> argv;
  for (std::string& s : in) argv.push_back(s.data());
  UnderscoredArgs args(static_cast<int>(argv.size()), argv.data());
  ASSERT_EQ(args.argc(), static_cast<int>(in.size()));
  const std::vector<std::string> want = {"tripod-decode",
                                         "--kv_budget_mb=64",
                                         "--log_level",
                                         "debug",
                                         "--model=my-model.gguf",
                                         "-x-y",
                                         "--",
                                         "pos-it-ional"};
  for (int i = 0; i < args.argc(); ++i) EXPECT_EQ(args.argv()[i], want[i]) << i;
  EXPECT_EQ(in[1], "--kv-budget-mb=64");  // the caller's argv is left as it was
}

}  // namespace
}  // namespace tripod
