// The decode loop gives way to a neighbour's queued prompts (DecodeEngineOptions::
// yield_to_prefill_ms): in a core share, while another slot has work queued, a stream that has its
// first token waits (its CPUs lent), a new request still gets its first token at once, the wait is
// bounded, and the tokens are those of a loop that never waits. Each case joins a share, which is
// for the process's lifetime, so it runs in a child (EXPECT_EXIT) beside a forked neighbour.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/util/core_share.h"
#include "common/util/mutex.h"
#include "decode_node/decode_engine.h"
#include "tests/unit/common/util/core_share_neighbour.h"
#include "tests/unit/decode_node/test_engine.h"

namespace tripod::decode_yield_test {
namespace {

std::string SharePath(const char* name) {
  return (std::filesystem::temp_directory_path() /
          (std::string("tripod_decode_yield_") + name + "_" + std::to_string(getpid())))
      .string();
}

// A stream's tokens so far and whether it ended, guarded by mu.
struct Stream {
  Mutex mu;
  std::vector<int32_t> tokens;
  bool done = false;
  int count() {
    MutexLock lock(&mu);
    return static_cast<int>(tokens.size());
  }
  bool ended() {
    MutexLock lock(&mu);
    return done;
  }
};

DecodeRequest Greedy(std::vector<int32_t> prompt, int max_tokens, Stream* out) {
  DecodeRequest r = GreedyRequest(std::move(prompt), max_tokens);
  r.on_event = [out](const TokenEvent& ev) {
    MutexLock lock(&out->mu);
    if (ev.token >= 0) out->tokens.push_back(ev.token);
    if (ev.finish != FinishReason::kNone) out->done = true;
  };
  return r;
}

// Polls `cond` every millisecond; false after `timeout`.
template <class F>
bool Within(absl::Duration timeout, F cond) {
  const absl::Time until = absl::Now() + timeout;
  while (absl::Now() < until) {
    if (cond()) return true;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return cond();
}

const std::vector<int32_t> kPromptA = {1, 504, 3458, 282, 260, 4011, 30, 1217, 314};
const std::vector<int32_t> kPromptB = {1, 2683, 1028, 314, 260, 3587, 30};

// The greedy tokens of a prompt run alone by a loop that never waits (no share joined).
std::vector<int32_t> Alone(const std::vector<int32_t>& prompt, int max_tokens) {
  auto e = NewTestEngine(TestEngineOptions());
  if (e == nullptr) return {};
  Stream s;
  if (!e->Submit(Greedy(prompt, max_tokens, &s)).ok()) return {};
  if (!e->RunUntilIdle().ok()) return {};
  return s.tokens;
}

class DecodeYieldTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

// The cases' bodies, run in a child each (a function: braces do not shield commas in a macro).
void StartedStreamsWait() {
  const std::vector<int32_t> want_a = Alone(kPromptA, 6), want_b = Alone(kPromptB, 6);
  CHILD_CHECK(want_a.size() == 6 && want_b.size() == 6);
  const std::string path = SharePath("wait");
  CHILD_CHECK(CreateCoreShare(path, {{0}, {1}}).ok());
  Neighbour prefill = Neighbour::Start(path, 1);
  CHILD_CHECK(prefill.Ask('j') == 1);
  prefill.Ask('b');  // computing: its CPU is not borrowed
  prefill.Ask('Q');  // with prompts queued
  CHILD_CHECK(JoinCoreShare(path, 0).ok());
  DecodeEngineOptions o = TestEngineOptions();
  o.yield_to_prefill_ms = 600000;  // longer than the test: only the queue's end releases
  auto e = NewTestEngine(o);
  CHILD_CHECK(e != nullptr);
  e->Start();
  Stream a, b;
  CHILD_CHECK(e->Submit(Greedy(kPromptA, 6, &a)).ok());
  // Its first token comes at once; then it waits.
  CHILD_CHECK(Within(absl::Seconds(60), [&] { return a.count() >= 1; }));
  absl::SleepFor(absl::Milliseconds(300));
  CHILD_CHECK(a.count() == 1);
  CHILD_CHECK(e->stats().yielded_seconds > 0.2);
  // A new request runs a step: its first token, and one more of the waiting stream's.
  CHILD_CHECK(e->Submit(Greedy(kPromptB, 6, &b)).ok());
  CHILD_CHECK(Within(absl::Seconds(60), [&] { return b.count() >= 1; }));
  absl::SleepFor(absl::Milliseconds(300));
  CHILD_CHECK(b.count() == 1);
  CHILD_CHECK(a.count() == 2);
  // The neighbour's queue empties: both run to the end, with a loop's unhindered tokens.
  prefill.Ask('E');
  CHILD_CHECK(Within(absl::Seconds(60), [&] { return a.ended() && b.ended(); }));
  CHILD_CHECK(a.tokens == want_a && b.tokens == want_b);
  e->Stop();
  prefill.Exit('q');
  std::filesystem::remove(path);
  std::_Exit(0);
}

void WaitsAreBounded() {
  const std::vector<int32_t> want = Alone(kPromptA, 8);
  CHILD_CHECK(want.size() == 8);
  const std::string path = SharePath("bound");
  CHILD_CHECK(CreateCoreShare(path, {{0}, {1}}).ok());
  Neighbour prefill = Neighbour::Start(path, 1);
  CHILD_CHECK(prefill.Ask('j') == 1);
  prefill.Ask('b');
  prefill.Ask('Q');  // queued for the whole test
  CHILD_CHECK(JoinCoreShare(path, 0).ok());
  for (const int ms : {50, 0}) {
    DecodeEngineOptions o = TestEngineOptions();
    o.yield_to_prefill_ms = ms;
    auto e = NewTestEngine(o);
    CHILD_CHECK(e != nullptr);
    e->Start();
    Stream s;
    CHILD_CHECK(e->Submit(Greedy(kPromptA, 8, &s)).ok());
    CHILD_CHECK(Within(absl::Seconds(60), [&] { return s.ended(); }));
    CHILD_CHECK(s.tokens == want);
    // 7 steps after the first token, each after a wait of up to 50 ms; none with 0.
    const double yielded = e->stats().yielded_seconds;
    CHILD_CHECK(ms == 0 ? yielded == 0 : yielded > 0.2);
    e->Stop();
  }
  prefill.Exit('q');
  std::filesystem::remove(path);
  std::_Exit(0);
}

TEST_F(DecodeYieldTest, StartedStreamsWaitWhileANeighbourQueuesNewOnesStartAtOnce) {
  EXPECT_EXIT(StartedStreamsWait(), ::testing::ExitedWithCode(0), "");
}

TEST_F(DecodeYieldTest, AStreamWaitsNoLongerThanTheBoundAndZeroNeverWaits) {
  EXPECT_EXIT(WaitsAreBounded(), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace tripod::decode_yield_test
