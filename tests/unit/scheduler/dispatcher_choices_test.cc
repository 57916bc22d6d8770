// A request of n choices through the dispatcher and real workers in this process
// (in_process_workers.h), on both routes: each choice's greedy tokens are the n = 1 tokens, each
// choice ends once (on_choice_end) before on_end, usage counts every choice; a cancelled request
// frees every choice's blocks (the ThreadSanitizer preset runs this).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "scheduler/dispatcher.h"
#include "tests/unit/scheduler/in_process_workers.h"

namespace tripod::scheduler {
namespace {

class DispatcherChoicesTest : public InProcessWorkersTest {
 protected:
  PreparedRequest Choices(std::vector<int32_t> prompt, int max_tokens, int n) {
    PreparedRequest r = Greedy(std::move(prompt), max_tokens, PopChoice::Kind::kOff);
    r.n = n;
    return r;
  }
};

TEST_F(DispatcherChoicesTest, GreedyChoicesOnBothRoutes) {
  DispatcherOptions o;
  o.direct_prefill_tokens = 8;
  MakeDispatcher(o);
  for (const int len : {45, 5}) {  // through the prefill worker; straight to the decode worker
    SCOPED_TRACE(len);
    const std::vector<int32_t> prompt = SomeIds(len, 7);
    Outcome one, three;
    absl::Status refused;
    auto h1 = dispatcher_->Submit(Choices(prompt, 6, 1), one.Callbacks(), &refused);
    ASSERT_NE(h1, nullptr) << refused;
    auto h3 = dispatcher_->Submit(Choices(prompt, 6, 3), three.Callbacks(), &refused);
    ASSERT_NE(h3, nullptr) << refused;
    ASSERT_TRUE(one.WaitDone());
    ASSERT_TRUE(three.WaitDone());
    MutexLock l1(&one.mu);
    MutexLock l3(&three.mu);
    ASSERT_TRUE(three.end.has_value()) << (three.error ? three.error->ToString() : "no end");
    EXPECT_TRUE(one.choice_ends.empty());  // n = 1 ends with on_end alone
    ASSERT_EQ(one.tokens.size(), 6u);
    ASSERT_EQ(three.choice_tokens.size(), 3u);
    for (int c = 0; c < 3; ++c) {
      EXPECT_EQ(three.choice_tokens[c], one.tokens) << "choice " << c;
      EXPECT_EQ(three.choice_ends[c], std::vector<std::string>{"length"}) << "choice " << c;
    }
    EXPECT_EQ(three.choices_ended_at_end, 3u);
    EXPECT_EQ(three.end->usage.prompt_tokens, len);
    EXPECT_EQ(three.end->usage.completion_tokens, 18);
    EXPECT_EQ(three.end->finish_reason, "length");
    EXPECT_EQ(three.end->times.route, len > 8 ? "disaggregated" : "decode_only");
  }
  EXPECT_TRUE(DecodeIdle());
}

TEST_F(DispatcherChoicesTest, CancelEndsEveryChoice) {
  MakeDispatcher(DispatcherOptions{});
  Outcome out;
  absl::Status refused;
  auto h = dispatcher_->Submit(Choices(SomeIds(60, 4), 5000, 4), out.Callbacks(), &refused);
  ASSERT_NE(h, nullptr) << refused;
  ASSERT_TRUE(out.WaitTokens(8));
  h->Cancel();
  EXPECT_TRUE(DecodeIdle());  // every choice's blocks freed
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (dispatcher_->running() > 0 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(dispatcher_->running(), 0);
  MutexLock l(&out.mu);
  EXPECT_FALSE(out.end.has_value());
  EXPECT_FALSE(out.error.has_value());
  EXPECT_EQ(out.choice_tokens.size(), 4u);  // every choice streamed before the cancel
}

}  // namespace
}  // namespace tripod::scheduler
