// The stream writer's states without a network: a writer whose gRPC operations are recorded, and
// gRPC's callbacks (OnWriteDone, OnCancel, OnDone) called by hand in each order that matters.
#include "common/rpc/server_stream_writer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "tripod/v1/decode.pb.h"

namespace tripod {
namespace {

using Msg = v1::GenerateResponse;

Msg Token(int t) {
  Msg m;
  m.set_token(t);
  return m;
}

class RecordingWriter : public ServerStreamWriter<Msg> {
 public:
  using ServerStreamWriter<Msg>::ServerStreamWriter;

  Mutex mu;
  std::vector<int> written ABSL_GUARDED_BY(mu);  // tokens handed to gRPC, in order
  int writes_out ABSL_GUARDED_BY(mu) = 0;        // written, OnWriteDone not yet called
  std::vector<grpc::StatusCode> finishes ABSL_GUARDED_BY(mu);

  int out() {
    MutexLock l(&mu);
    return writes_out;
  }
  std::vector<int> tokens() {
    MutexLock l(&mu);
    return written;
  }
  std::vector<grpc::StatusCode> finished() {
    MutexLock l(&mu);
    return finishes;
  }
  // gRPC completing the outstanding write.
  void Complete(bool ok) {
    {
      MutexLock l(&mu);
      ASSERT_EQ(writes_out, 1);
      writes_out = 0;
    }
    OnWriteDone(ok);
  }

 protected:
  void SendWrite(const Msg* m) override {
    MutexLock l(&mu);
    EXPECT_EQ(writes_out, 0) << "two writes out at once";
    EXPECT_TRUE(finishes.empty()) << "a write after Finish";
    ++writes_out;
    written.push_back(m->token());
  }
  void SendFinish(const grpc::Status& s) override {
    MutexLock l(&mu);
    EXPECT_EQ(writes_out, 0) << "Finish while a write is out";
    finishes.push_back(s.error_code());
  }
};

struct Counts {
  std::atomic<int> gone{0}, before_finish{0}, done{0};
};

std::shared_ptr<RecordingWriter> NewWriter(Counts& c) {
  StreamHooks h;
  h.on_client_gone = [&c] { ++c.gone; };
  h.before_finish = [&c] { ++c.before_finish; };
  h.on_done = [&c] { ++c.done; };
  auto w = std::make_shared<RecordingWriter>(std::move(h));
  w->Open();
  return w;
}

TEST(ServerStreamWriterTest, WritesOneAtATimeInOrderThenFinishesOnce) {
  Counts c;
  auto w = NewWriter(c);
  EXPECT_EQ(w->state(), StreamState::kOpen);
  EXPECT_TRUE(w->Write(Token(1)));
  EXPECT_EQ(w->state(), StreamState::kWriting);
  EXPECT_TRUE(w->Write(Token(2)));
  EXPECT_TRUE(w->Write(Token(3)));
  EXPECT_EQ(w->tokens(), std::vector<int>({1}));
  w->End(grpc::Status::OK);
  EXPECT_EQ(w->state(), StreamState::kEnding);
  EXPECT_FALSE(w->open());
  EXPECT_FALSE(w->Write(Token(4)));                                // after the end: dropped
  w->End(grpc::Status(grpc::StatusCode::INTERNAL, "second end"));  // ignored
  w->Complete(true);
  w->Complete(true);
  EXPECT_TRUE(w->finished().empty());
  w->Complete(true);
  EXPECT_EQ(w->tokens(), std::vector<int>({1, 2, 3}));
  EXPECT_EQ(w->finished(), std::vector<grpc::StatusCode>({grpc::StatusCode::OK}));
  EXPECT_EQ(w->state(), StreamState::kFinished);
  EXPECT_EQ(c.before_finish, 1);
  EXPECT_EQ(c.gone, 0);
  w->OnCancel();  // after Finish: nothing more
  EXPECT_EQ(w->finished().size(), 1u);
  w->OnDone();
  EXPECT_EQ(w->state(), StreamState::kDone);
  EXPECT_EQ(c.done, 1);
}

TEST(ServerStreamWriterTest, IdleWriterGoesBackToOpenAndEndsAtOnce) {
  Counts c;
  auto w = NewWriter(c);
  w->Write(Token(7));
  w->Complete(true);
  EXPECT_EQ(w->state(), StreamState::kOpen);
  w->End(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "no room"));
  EXPECT_EQ(w->finished(), std::vector<grpc::StatusCode>({grpc::StatusCode::RESOURCE_EXHAUSTED}));
  EXPECT_EQ(w->state(), StreamState::kFinished);
  w->OnDone();  // gRPC lets go of every call: the writer's hold on itself ends
}

TEST(ServerStreamWriterTest, ClientGoneWhileIdleFinishesCancelledAtOnce) {
  Counts c;
  auto w = NewWriter(c);
  w->OnCancel();
  EXPECT_EQ(c.gone, 1);
  EXPECT_EQ(w->finished(), std::vector<grpc::StatusCode>({grpc::StatusCode::CANCELLED}));
  EXPECT_FALSE(w->Write(Token(1)));
  w->End(grpc::Status::OK);
  EXPECT_EQ(w->finished().size(), 1u);
  EXPECT_TRUE(w->tokens().empty());
  w->OnDone();
}

// The race of a vanished client: OnCancel while a write is out cannot finish the call (one
// operation at a time); the write then comes back, failed or not, and that finishes it.
TEST(ServerStreamWriterTest, ClientGoneWhileAWriteIsOutFinishesWhenTheWriteReturns) {
  for (bool write_ok : {false, true}) {
    Counts c;
    auto w = NewWriter(c);
    w->Write(Token(1));
    w->Write(Token(2));
    w->OnCancel();
    EXPECT_EQ(c.gone, 1);
    EXPECT_EQ(w->state(), StreamState::kEnding);
    EXPECT_TRUE(w->finished().empty());
    EXPECT_FALSE(w->Write(Token(3)));
    w->Complete(write_ok);
    EXPECT_EQ(c.gone, 1) << "told once";
    EXPECT_EQ(w->tokens(), std::vector<int>({1})) << "the queue was dropped";
    EXPECT_EQ(w->finished(), std::vector<grpc::StatusCode>({grpc::StatusCode::CANCELLED}));
    EXPECT_EQ(c.before_finish, 1);
    w->OnDone();
  }
}

TEST(ServerStreamWriterTest, FailedWriteIsAVanishedClient) {
  Counts c;
  auto w = NewWriter(c);
  w->Write(Token(1));
  w->Write(Token(2));
  w->Complete(false);
  EXPECT_EQ(c.gone, 1);
  EXPECT_EQ(w->finished(), std::vector<grpc::StatusCode>({grpc::StatusCode::CANCELLED}));
  w->OnCancel();  // gRPC's own notice after the failed write
  EXPECT_EQ(c.gone, 1);
  EXPECT_EQ(w->finished().size(), 1u);
  w->OnDone();
}

TEST(ServerStreamWriterTest, KnownEndSurvivesTheClientLeaving) {
  Counts c;
  auto w = NewWriter(c);
  w->Write(Token(1));
  w->Write(Token(2));
  w->End(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad"));
  w->OnCancel();
  w->Complete(false);
  EXPECT_EQ(w->tokens(), std::vector<int>({1}));
  EXPECT_EQ(w->finished(), std::vector<grpc::StatusCode>({grpc::StatusCode::INVALID_ARGUMENT}));
  w->OnDone();
}

TEST(ServerStreamWriterTest, ReplaceLastOnlyTouchesAQueuedMessage) {
  Counts c;
  auto w = NewWriter(c);
  EXPECT_FALSE(w->ReplaceLast(Token(9)));  // nothing queued
  w->Write(Token(1));
  EXPECT_FALSE(w->ReplaceLast(Token(9)));  // 1 is being written
  w->Write(Token(2));
  EXPECT_TRUE(w->ReplaceLast(Token(3)));
  w->Complete(true);
  w->Complete(true);
  EXPECT_EQ(w->tokens(), std::vector<int>({1, 3}));
  w->End(grpc::Status::OK);
  w->OnDone();
}

TEST(ServerStreamWriterTest, DoneReleasesTheWriterAndRefusesLateWrites) {
  Counts c;
  std::weak_ptr<RecordingWriter> weak;
  {
    auto w = NewWriter(c);
    weak = w;
    w->End(grpc::Status::OK);
  }
  ASSERT_NE(weak.lock(), nullptr) << "held until OnDone";
  auto late = weak.lock();
  late->OnDone();
  EXPECT_EQ(c.done, 1);
  EXPECT_FALSE(late->Write(Token(1)));  // an engine callback after the call is done
  late.reset();
  EXPECT_EQ(weak.lock(), nullptr);
}

// Producers on several threads while "gRPC" completes writes on another: each producer's
// messages arrive in its order, never two writes out, one Finish after the last.
TEST(ServerStreamWriterTest, ConcurrentProducersAndCompletions) {
  Counts c;
  auto w = NewWriter(c);
  constexpr int kProducers = 4, kEach = 200;
  std::atomic<bool> stop{false};
  std::thread grpc_thread([&] {
    while (!stop.load()) {
      if (w->out() == 1) {
        w->Complete(true);
      } else {
        std::this_thread::yield();
      }
    }
  });
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      for (int i = 0; i < kEach; ++i) EXPECT_TRUE(w->Write(Token(p * kEach + i)));
    });
  }
  for (auto& t : producers) t.join();
  w->End(grpc::Status::OK);
  const absl::Time until = absl::Now() + absl::Seconds(30);
  while (w->finished().empty() && absl::Now() < until) absl::SleepFor(absl::Milliseconds(1));
  stop = true;
  grpc_thread.join();
  const std::vector<int> got = w->tokens();
  ASSERT_EQ(got.size(), static_cast<size_t>(kProducers * kEach));
  std::vector<int> last(kProducers, -1);
  for (int t : got) {
    EXPECT_GT(t % kEach, last[t / kEach]);
    last[t / kEach] = t % kEach;
  }
  EXPECT_EQ(w->finished(), std::vector<grpc::StatusCode>({grpc::StatusCode::OK}));
  w->OnDone();
}

}  // namespace
}  // namespace tripod
