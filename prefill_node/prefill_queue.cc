// PrefillQueue; see prefill_queue.h.
#include "prefill_node/prefill_queue.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/util/thread_pool.h"

namespace tripod {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

PrefillOutcome CancelledOutcome(const PrefillJob& job, const std::string& why) {
  PrefillOutcome o;
  o.status = absl::CancelledError(absl::StrCat("prefill request ", job.request_id, " ", why));
  o.queue_s = o.total_s = SecondsSince(job.accepted);
  return o;
}

}  // namespace

bool PrefillTicket::WaitUntil(absl::Time deadline) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_until(lock, absl::ToChronoTime(deadline), [this] { return done_; });
}

bool PrefillTicket::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

PrefillOutcome PrefillTicket::outcome() const {
  std::lock_guard<std::mutex> lock(mu_);
  return outcome_;
}

void PrefillTicket::Complete(PrefillOutcome outcome) {
  std::lock_guard<std::mutex> lock(mu_);
  outcome_ = std::move(outcome);
  done_ = true;
  cv_.notify_all();
}

PrefillQueue::PrefillQueue(Runner runner, Options options)
    : runner_(std::move(runner)), options_(options) {
  thread_ = std::thread([this] { Loop(); });
}

PrefillQueue::~PrefillQueue() { Shutdown(absl::ZeroDuration()); }

absl::StatusOr<std::shared_ptr<PrefillTicket>> PrefillQueue::Submit(PrefillJob job) {
  std::lock_guard<std::mutex> lock(mu_);
  if (draining_ || stop_) {
    return absl::UnavailableError("prefill worker is shutting down: no new requests");
  }
  if (static_cast<int>(queue_.size()) >= options_.max_queue) {
    return absl::ResourceExhaustedError(absl::StrCat("prefill queue full: ", queue_.size(),
                                                     " requests waiting (max_queue ",
                                                     options_.max_queue, ")"));
  }
  if (job.request_id != 0) {
    const auto same = [&](const std::shared_ptr<PrefillTicket>& t) {
      return t != nullptr && t->job().request_id == job.request_id;
    };
    if (same(running_) || std::any_of(queue_.begin(), queue_.end(), same) ||
        std::any_of(finishing_.begin(), finishing_.end(), same)) {
      return absl::AlreadyExistsError(
          absl::StrCat("prefill request ", job.request_id, " is already queued or running"));
    }
  }
  job.accepted = std::chrono::steady_clock::now();
  auto ticket = std::make_shared<PrefillTicket>(std::move(job));
  queue_.push_back(ticket);
  cv_.notify_all();
  return ticket;
}

bool PrefillQueue::CancelLocked(const PrefillTicket& ticket) {
  if (running_.get() == &ticket) {
    running_->cancel_.Cancel();  // the runner stops between layers; its stream is aborted
    return true;
  }
  for (const std::shared_ptr<PrefillTicket>& t : finishing_) {
    if (t.get() != &ticket) continue;
    t->cancel_.Cancel();  // its finish aborts what it waits for
    return true;
  }
  for (auto it = queue_.begin(); it != queue_.end(); ++it) {
    if (it->get() != &ticket) continue;
    std::shared_ptr<PrefillTicket> t = std::move(*it);
    queue_.erase(it);
    t->Complete(CancelledOutcome(t->job(), "cancelled while queued"));
    cv_.notify_all();
    return true;
  }
  return false;
}

bool PrefillQueue::Cancel(uint64_t request_id) {
  if (request_id == 0) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (running_ != nullptr && running_->job().request_id == request_id) {
    return CancelLocked(*running_);
  }
  for (const std::shared_ptr<PrefillTicket>& t : finishing_) {
    if (t->job().request_id == request_id) return CancelLocked(*t);
  }
  for (const std::shared_ptr<PrefillTicket>& t : queue_) {
    if (t->job().request_id == request_id) return CancelLocked(*t);
  }
  return false;
}

bool PrefillQueue::Cancel(const PrefillTicket& ticket) {
  std::lock_guard<std::mutex> lock(mu_);
  return CancelLocked(ticket);
}

void PrefillQueue::Drain() {
  std::lock_guard<std::mutex> lock(mu_);
  draining_ = true;
}

void PrefillQueue::Shutdown(absl::Duration grace) {
  std::lock_guard<std::mutex> shutdown(shutdown_mu_);
  {
    std::unique_lock<std::mutex> lock(mu_);
    draining_ = true;
    cv_.wait_for(lock, absl::ToChronoNanoseconds(grace),
                 [this] { return queue_.empty() && running_ == nullptr && finishing_.empty(); });
    for (std::shared_ptr<PrefillTicket>& t : queue_) {
      t->Complete(CancelledOutcome(t->job(), "cancelled: the prefill worker is shutting down"));
    }
    queue_.clear();
    if (running_ != nullptr) running_->cancel_.Cancel();
    for (const std::shared_ptr<PrefillTicket>& t : finishing_) t->cancel_.Cancel();
    stop_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
  // The engine thread is gone, so no finisher starts now: join them all (cancelled, they end
  // soon).
  std::list<Finisher> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    all.splice(all.end(), finishers_);
  }
  for (Finisher& f : all) f.thread.join();
}

void PrefillQueue::Finish(std::shared_ptr<PrefillTicket> t,
                          std::function<PrefillOutcome()> finish) {
  // mu_ held (by the engine thread): the new thread takes mu_ only when it is done.
  finishing_.push_back(t);
  finishers_.emplace_back();
  const auto it = std::prev(finishers_.end());
  it->thread = std::thread([this, t = std::move(t), finish = std::move(finish), it] {
    t->Complete(finish());
    std::lock_guard<std::mutex> lock(mu_);
    finishing_.erase(std::find(finishing_.begin(), finishing_.end(), t));
    it->ended = true;
    cv_.notify_all();
  });
}

void PrefillQueue::JoinEndedFinishers() {
  std::list<Finisher> ended;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = finishers_.begin(); it != finishers_.end();) {
      const auto next = std::next(it);
      if (it->ended) ended.splice(ended.end(), finishers_, it);
      it = next;
    }
  }
  for (Finisher& f : ended) f.thread.join();
}

void PrefillQueue::Loop() {
  if (options_.pin_compute_threads) SetComputeThreads(ComputeThreads());
  const size_t max_finishing = static_cast<size_t>(std::max(1, options_.max_finishing));
  while (true) {
    JoinEndedFinishers();
    std::shared_ptr<PrefillTicket> t;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock,
               [&] { return stop_ || (!queue_.empty() && finishing_.size() < max_finishing); });
      if (queue_.empty()) return;  // stopping, nothing left
      t = std::move(queue_.front());
      queue_.pop_front();
      running_ = t;
    }
    RunnerResult r = runner_(t->job(), t->cancel_);
    std::unique_lock<std::mutex> lock(mu_);
    running_ = nullptr;
    cv_.notify_all();
    if (r.finish) {
      Finish(std::move(t), std::move(r.finish));
      continue;
    }
    lock.unlock();
    t->Complete(std::move(r.outcome));
  }
}

int PrefillQueue::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(queue_.size());
}

int PrefillQueue::running() const {
  std::lock_guard<std::mutex> lock(mu_);
  return running_ != nullptr ? 1 : 0;
}

int PrefillQueue::finishing() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(finishing_.size());
}

bool PrefillQueue::draining() const {
  std::lock_guard<std::mutex> lock(mu_);
  return draining_;
}

}  // namespace tripod
