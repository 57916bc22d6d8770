// PrefillQueue: the prefill worker's requests, run one at a time, first in first out, on the
// queue's own engine thread, with a bounded number waiting: the shared JobQueue
// (common/rpc/job_queue.h) over a prefill job. Cancelling a running job stops its forward at the
// next layer boundary and aborts its KV stream; a Runner (prefill_job.h) runs the engine
// and streams the KV, and hands the wait for the decode side's acknowledgement to `finish`.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/compute/plan.h"
#include "common/rpc/job_queue.h"
#include "common/util/cancel_token.h"
#include "prefill_node/kv_trimming.h"

namespace tripod {

struct PrefillJob {
  uint64_t request_id = 0;  // 0: anonymous (not cancellable by id)
  std::vector<int32_t> prompt;
  ForwardPlan plan;
  TrimPolicy trim;  // kNone: all of the KV, streamed layer by layer
  std::string decode_address;
  std::string decode_tls_name;  // its certificate's name to check (empty: the address)
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

using RunnerResult = JobRunResult<PrefillOutcome>;
using PrefillTicket = JobTicket<PrefillJob, PrefillOutcome>;
// Options::name "prefill" names it in refusals and cancels.
using PrefillQueue = JobQueue<PrefillJob, PrefillOutcome>;

}  // namespace tripod
