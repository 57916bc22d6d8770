// Least-load routing over the healthy workers. A worker's load is the larger of what it last
// reported (running + queued, and its open reservations on a decode worker) and what this
// scheduler has routed to it since (Worker::inflight): the report is seconds old, our own count
// is current but blind to other schedulers. Ties go to the decode worker with more free KV
// blocks, then to the first in the list (rotated per call so that equal workers share the load).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "scheduler/worker_registry.h"

namespace tripod::scheduler {

int WorkerLoad(const Worker& worker);

// The decode worker for a prompt of `prompt_tokens` (+ up to `max_tokens` generated): among
// those whose free KV blocks can hold the prompt, the least loaded; when none can, the one with
// the most free blocks (its engine queues the request until blocks free up), skipping `exclude`
// (a worker that just failed this request). nullptr: no worker.
std::shared_ptr<Worker> PickDecode(const std::vector<std::shared_ptr<Worker>>& workers,
                                   int prompt_tokens, uint64_t rotation,
                                   const Worker* exclude = nullptr);

// The least loaded prefill worker that can run `pop_ratio` (empty: its own plan), skipping
// `exclude` (a worker that just failed this request).
std::shared_ptr<Worker> PickPrefill(const std::vector<std::shared_ptr<Worker>>& workers,
                                    const Worker* exclude, const std::string& pop_ratio,
                                    uint64_t rotation);

// The least loaded draft worker; nullptr: none.
std::shared_ptr<Worker> PickDraft(const std::vector<std::shared_ptr<Worker>>& workers,
                                  uint64_t rotation);

// Whether a prefill worker that reported `health` runs the POP plan of `pop_ratio` ("1/3",
// "0.25"; empty: its own plan, always): one that loaded the full weights runs any; a pruned one
// only the plan whose skipped layers (the last floor(L * ratio), as PopConfig makes them) are
// its own. An unparsable ratio: false.
bool CanRunPlan(const v1::HealthResponse& health, const std::string& pop_ratio);

}  // namespace tripod::scheduler
