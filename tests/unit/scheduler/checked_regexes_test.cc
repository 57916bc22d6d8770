// The scheduler's memory of good structured-output patterns: what it holds, its byte bound
// (the oldest forgotten first), and that a refused pattern stays refused.
#include "scheduler/checked_regexes.h"

#include <gtest/gtest.h>

#include <string>
#include <variant>

#include "scheduler/structured_output.h"

namespace tripod::scheduler {
namespace {

TEST(CheckedRegexesTest, RemembersUpToItsBytesOldestFirst) {
  CheckedRegexes c(10);
  EXPECT_FALSE(c.Contains("abcd"));
  c.Add("abcd");
  c.Add("efgh");
  c.Add("abcd");  // already there: still the oldest
  EXPECT_TRUE(c.Contains("abcd"));
  EXPECT_TRUE(c.Contains("efgh"));
  c.Add("ijk");  // 11 bytes: the oldest goes
  EXPECT_FALSE(c.Contains("abcd"));
  EXPECT_TRUE(c.Contains("efgh"));
  EXPECT_TRUE(c.Contains("ijk"));
  c.Add(std::string(11, 'x'));  // larger than the whole bound: not kept, nothing dropped
  EXPECT_FALSE(c.Contains(std::string(11, 'x')));
  EXPECT_TRUE(c.Contains("efgh"));
}

TEST(CheckedRegexesTest, CheckOutputRegexAnswersTheSameTheSecondTime) {
  for (int i = 0; i < 2; ++i) {
    ApiResult<std::string> good = CheckOutputRegex("[a-z]{3,}", "guided_regex");
    ASSERT_TRUE(std::holds_alternative<std::string>(good)) << i;
    EXPECT_EQ(std::get<std::string>(good), "[a-z]{3,}");
    ApiResult<std::string> bad = CheckOutputRegex("[a-z", "guided_regex");
    ASSERT_TRUE(std::holds_alternative<ApiError>(bad)) << i;
    EXPECT_EQ(std::get<ApiError>(bad).param, "guided_regex");
  }
}

}  // namespace
}  // namespace tripod::scheduler
