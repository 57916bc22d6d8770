// CancelToken: how a request in progress is cancelled from another thread. The compute side polls
// the flag between layers (cheap: one relaxed load); what blocks elsewhere (a KV stream waiting on
// the network) registers a callback that Cancel() runs, so that it wakes at once.
//
// The annotated Mutex of common/util/mutex.h (std::mutex underneath, whose pthread calls TSan
// intercepts; Debian's absl::Mutex is invisible to it).
#pragma once

#include <atomic>
#include <functional>
#include <mutex>

#include "common/util/mutex.h"

namespace tripod {

class CancelToken {
 public:
  CancelToken() = default;
  CancelToken(const CancelToken&) = delete;
  CancelToken& operator=(const CancelToken&) = delete;

  // Sets the flag and runs the registered callback (once). Thread-safe; idempotent.
  void Cancel();
  bool cancelled() const { return flag_.load(std::memory_order_relaxed); }
  const std::atomic<bool>& flag() const { return flag_; }

  // Registers fn to run on Cancel (at once when already cancelled); an empty fn unregisters.
  // Once OnCancel(nullptr) returns, the old callback is not running and never will: whatever it
  // refers to may go.
  void OnCancel(std::function<void()> fn);

 private:
  std::atomic<bool> flag_{false};
  Mutex mu_;
  std::function<void()> on_cancel_;  // guarded by mu_
};

// Registers a callback for the scope: OnCancel(fn) now, OnCancel(nullptr) at the end.
class ScopedOnCancel {
 public:
  ScopedOnCancel(CancelToken& token, std::function<void()> fn) : token_(token) {
    token_.OnCancel(std::move(fn));
  }
  ~ScopedOnCancel() { token_.OnCancel(nullptr); }
  ScopedOnCancel(const ScopedOnCancel&) = delete;
  ScopedOnCancel& operator=(const ScopedOnCancel&) = delete;

 private:
  CancelToken& token_;
};

}  // namespace tripod
