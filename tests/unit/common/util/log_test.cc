// Tests for the module loggers (common/util/log.h).
#include "common/util/log.h"

#include <memory>

#include "gtest/gtest.h"

namespace tripod {
namespace {

TEST(LogTest, ParsesEveryLevelAndRefusesOthers) {
  EXPECT_EQ(*ParseLogLevel("trace"), spdlog::level::trace);
  EXPECT_EQ(*ParseLogLevel("debug"), spdlog::level::debug);
  EXPECT_EQ(*ParseLogLevel("info"), spdlog::level::info);
  EXPECT_EQ(*ParseLogLevel("WARN"), spdlog::level::warn);
  EXPECT_EQ(*ParseLogLevel("error"), spdlog::level::err);
  const absl::StatusOr<spdlog::level::level_enum> bad = ParseLogLevel("loud");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--log_level=loud"), std::string::npos);
}

TEST(LogTest, OneLoggerPerModuleNamedAfterIt) {
  spdlog::logger& a = Logger("log_test.a");
  EXPECT_EQ(&a, &Logger("log_test.a"));
  EXPECT_NE(&a, &Logger("log_test.b"));
  EXPECT_EQ(a.name(), "log_test.a");
}

TEST(LogTest, TheLevelReachesLoggersMadeBeforeAndAfter) {
  const spdlog::level::level_enum was = spdlog::get_level();
  const std::shared_ptr<spdlog::logger> default_was = spdlog::default_logger();
  spdlog::logger& before = Logger("log_test.before");
  SetUpLogging("log_test", spdlog::level::debug);
  EXPECT_TRUE(before.should_log(spdlog::level::debug));
  EXPECT_TRUE(Logger("log_test.after_debug").should_log(spdlog::level::debug));
  EXPECT_EQ(spdlog::default_logger()->name(), "log_test");
  SetUpLogging("log_test", spdlog::level::warn);
  EXPECT_FALSE(before.should_log(spdlog::level::info));
  EXPECT_FALSE(Logger("log_test.after_warn").should_log(spdlog::level::info));
  EXPECT_TRUE(Logger("log_test.after_warn").should_log(spdlog::level::warn));
  SetUpLogging("log_test", was);
  spdlog::set_default_logger(default_was);  // the other tests' output as it was
}

TEST(LogTest, RequestTagNamesTheRequest) {
  EXPECT_EQ(RequestTag(42), "req 42: ");
  EXPECT_EQ(RequestTag(0), "");
}

}  // namespace
}  // namespace tripod
