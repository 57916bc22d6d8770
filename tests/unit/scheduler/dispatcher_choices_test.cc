// A request of n choices through the dispatcher and real workers in this process
// (in_process_workers.h), on both routes: each choice's greedy tokens are the n = 1 tokens, each
// choice ends once (on_choice_end) before on_end, usage counts every choice; a cancelled request
// frees every choice's blocks (the ThreadSanitizer preset runs this).
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "scheduler/dispatcher.h"
#include "tests/unit/scheduler/in_process_workers.h"

namespace tripod::scheduler {
namespace {

// What a front end hears of a request, choice by choice.
struct ChoicesHeard {
  Mutex mu;
  CondVar cv;
  std::map<int, std::vector<int32_t>> tokens ABSL_GUARDED_BY(mu);
  std::map<int, std::vector<std::string>> ends ABSL_GUARDED_BY(mu);
  bool ended_after_choices ABSL_GUARDED_BY(mu) = false;
  std::optional<CompletionEnd> end ABSL_GUARDED_BY(mu);
  std::optional<absl::Status> error ABSL_GUARDED_BY(mu);
  int n = 1;

  RequestCallbacks Callbacks() {
    RequestCallbacks cb;
    cb.on_token = [this](const GeneratedToken& t) {
      MutexLock l(&mu);
      if (t.id >= 0) tokens[t.choice].push_back(t.id);
      cv.SignalAll();
    };
    cb.on_choice_end = [this](int choice, const std::string& finish) {
      MutexLock l(&mu);
      ends[choice].push_back(finish);
    };
    cb.on_end = [this](const CompletionEnd& e) {
      MutexLock l(&mu);
      ended_after_choices = static_cast<int>(ends.size()) == n;
      end = e;
      cv.SignalAll();
    };
    cb.on_error = [this](const absl::Status& e) {
      MutexLock l(&mu);
      error = e;
      cv.SignalAll();
    };
    return cb;
  }
  bool Wait(size_t each, absl::Duration timeout = absl::Seconds(120)) {
    MutexLock l(&mu);
    const absl::Time until = absl::Now() + timeout;
    auto enough = [&] {
      if (end || error || static_cast<int>(tokens.size()) < n) return end || error;
      for (const auto& [c, t] : tokens) {
        if (t.size() < each) return false;
      }
      return true;
    };
    while (!enough() && absl::Now() < until) cv.WaitWithDeadline(&mu, until);
    return enough();
  }
};

class DispatcherChoicesTest : public InProcessWorkersTest {};

TEST_F(DispatcherChoicesTest, GreedyChoicesOnBothRoutes) {
  DispatcherOptions o;
  o.direct_prefill_tokens = 8;
  MakeDispatcher(o);
  for (const int len : {45, 5}) {  // through the prefill worker; straight to the decode worker
    SCOPED_TRACE(len);
    const std::vector<int32_t> prompt = SomeIds(len, 7);
    ChoicesHeard one, three;
    three.n = 3;
    absl::Status refused;
    auto h1 =
        dispatcher_->Submit(Greedy(prompt, 6, PopChoice::Kind::kOff), one.Callbacks(), &refused);
    ASSERT_NE(h1, nullptr) << refused;
    ASSERT_TRUE(one.Wait(6));
    PreparedRequest r = Greedy(prompt, 6, PopChoice::Kind::kOff);
    r.n = 3;
    auto h3 = dispatcher_->Submit(std::move(r), three.Callbacks(), &refused);
    ASSERT_NE(h3, nullptr) << refused;
    ASSERT_TRUE(three.Wait(6));
    const absl::Time until = absl::Now() + absl::Seconds(60);
    MutexLock l1(&one.mu);
    MutexLock l3(&three.mu);
    while (!three.end && !three.error && absl::Now() < until) {
      three.cv.WaitWithDeadline(&three.mu, until);
    }
    ASSERT_TRUE(three.end.has_value()) << (three.error ? three.error->ToString() : "no end");
    EXPECT_TRUE(one.ends.empty());  // n = 1 ends with on_end alone
    ASSERT_EQ(one.tokens[0].size(), 6u);
    ASSERT_EQ(three.tokens.size(), 3u);
    for (int c = 0; c < 3; ++c) {
      EXPECT_EQ(three.tokens[c], one.tokens[0]) << "choice " << c;
      EXPECT_EQ(three.ends[c], std::vector<std::string>{"length"}) << "choice " << c;
    }
    EXPECT_TRUE(three.ended_after_choices);
    EXPECT_EQ(three.end->usage.prompt_tokens, len);
    EXPECT_EQ(three.end->usage.completion_tokens, 18);
    EXPECT_EQ(three.end->finish_reason, "length");
    EXPECT_EQ(three.end->times.route, len > 8 ? "disaggregated" : "decode_only");
  }
  EXPECT_TRUE(DecodeIdle());
}

TEST_F(DispatcherChoicesTest, CancelEndsEveryChoice) {
  MakeDispatcher(DispatcherOptions{});
  ChoicesHeard out;
  out.n = 4;
  PreparedRequest r = Greedy(SomeIds(60, 4), 5000, PopChoice::Kind::kDefault);
  r.n = 4;
  absl::Status refused;
  auto h = dispatcher_->Submit(std::move(r), out.Callbacks(), &refused);
  ASSERT_NE(h, nullptr) << refused;
  ASSERT_TRUE(out.Wait(2));
  h->Cancel();
  EXPECT_TRUE(DecodeIdle());  // every choice's blocks freed
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (dispatcher_->running() > 0 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(dispatcher_->running(), 0);
  MutexLock l(&out.mu);
  EXPECT_FALSE(out.end.has_value());
  EXPECT_FALSE(out.error.has_value());
}

}  // namespace
}  // namespace tripod::scheduler
