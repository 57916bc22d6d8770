// ReleaseLater; see deferred_release.h.
#include "common/rpc/deferred_release.h"

#include <deque>
#include <thread>
#include <utility>

#include "absl/time/clock.h"
#include "common/util/mutex.h"

namespace tripod {
namespace {

struct Releaser {
  Mutex mu;
  CondVar cv;  // work queued, or a batch dropped
  std::deque<std::shared_ptr<void>> queue ABSL_GUARDED_BY(mu);
  uint64_t queued ABSL_GUARDED_BY(mu) = 0;
  uint64_t released ABSL_GUARDED_BY(mu) = 0;

  void Loop() {
    while (true) {
      std::deque<std::shared_ptr<void>> batch;
      {
        MutexLock l(&mu);
        while (queue.empty()) cv.Wait(&mu);
        batch.swap(queue);
      }
      const size_t n = batch.size();
      batch.clear();  // the destructors run here, on no gRPC thread
      MutexLock l(&mu);
      released += n;
      cv.SignalAll();
    }
  }
};

// Made on first use and never destroyed: the thread runs until the process ends (a static's
// destructor at exit would race with a release in progress).
Releaser& TheReleaser() {
  static Releaser* r = [] {
    auto* made = new Releaser;
    std::thread([made] { made->Loop(); }).detach();
    return made;
  }();
  return *r;
}

}  // namespace

void ReleaseLater(std::shared_ptr<void> what) {
  if (what == nullptr) return;
  Releaser& r = TheReleaser();
  MutexLock l(&r.mu);
  r.queue.push_back(std::move(what));
  ++r.queued;
  r.cv.SignalAll();
}

bool FlushReleases(std::chrono::milliseconds timeout) {
  Releaser& r = TheReleaser();
  MutexLock l(&r.mu);
  const uint64_t target = r.queued;
  const absl::Time until = absl::Now() + absl::FromChrono(timeout);
  while (r.released < target && absl::Now() < until) r.cv.WaitWithDeadline(&r.mu, until);
  return r.released >= target;
}

}  // namespace tripod
