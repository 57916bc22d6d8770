// PrefillQueue: the prefill worker's requests, run one at a time, first in first out, on the
// queue's own engine thread (never on a gRPC handler thread), with a bounded number waiting.
// Cancel(request_id) removes a queued request, or cancels a running one (its cancel token: the
// forward stops at the next layer boundary, its KV stream is aborted). Shutdown stops accepting,
// lets what is queued and running finish within a grace period, then cancels the rest.
//
// The queue knows nothing of engines or the network: a Runner does the work of one job (the
// prefill worker's runs the engine and streams the KV, prefill_job.h). Everything here is
// thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/compute/plan.h"
#include "prefill_node/cancel_token.h"
#include "prefill_node/kv_trimming.h"

namespace tripod {

struct PrefillJob {
  uint64_t request_id = 0;  // 0: anonymous (not cancellable by id)
  std::vector<int32_t> prompt;
  ForwardPlan plan;
  TrimPolicy trim;  // kNone: all of the KV, streamed layer by layer
  std::string decode_address;
  uint64_t transfer_id = 0;
  // The caller's deadline (bounds the KV stream); max(): none.
  std::chrono::system_clock::time_point deadline = std::chrono::system_clock::time_point::max();
  std::chrono::steady_clock::time_point accepted;  // set by Submit
};

struct PrefillOutcome {
  absl::Status status;
  int prefilled_tokens = 0;
  uint64_t plan_key = 0;
  uint64_t bytes_sent = 0;  // payload bytes
  uint32_t chunks_sent = 0;
  // This process's clock (see PrefillResponse).
  double queue_s = 0, compute_s = 0, transfer_s = 0, tail_s = 0, total_s = 0;
};

// What a Runner hands back: the job's outcome, or, when the engine's part is done but the outcome
// waits on something else (the decode side's acknowledgement of the KV), `finish`, which the queue
// runs on a thread of its own to get the outcome while the engine takes the next job.
struct RunnerResult {
  RunnerResult(PrefillOutcome o = {}) : outcome(std::move(o)) {}  // NOLINT: implicit on purpose
  PrefillOutcome outcome;
  std::function<PrefillOutcome()> finish;
};

// One submitted job: wait on it from the submitting thread.
class PrefillTicket {
 public:
  explicit PrefillTicket(PrefillJob job) : job_(std::move(job)) {}
  PrefillTicket(const PrefillTicket&) = delete;
  PrefillTicket& operator=(const PrefillTicket&) = delete;

  const PrefillJob& job() const { return job_; }
  // True once the job has ended (at once if it had), false when `deadline` came first.
  bool WaitUntil(absl::Time deadline) const;
  bool done() const;
  PrefillOutcome outcome() const;  // valid once done()

 private:
  friend class PrefillQueue;
  void Complete(PrefillOutcome outcome);

  const PrefillJob job_;
  CancelToken cancel_;
  mutable std::mutex mu_;  // std::mutex for TSan: see cancel_token.h
  mutable std::condition_variable cv_;
  bool done_ = false;       // guarded by mu_
  PrefillOutcome outcome_;  // guarded by mu_
};

class PrefillQueue {
 public:
  // Does one job's engine work on the engine thread; returns when it has ended (soon after
  // `cancel` is set), with the outcome (to the ticket as it is: queue_s and total_s count from
  // job.accepted) or a `finish` to wait for it off the engine thread (`cancel` still applies).
  using Runner = std::function<RunnerResult(const PrefillJob& job, CancelToken& cancel)>;

  struct Options {
    int max_queue = 64;  // jobs waiting (not counting the running one); more: RESOURCE_EXHAUSTED
    // The engine thread calls SetComputeThreads(ComputeThreads()) first: its own OpenMP team,
    // pinned (thread_pool.h).
    bool pin_compute_threads = true;
    // Jobs whose `finish` runs at once, at most; the engine waits for one to end beyond that.
    int max_finishing = 8;
  };

  PrefillQueue(Runner runner, Options options);
  ~PrefillQueue();  // Shutdown(absl::ZeroDuration()) unless done already
  PrefillQueue(const PrefillQueue&) = delete;
  PrefillQueue& operator=(const PrefillQueue&) = delete;

  // Queues a job. RESOURCE_EXHAUSTED when max_queue jobs wait, UNAVAILABLE when draining,
  // ALREADY_EXISTS when a job of the same non-zero request_id is queued or running.
  absl::StatusOr<std::shared_ptr<PrefillTicket>> Submit(PrefillJob job);
  // Cancels a queued (removed, ends CANCELLED at once) or running job; false when none has the
  // id (finished, unknown, or 0).
  bool Cancel(uint64_t request_id);
  bool Cancel(const PrefillTicket& ticket);

  // Stops accepting (Submit: UNAVAILABLE); queued and running jobs go on.
  void Drain();
  // Drain(), waits up to `grace` for every job to end (finishing ones too), cancels what
  // remains, and joins the engine thread and the finishing threads. Idempotent.
  void Shutdown(absl::Duration grace);

  int queued() const;
  int running() const;    // on the engine: 0 or 1
  int finishing() const;  // off the engine, waiting for their outcome
  bool draining() const;

 private:
  void Loop();
  bool CancelLocked(const PrefillTicket& ticket);  // mu_ held
  void Finish(std::shared_ptr<PrefillTicket> t, std::function<PrefillOutcome()> finish);
  void JoinEndedFinishers();  // mu_ not held

  const Runner runner_;
  const Options options_;
  mutable std::mutex mu_;       // std::mutex for TSan: see cancel_token.h
  std::condition_variable cv_;  // any change of the fields below
  // Guarded by mu_:
  std::deque<std::shared_ptr<PrefillTicket>> queue_;
  std::shared_ptr<PrefillTicket> running_;
  std::vector<std::shared_ptr<PrefillTicket>> finishing_;
  struct Finisher {
    std::thread thread;
    bool ended = false;  // guarded by mu_: the thread is done with everything but returning
  };
  std::list<Finisher> finishers_;  // touched under mu_; joined outside it
  bool draining_ = false;
  bool stop_ = false;

  std::thread thread_;
  std::mutex shutdown_mu_;  // one Shutdown at a time
};

}  // namespace tripod
