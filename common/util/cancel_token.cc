// CancelToken; see cancel_token.h.
#include "common/util/cancel_token.h"

#include <utility>

namespace tripod {

void CancelToken::Cancel() {
  // The callback runs under the lock, so that OnCancel(nullptr) waits for it to end.
  MutexLock lock(&mu_);
  if (flag_.exchange(true, std::memory_order_relaxed)) return;
  if (on_cancel_) on_cancel_();
}

void CancelToken::OnCancel(std::function<void()> fn) {
  MutexLock lock(&mu_);
  on_cancel_ = std::move(fn);
  if (on_cancel_ && flag_.load(std::memory_order_relaxed)) on_cancel_();
}

}  // namespace tripod
