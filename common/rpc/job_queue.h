// JobQueue: a worker's requests, run one at a time, first in first out, on the queue's own engine
// thread (never on a gRPC handler thread), with a bounded number waiting. The prefill worker's
// queue (prefill_queue.h) and the draft worker's (draft_worker.h) are two of them.
//
// Cancel(request_id) removes a queued job, or cancels a running one (its CancelToken: the work
// stops at its next check). Shutdown stops accepting, lets what is queued and running finish
// within a grace period, then cancels the rest; it is the process's drain (drain.h).
//
// A Runner does the work of one job and knows nothing of the queue. Its result is the outcome,
// or, when the engine's part is done but the outcome waits on something else (the prefill
// worker's wait for the decode side's acknowledgement), `finish`, which runs on a thread of its
// own while the engine takes the next job (at most Options::max_finishing at once).
//
// Job needs `uint64_t request_id` (0: anonymous, not cancellable by id) and
// `std::chrono::steady_clock::time_point accepted` (set by Submit); Outcome needs
// `absl::Status status` and `double queue_s, total_s`. Everything here is thread-safe.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <iterator>
#include <list>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/rpc/drain.h"
#include "common/util/cancel_token.h"
#include "common/util/core_share.h"
#include "common/util/mutex.h"
#include "common/util/thread_pool.h"

namespace tripod {

template <class Outcome>
struct JobRunResult {
  JobRunResult(Outcome o = {}) : outcome(std::move(o)) {}  // NOLINT: implicit on purpose
  Outcome outcome;
  std::function<Outcome()> finish;
};

template <class Job, class Outcome>
class JobQueue;

// One submitted job: wait on it from the submitting thread.
template <class Job, class Outcome>
class JobTicket {
 public:
  explicit JobTicket(Job job) : job_(std::move(job)) {}
  JobTicket(const JobTicket&) = delete;
  JobTicket& operator=(const JobTicket&) = delete;

  const Job& job() const { return job_; }
  // True once the job has ended (at once if it had), false when `deadline` came first.
  bool WaitUntil(absl::Time deadline) const {
    MutexLock lock(&mu_);
    while (!done_) {
      if (cv_.WaitWithDeadline(&mu_, deadline)) return done_;
    }
    return true;
  }
  bool done() const {
    MutexLock lock(&mu_);
    return done_;
  }
  Outcome outcome() const {  // valid once done()
    MutexLock lock(&mu_);
    return outcome_;
  }

 private:
  friend class JobQueue<Job, Outcome>;
  void Complete(Outcome outcome) {
    MutexLock lock(&mu_);
    outcome_ = std::move(outcome);
    done_ = true;
    cv_.SignalAll();
  }

  const Job job_;
  CancelToken cancel_;
  mutable Mutex mu_;
  mutable CondVar cv_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  Outcome outcome_ ABSL_GUARDED_BY(mu_);
};

template <class Job, class Outcome>
class JobQueue : public Drainable {
 public:
  using Ticket = JobTicket<Job, Outcome>;
  using RunResult = JobRunResult<Outcome>;
  // Does one job's engine work on the engine thread; returns when it has ended (soon after
  // `cancel` is set), with the outcome (to the ticket as it is) or a `finish` to wait for it off
  // the engine thread (`cancel` still applies).
  using Runner = std::function<RunResult(const Job& job, CancelToken& cancel)>;

  struct Options {
    std::string name = "worker";  // "prefill": in the messages of refusals and cancels
    int max_queue = 64;  // jobs waiting (not counting the running one); more: RESOURCE_EXHAUSTED
    // The engine thread calls PinComputeThreads() first: its own OpenMP team,
    // pinned (thread_pool.h).
    bool pin_compute_threads = true;
    // Jobs whose `finish` runs at once, at most; the engine waits for one to end beyond that.
    int max_finishing = 8;
  };

  JobQueue(Runner runner, Options options)
      : runner_(std::move(runner)), options_(std::move(options)) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~JobQueue() override { Shutdown(absl::ZeroDuration()); }
  JobQueue(const JobQueue&) = delete;
  JobQueue& operator=(const JobQueue&) = delete;

  // Queues a job. RESOURCE_EXHAUSTED when max_queue jobs wait, UNAVAILABLE when draining,
  // ALREADY_EXISTS when a job of the same non-zero request_id is queued, running or finishing.
  absl::StatusOr<std::shared_ptr<Ticket>> Submit(Job job) {
    MutexLock lock(&mu_);
    if (draining_ || stop_) {
      return absl::UnavailableError(
          absl::StrCat(options_.name, " worker is shutting down: no new requests"));
    }
    if (static_cast<int>(queue_.size()) >= options_.max_queue) {
      return absl::ResourceExhaustedError(
          absl::StrCat(options_.name, " queue full: ", queue_.size(),
                       " requests waiting (max_queue ", options_.max_queue, ")"));
    }
    if (job.request_id != 0 && FindLocked(job.request_id) != nullptr) {
      return absl::AlreadyExistsError(absl::StrCat(options_.name, " request ", job.request_id,
                                                   " is already queued or running"));
    }
    job.accepted = std::chrono::steady_clock::now();
    auto ticket = std::make_shared<Ticket>(std::move(job));
    queue_.push_back(ticket);
    MarkBacklog();
    cv_.SignalAll();
    return ticket;
  }

  // Cancels a queued (removed, ends CANCELLED at once), running or finishing job; false when
  // none has the id (ended, unknown, or 0).
  bool Cancel(uint64_t request_id) {
    if (request_id == 0) return false;
    MutexLock lock(&mu_);
    const std::shared_ptr<Ticket> t = FindLocked(request_id);
    return t != nullptr && CancelLocked(*t, /*queued_only=*/false);
  }
  bool Cancel(const Ticket& ticket) {
    MutexLock lock(&mu_);
    return CancelLocked(ticket, /*queued_only=*/false);
  }
  // Removes the job if it still waits (it ends CANCELLED); false once it has started.
  bool CancelIfQueued(const Ticket& ticket) {
    MutexLock lock(&mu_);
    return CancelLocked(ticket, /*queued_only=*/true);
  }

  // Stops accepting (Submit: UNAVAILABLE); queued and running jobs go on.
  void Drain() {
    MutexLock lock(&mu_);
    draining_ = true;
  }
  // Drain(), waits up to `grace` for every job to end (finishing ones too), cancels what
  // remains, and joins the engine thread and the finishing threads. Idempotent.
  void Shutdown(absl::Duration grace) {
    MutexLock shutdown(&shutdown_mu_);
    {
      MutexLock lock(&mu_);
      draining_ = true;
      const absl::Time until = absl::Now() + grace;
      while (!IdleLocked()) {
        if (cv_.WaitWithDeadline(&mu_, until)) break;
      }
      for (std::shared_ptr<Ticket>& t : queue_) {
        t->Complete(CancelledOutcome(
            t->job(), absl::StrCat(options_.name, " request ", t->job().request_id,
                                   " cancelled: the ", options_.name, " worker is shutting down")));
      }
      queue_.clear();
      MarkBacklog();
      if (running_ != nullptr) running_->cancel_.Cancel();
      for (const std::shared_ptr<Ticket>& t : finishing_) t->cancel_.Cancel();
      stop_ = true;
      cv_.SignalAll();
    }
    if (thread_.joinable()) thread_.join();
    // The engine thread is gone, so no finisher starts now: join them all (cancelled, they end
    // soon).
    std::list<Finisher> all;
    {
      MutexLock lock(&mu_);
      all.splice(all.end(), finishers_);
    }
    for (Finisher& f : all) f.thread.join();
  }

  // Drainable: Drain(), the jobs not ended (queued, running, finishing), Shutdown at once.
  void StartDraining() override { Drain(); }
  int InFlight() const override {
    MutexLock lock(&mu_);
    return static_cast<int>(queue_.size() + finishing_.size()) + (running_ != nullptr ? 1 : 0);
  }
  void CancelAll() override { Shutdown(absl::ZeroDuration()); }

  int queued() const {
    MutexLock lock(&mu_);
    return static_cast<int>(queue_.size());
  }
  int running() const {  // on the engine: 0 or 1
    MutexLock lock(&mu_);
    return running_ != nullptr ? 1 : 0;
  }
  int finishing() const {  // off the engine, waiting for their outcome
    MutexLock lock(&mu_);
    return static_cast<int>(finishing_.size());
  }
  bool draining() const {
    MutexLock lock(&mu_);
    return draining_;
  }

 private:
  struct Finisher {
    std::thread thread;
    bool ended = false;  // guarded by mu_: the thread is done with everything but returning
  };

  static Outcome CancelledOutcome(const Job& job, const std::string& why) {
    Outcome o;
    o.status = absl::CancelledError(why);
    o.queue_s = o.total_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - job.accepted).count();
    return o;
  }

  bool IdleLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queue_.empty() && running_ == nullptr && finishing_.empty();
  }

  std::shared_ptr<Ticket> FindLocked(uint64_t request_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const auto same = [&](const std::shared_ptr<Ticket>& t) {
      return t != nullptr && t->job().request_id == request_id;
    };
    if (same(running_)) return running_;
    if (auto it = std::find_if(finishing_.begin(), finishing_.end(), same);
        it != finishing_.end()) {
      return *it;
    }
    if (auto it = std::find_if(queue_.begin(), queue_.end(), same); it != queue_.end()) return *it;
    return nullptr;
  }

  // Tells the core share whether jobs wait behind the running one (or, with none running, more
  // than the one the loop takes next): a decode worker beside gives way to a queue of prompts
  // (core_share.h). Marks only changes, so that a process's other queues keep their own.
  void MarkBacklog() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const bool queued = queue_.size() > (running_ == nullptr ? 1u : 0u);
    if (queued == backlog_marked_) return;
    backlog_marked_ = queued;
    SetCoreShareBacklog(queued);
  }

  bool CancelLocked(const Ticket& ticket, bool queued_only) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (auto it = queue_.begin(); it != queue_.end(); ++it) {
      if (it->get() != &ticket) continue;
      std::shared_ptr<Ticket> t = std::move(*it);
      queue_.erase(it);
      MarkBacklog();
      t->Complete(
          CancelledOutcome(t->job(), absl::StrCat(options_.name, " request ", t->job().request_id,
                                                  " cancelled while queued")));
      cv_.SignalAll();
      return true;
    }
    if (queued_only) return false;
    if (running_.get() == &ticket) {
      running_->cancel_.Cancel();  // the runner stops at its next check
      return true;
    }
    for (const std::shared_ptr<Ticket>& t : finishing_) {
      if (t.get() != &ticket) continue;
      t->cancel_.Cancel();  // its finish aborts what it waits for
      return true;
    }
    return false;
  }

  // mu_ held (by the engine thread): the new thread takes mu_ only when it is done.
  void Finish(std::shared_ptr<Ticket> t, std::function<Outcome()> finish)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    finishing_.push_back(t);
    finishers_.emplace_back();
    const auto it = std::prev(finishers_.end());
    it->thread = std::thread([this, t = std::move(t), finish = std::move(finish), it] {
      t->Complete(finish());
      MutexLock lock(&mu_);
      finishing_.erase(std::find(finishing_.begin(), finishing_.end(), t));
      it->ended = true;
      cv_.SignalAll();
    });
  }

  void JoinEndedFinishers() {
    std::list<Finisher> ended;
    {
      MutexLock lock(&mu_);
      for (auto it = finishers_.begin(); it != finishers_.end();) {
        const auto next = std::next(it);
        if (it->ended) ended.splice(ended.end(), finishers_, it);
        it = next;
      }
    }
    for (Finisher& f : ended) f.thread.join();
  }

  void Loop() {
    if (options_.pin_compute_threads) PinComputeThreads();
    const size_t max_finishing = static_cast<size_t>(std::max(1, options_.max_finishing));
    while (true) {
      JoinEndedFinishers();
      std::shared_ptr<Ticket> t;
      {
        MutexLock lock(&mu_);
        while (!stop_ && (queue_.empty() || finishing_.size() >= max_finishing)) cv_.Wait(&mu_);
        if (queue_.empty()) return;  // stopping, nothing left
        t = std::move(queue_.front());
        queue_.pop_front();
        running_ = t;
        MarkBacklog();
      }
      RunResult r;
      {
        ComputeBusy busy;  // lends its CPUs when idle (core_share.h)
        r = runner_(t->job(), t->cancel_);
      }
      {
        MutexLock lock(&mu_);
        running_ = nullptr;
        MarkBacklog();
        cv_.SignalAll();
        if (r.finish) {
          Finish(std::move(t), std::move(r.finish));
          continue;
        }
      }
      t->Complete(std::move(r.outcome));
    }
  }

  const Runner runner_;
  const Options options_;
  mutable Mutex mu_;
  CondVar cv_;  // any change of the fields below
  std::deque<std::shared_ptr<Ticket>> queue_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Ticket> running_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<Ticket>> finishing_ ABSL_GUARDED_BY(mu_);
  std::list<Finisher> finishers_ ABSL_GUARDED_BY(mu_);  // joined outside mu_
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool backlog_marked_ ABSL_GUARDED_BY(mu_) = false;  // MarkBacklog's last word

  std::thread thread_;
  Mutex shutdown_mu_;  // one Shutdown at a time
};

}  // namespace tripod
