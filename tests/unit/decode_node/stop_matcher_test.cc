// StopMatcher: nothing of a stop string is streamed, the text before it is, and text that only
// looked like the start of a stop string is released once it cannot be one.
#include "decode_node/stop_matcher.h"

#include <gtest/gtest.h>

#include <string>

namespace tripod {
namespace {

TEST(StopMatcherTest, NoStopsPassesEverything) {
  StopMatcher m({});
  EXPECT_EQ(m.Push("Hello").text, "Hello");
  EXPECT_EQ(m.Push(" world").text, " world");
  EXPECT_EQ(m.Flush(), "");
}

TEST(StopMatcherTest, HoldsBackAPossibleStartAndStopsBeforeTheMatch) {
  StopMatcher m({"END"});
  EXPECT_FALSE(m.holding());
  EXPECT_EQ(m.Push("abc E").text, "abc ");  // "E" may begin END
  EXPECT_TRUE(m.holding());
  StopMatcher::Result r = m.Push("N");
  EXPECT_EQ(r.text, "");
  EXPECT_FALSE(r.stopped);
  r = m.Push("Dtail");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "");  // "abc " was already out; nothing of END or after it
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.Push("more").text, "");
}

TEST(StopMatcherTest, ReleasesAFalseStart) {
  StopMatcher m({"END"});
  EXPECT_EQ(m.Push("xEN").text, "x");
  EXPECT_EQ(m.Push("Q").text, "ENQ");
  EXPECT_EQ(m.Push("E").text, "");
  EXPECT_EQ(m.Flush(), "E");
}

TEST(StopMatcherTest, EarliestOfSeveralStopsWithinOnePiece) {
  StopMatcher m({"world", "lo w", ""});
  StopMatcher::Result r = m.Push("hello world");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "hel");
}

TEST(StopMatcherTest, StopSpanningManyPieces) {
  StopMatcher m({"\n\n"});
  std::string out;
  for (const char* p : {"a", "b\n", "\n", "c"}) {
    StopMatcher::Result r = m.Push(p);
    out += r.text;
    if (r.stopped) break;
  }
  EXPECT_EQ(out, "ab");
  EXPECT_TRUE(m.stopped());
}

TEST(StopMatcherTest, IncludeStopKeepsTheMatchedString) {
  StopMatcher m({"END", "EN", "xyz"}, /*include_stop=*/true);
  EXPECT_EQ(m.Push("abc E").text, "abc ");
  StopMatcher::Result r = m.Push("NDtail");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "END");  // both match at the same place: the one listed first
  EXPECT_EQ(m.Push("more").text, "");
  StopMatcher one({"xyz"}, true);
  r = one.Push("12xyz34");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "12xyz");
}

}  // namespace
}  // namespace tripod
