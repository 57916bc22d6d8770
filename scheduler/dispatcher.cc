#include "scheduler/dispatcher.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "scheduler/request_call.h"
#include "scheduler/request_status.h"

namespace tripod::scheduler {
namespace {

// Request ids travel to the workers, which cancel by them: random high bits keep two schedulers
// (or a restarted one) from naming the same request.
uint64_t NextRequestId() {
  static const uint64_t base = [] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ (static_cast<uint64_t>(rd()) << 8);
  }();
  static std::atomic<uint64_t> counter{1};
  return base + counter.fetch_add(1, std::memory_order_relaxed);
}

absl::Status ShuttingDown() {
  return WithErrorCode(absl::UnavailableError("the scheduler is shutting down"), "shutting_down");
}

}  // namespace

void RequestHandle::Cancel() { call_->Cancel(); }

Dispatcher::Dispatcher(WorkerRegistry& registry, SchedulerMetrics* metrics,
                       DispatcherOptions options)
    : registry_(registry), metrics_(metrics), options_(std::move(options)) {}

Dispatcher::~Dispatcher() { Shutdown(std::chrono::milliseconds(5000)); }

std::shared_ptr<RequestHandle> Dispatcher::Submit(PreparedRequest request,
                                                  RequestCallbacks callbacks, absl::Status* error) {
  auto refuse = [&](absl::Status e) -> std::shared_ptr<RequestHandle> {
    if (metrics_ != nullptr) metrics_->Rejected(HttpStatusOf(e));
    *error = std::move(e);
    return nullptr;
  };
  if (registry_.Healthy(v1::ROLE_DECODE).empty()) {
    return refuse(WithErrorCode(
        absl::UnavailableError("no decode worker is available; try again later"), "no_workers"));
  }
  auto call =
      std::make_shared<Call>(this, std::move(request), std::move(callbacks), NextRequestId());
  bool start = false;
  {
    MutexLock l(&mu_);
    if (shutting_down_ || draining_) {
      return refuse(ShuttingDown());
    }
    if (running_ < options_.max_inflight) {
      ++running_;
      live_[call.get()] = call;
      start = true;
    } else if (static_cast<int>(queue_.size()) < options_.max_queue) {
      queue_.push_back(call);
    } else {
      return refuse(
          WithErrorCode(absl::ResourceExhaustedError(absl::StrCat(
                            "the server is busy: ", running_, " requests running and ",
                            queue_.size(), " waiting; retry after ", options_.retry_after_s, " s")),
                        "server_busy"));
    }
  }
  if (start) call->Begin();
  return std::make_shared<RequestHandle>(call);
}

void Dispatcher::CallDone(Call* call) {
  std::shared_ptr<Call> next;
  {
    MutexLock l(&mu_);
    if (live_.erase(call) == 0) return;  // a queued call that ended before it ran
    --running_;
    if (!queue_.empty() && !shutting_down_) {
      next = std::move(queue_.front());
      queue_.pop_front();
      ++running_;
      live_[next.get()] = next;
    }
    idle_cv_.SignalAll();
  }
  if (next != nullptr) next->Begin();
}

void Dispatcher::CancelQueued(Call* call) {
  std::shared_ptr<Call> found;
  {
    MutexLock l(&mu_);
    for (auto it = queue_.begin(); it != queue_.end(); ++it) {
      if (it->get() == call) {
        found = std::move(*it);
        queue_.erase(it);
        break;
      }
    }
  }
  // Not found: the dispatcher admitted it meanwhile; Begin sees the cancellation.
  // The client left: reported to no one.
  if (found != nullptr) found->FailQueued(absl::CancelledError("the client left"));
}

void Dispatcher::StartDraining() {
  MutexLock l(&mu_);
  draining_ = true;
}

bool Dispatcher::draining() const {
  MutexLock l(&mu_);
  return draining_ || shutting_down_;
}

bool Dispatcher::WaitIdle(std::chrono::milliseconds timeout) {
  MutexLock l(&mu_);
  const absl::Time until = absl::Now() + absl::FromChrono(timeout);
  while ((running_ > 0 || !queue_.empty()) && absl::Now() < until) {
    idle_cv_.WaitWithDeadline(&mu_, until);
  }
  return running_ == 0 && queue_.empty();
}

int Dispatcher::running() const {
  MutexLock l(&mu_);
  return running_;
}

int Dispatcher::waiting() const {
  MutexLock l(&mu_);
  return static_cast<int>(queue_.size());
}

void Dispatcher::Shutdown(std::chrono::milliseconds wait) {
  std::deque<std::shared_ptr<Call>> queued;
  std::vector<std::shared_ptr<Call>> running;
  {
    MutexLock l(&mu_);
    if (shutting_down_ && running_ == 0 && queue_.empty()) return;
    shutting_down_ = true;
    queued.swap(queue_);
    for (auto& [ptr, weak] : live_) {
      if (std::shared_ptr<Call> c = weak.lock()) running.push_back(std::move(c));
    }
  }
  const absl::Status stopping = ShuttingDown();
  for (auto& c : queued) c->FailQueued(stopping);
  for (auto& c : running) c->Cancel();
  running.clear();
  MutexLock l(&mu_);
  const absl::Time until = absl::Now() + absl::FromChrono(wait);
  while (running_ > 0 && absl::Now() < until) idle_cv_.WaitWithDeadline(&mu_, until);
}

}  // namespace tripod::scheduler
