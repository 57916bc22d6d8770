#include "common/model/utf8.h"

#include <gtest/gtest.h>

namespace tripod {
namespace {

TEST(ToValidUtf8Test, ValidTextIsUnchangedAndBadBytesBecomeReplacements) {
  EXPECT_EQ(ToValidUtf8("héllo, 世界 🙂"), "héllo, 世界 🙂");
  EXPECT_EQ(ToValidUtf8(""), "");
  EXPECT_EQ(ToValidUtf8("a\xE4\xB8"), "a\xEF\xBF\xBD\xEF\xBF\xBD");  // a split character
  EXPECT_EQ(ToValidUtf8("\x80x"), "\xEF\xBF\xBDx");                  // a lone continuation
  EXPECT_EQ(ToValidUtf8(std::string("a\0b", 3)), std::string("a\0b", 3));
}

}  // namespace
}  // namespace tripod
