// One server-streaming call's writes on gRPC's callback API. gRPC takes one write at a time and
// no Finish while a write is out; producers (an engine's thread, a dispatcher's callbacks) write
// whenever they like. This queues their messages, writes them one at a time, finishes the call
// exactly once after the queue is written, and handles the client that vanishes: OnCancel or a
// failed write drops the queue, tells the owner once (on_client_gone), and finishes the call
// CANCELLED as soon as no write is out (at once, or when the outstanding write comes back).
//
// The writer is the call's reactor. Open() hands it to gRPC and keeps it alive until OnDone; the
// owner may keep a shared_ptr longer (an engine's callback may write after the call is done:
// such writes are refused).
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <utility>

#include "common/util/mutex.h"
#include "grpcpp/grpcpp.h"

namespace tripod {

enum class StreamState {
  kOpen,      // no write out, nothing queued; a Write goes out at once
  kWriting,   // one write out; more wait in the queue
  kEnding,    // the end is known and a write is out: the rest of the queue, then Finish
  kFinished,  // Finish issued; gRPC has not let go yet
  kDone,      // gRPC let go of the call (OnDone)
};

// Called outside the writer's lock, each at most once.
struct StreamHooks {
  std::function<void()> on_client_gone;  // the client cancelled, or a write failed
  std::function<void()> before_finish;   // just before Finish goes to gRPC
  std::function<void()> on_done;         // OnDone: gRPC let go of the call
};

template <typename Message>
class ServerStreamWriter : public grpc::ServerWriteReactor<Message>,
                           public std::enable_shared_from_this<ServerStreamWriter<Message>> {
 public:
  explicit ServerStreamWriter(StreamHooks hooks) : hooks_(std::move(hooks)) {}
  ~ServerStreamWriter() override = default;

  // The reactor to return to gRPC; keeps the writer alive until OnDone.
  grpc::ServerWriteReactor<Message>* Open() ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    self_ = this->shared_from_this();
    return this;
  }

  // Queues `message`. False (dropped): the end is known, or the client is gone.
  bool Write(Message message) ABSL_LOCKS_EXCLUDED(mu_) {
    Action a = Action::kNone;
    {
      MutexLock lock(&mu_);
      if (state_ == StreamState::kWriting) {
        queue_.push_back(std::move(message));
        return true;
      }
      if (state_ != StreamState::kOpen) return false;
      in_write_ = std::move(message);
      state_ = StreamState::kWriting;
      a = Action::kWrite;
    }
    Run(a, {});
    return true;
  }

  // Replaces the last queued message, not yet written (a producer merging into it). False: none
  // is waiting (the queue is empty, or the stream takes no more).
  bool ReplaceLast(Message message) ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    if (state_ != StreamState::kWriting || queue_.empty()) return false;
    queue_.back() = std::move(message);
    return true;
  }

  // The call's status: what is queued is written, then the call finishes with it. Only the
  // first end (this, or the client's going) counts.
  void End(const grpc::Status& status) ABSL_LOCKS_EXCLUDED(mu_) {
    Action a = Action::kNone;
    {
      MutexLock lock(&mu_);
      if (state_ == StreamState::kWriting) {
        status_ = status;
        state_ = StreamState::kEnding;
      } else if (state_ == StreamState::kOpen) {
        status_ = status;
        a = FinishLocked();
      }
    }
    Run(a, {});
  }

  // False once the end is known or the client is gone: nothing more will be written.
  bool open() const ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    return state_ == StreamState::kOpen || state_ == StreamState::kWriting;
  }
  StreamState state() const ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    return state_;
  }

  // grpc::ServerWriteReactor; gRPC's threads.
  void OnWriteDone(bool ok) ABSL_LOCKS_EXCLUDED(mu_) override {
    Action a = Action::kNone;
    std::function<void()> gone;
    {
      MutexLock lock(&mu_);
      if (state_ != StreamState::kWriting && state_ != StreamState::kEnding) return;
      if (!ok) {
        // The stream is broken (the client went away): nothing more goes out. This is also
        // where a call whose client left while this write was out finishes (OnCancel could
        // not: one operation at a time).
        queue_.clear();
        if (state_ == StreamState::kWriting) {
          status_ = grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
        }
        gone = std::move(hooks_.on_client_gone);
        a = FinishLocked();
      } else if (!queue_.empty()) {
        in_write_ = std::move(queue_.front());
        queue_.pop_front();
        a = Action::kWrite;
      } else if (state_ == StreamState::kEnding) {
        a = FinishLocked();
      } else {
        state_ = StreamState::kOpen;
      }
    }
    Run(a, gone);
  }

  // The client cancelled (or the deadline passed, or the server shuts down): nothing more goes
  // out, and the call finishes CANCELLED (unless its end was known) once no write is out.
  void OnCancel() ABSL_LOCKS_EXCLUDED(mu_) override {
    Action a = Action::kNone;
    std::function<void()> gone;
    {
      MutexLock lock(&mu_);
      queue_.clear();
      gone = std::move(hooks_.on_client_gone);
      if (state_ == StreamState::kOpen) {
        status_ = grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
        a = FinishLocked();
      } else if (state_ == StreamState::kWriting) {
        status_ = grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
        state_ = StreamState::kEnding;  // the outstanding write's OnWriteDone finishes
      }
    }
    Run(a, gone);
  }

  void OnDone() ABSL_LOCKS_EXCLUDED(mu_) override {
    std::shared_ptr<ServerStreamWriter> self;  // released last: `this` may go with it
    StreamHooks hooks;  // they may hold the owner, which holds this writer: let go of them
    {
      MutexLock lock(&mu_);
      state_ = StreamState::kDone;
      queue_.clear();
      hooks = std::move(hooks_);
      self = std::move(self_);
    }
    if (hooks.on_done) hooks.on_done();
  }

 protected:
  // What reaches gRPC (a test records them instead).
  virtual void SendWrite(const Message* message) { this->StartWrite(message); }
  virtual void SendFinish(const grpc::Status& status) {
    grpc::ServerWriteReactor<Message>::Finish(status);
  }

 private:
  enum class Action { kNone, kWrite, kFinish };

  Action FinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    state_ = StreamState::kFinished;
    finish_with_ = status_;
    before_finish_ = std::move(hooks_.before_finish);
    return Action::kFinish;
  }

  // Outside the lock: the owner's hook, then what the transition asked of gRPC. in_write_ and
  // finish_with_ are this thread's alone here: the state lets no one else start an operation.
  void Run(Action a, const std::function<void()>& client_gone) ABSL_LOCKS_EXCLUDED(mu_) {
    if (client_gone) client_gone();
    if (a == Action::kWrite) {
      SendWrite(&in_write_);
    } else if (a == Action::kFinish) {
      if (before_finish_) before_finish_();
      SendFinish(finish_with_);
    }
  }

  mutable Mutex mu_;
  StreamState state_ ABSL_GUARDED_BY(mu_) = StreamState::kOpen;
  std::deque<Message> queue_ ABSL_GUARDED_BY(mu_);
  grpc::Status status_ ABSL_GUARDED_BY(mu_);  // the end, once known
  StreamHooks hooks_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<ServerStreamWriter> self_ ABSL_GUARDED_BY(mu_);
  // Handed from a transition (under mu_) to Run (outside it) on the same thread.
  Message in_write_;  // gRPC reads it until OnWriteDone
  grpc::Status finish_with_;
  std::function<void()> before_finish_;
};

}  // namespace tripod
