#include "scheduler/api_keys.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

namespace tripod::scheduler {
namespace {

TEST(ApiKeysTest, NoKeysLetsEveryoneIn) {
  ApiKeys keys;
  EXPECT_FALSE(keys.enabled());
  EXPECT_FALSE(keys.Check(nullptr).has_value());
}

TEST(ApiKeysTest, BearerKeyRequired) {
  absl::StatusOr<ApiKeys> keys = ApiKeys::Load("s3cret", "");
  ASSERT_TRUE(keys.ok());
  std::optional<ApiError> e = keys->Check(nullptr);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->http_status, 401);
  EXPECT_EQ(e->type, "authentication_error");
  const std::string good = "Bearer s3cret", lower = "bearer s3cret", bad = "Bearer s3cres",
                    prefix = "Bearer s3cre", bare = "s3cret";
  EXPECT_FALSE(keys->Check(&good).has_value());
  EXPECT_FALSE(keys->Check(&lower).has_value());
  EXPECT_TRUE(keys->Check(&bad).has_value());
  EXPECT_TRUE(keys->Check(&prefix).has_value());
  EXPECT_TRUE(keys->Check(&bare).has_value());
  // The key never appears in the message.
  EXPECT_EQ(keys->Check(&bad)->message.find("s3cre"), std::string::npos);
}

TEST(ApiKeysTest, KeyFile) {
  const std::string path = testing::TempDir() + "/keys.txt";
  {
    std::ofstream f(path);
    f << "# team keys\n\n  alpha  \nbeta\n";
  }
  absl::StatusOr<ApiKeys> keys = ApiKeys::Load("", path);
  ASSERT_TRUE(keys.ok()) << keys.status();
  const std::string a = "Bearer alpha", b = "Bearer beta", c = "Bearer # team keys";
  EXPECT_FALSE(keys->Check(&a).has_value());
  EXPECT_FALSE(keys->Check(&b).has_value());
  EXPECT_TRUE(keys->Check(&c).has_value());
  {
    std::ofstream f(path);
    f << "# nothing\n";
  }
  EXPECT_FALSE(ApiKeys::Load("", path).ok());
  EXPECT_FALSE(ApiKeys::Load("", path + ".missing").ok());
  std::remove(path.c_str());
}

TEST(ApiKeysTest, ConstantTimeEquals) {
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "ab"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
}

}  // namespace
}  // namespace tripod::scheduler
