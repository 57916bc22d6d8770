// Mutex, MutexLock, CondVar and Notification with absl's names and thread-safety annotations, on
// std::mutex and std::condition_variable. Why not absl::Mutex itself: Debian's Abseil is built
// without ThreadSanitizer annotations, so TSan cannot see absl::Mutex's acquire and release and
// reports every access it guards as a race; the C++ library's primitives go through pthreads, which
// TSan intercepts. The concurrent parts (engines' queues, the services, transfers, metrics) use
// these, so that the tsan preset checks them for real.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tripod {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { m_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { m_.unlock(); }

 private:
  friend class CondVar;
  std::mutex m_;
};

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* mu_;
};

class CondVar {
 public:
  // The caller holds *mu; it is released while waiting and held again on return.
  void Wait(Mutex* mu) {
    std::unique_lock<std::mutex> lock(mu->m_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  // True when the wait timed out (absl's convention).
  bool WaitWithTimeout(Mutex* mu, absl::Duration timeout) {
    // Beyond a day, as never: a steady_clock deadline that far out can overflow.
    if (timeout > absl::Hours(24)) {
      Wait(mu);
      return false;
    }
    std::unique_lock<std::mutex> lock(mu->m_, std::adopt_lock);
    const bool timed_out =
        cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout)) == std::cv_status::timeout;
    lock.release();
    return timed_out;
  }
  bool WaitWithDeadline(Mutex* mu, absl::Time deadline) {
    return WaitWithTimeout(mu, std::max(deadline - absl::Now(), absl::ZeroDuration()));
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

// A one-shot event: Notify once, WaitForNotification until it has been (absl's names).
class Notification {
 public:
  void Notify() {
    MutexLock lock(&mu_);
    notified_ = true;
    cv_.SignalAll();
  }
  void WaitForNotification() {
    MutexLock lock(&mu_);
    while (!notified_) cv_.Wait(&mu_);
  }

 private:
  Mutex mu_;
  CondVar cv_;
  bool notified_ = false;
};

}  // namespace tripod
