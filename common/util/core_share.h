// CoreShare: the CPUs of one machine lent between the workers that `tripod serve` starts on it.
//
// Why: serve splits the cores among the prefill and decode workers so that one never stalls the
// other's parallel regions (a team whose member is preempted waits at every barrier). But a split
// leaves half the machine idle whenever only one side has work: a lone long prompt prefills on
// half the cores, and the last requests of a burst decode on half. With a share, each worker has
// its own CPUs (its "home") and, at every parallel region, also uses the CPUs of the workers after
// it in its order that are idle at that moment. A worker marks itself busy while it computes
// (ComputeBusy), so a neighbour that starts work takes its CPUs back within one region of the
// borrower's (milliseconds), not one job.
//
// The shared state is a small file that serve writes before it starts the workers (one slot per
// worker: its CPUs and a busy flag), mapped MAP_SHARED by each; the flags are lock-free atomics.
// Nothing here is needed off a shared machine: a worker that joins no share computes on its
// --threads as before.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace tripod {

inline constexpr int kCoreShareMaxSlots = 64;
inline constexpr int kCoreShareMaxCpusPerSlot = 256;

// Writes a share file for slots[i] = the CPUs of worker i (each non-empty, none in two slots),
// every slot idle. The file is replaced if it exists.
absl::Status CreateCoreShare(const std::string& path, const std::vector<std::vector<int>>& slots);

// Processes one slot may hold at most (the bits of its busy word; JoinCoreShare's `member`).
inline constexpr int kCoreShareMaxMembers = 31;

// Joins the share at `path` as `slot`, for the rest of the process. From then on the compute
// threads (thread_pool.h) are the slot's CPUs plus those lent by idle neighbours, and the CPU
// order (CoreShareCpuOrder) places the team's threads. Call once, at start-up, before any compute.
// Processes may share a slot as different members (0 to kCoreShareMaxMembers - 1): the slot is
// busy while any of them computes, each marking its own bit. tripod serve puts a draft worker in
// its prefill worker's slot: the two run one after the other for a request, and the draft, alone,
// borrows the idle neighbours' CPUs as the prefill does.
absl::Status JoinCoreShare(const std::string& path, int slot, int member = 0);

// Whether this process joined a share.
bool InCoreShare();

// This process's CPUs in the order a team's threads take them: its slot's, then each following
// slot's (wrapping round). Empty outside a share.
std::vector<int> CoreShareCpuOrder();

// The slot's own CPUs. Empty outside a share.
std::vector<int> CoreShareHomeCpus();

// How many threads a parallel region may use now: the slot's CPUs, plus those of the slots after
// it while they are idle, up to the first busy one (so that borrowed threads, placed in
// CoreShareCpuOrder, land only on idle CPUs). 0 outside a share. Lock-free; called per region.
int CoreShareThreads();

// Marks this process busy for its lifetime (nestable across threads: busy while any lives).
class ComputeBusy {
 public:
  ComputeBusy();
  ~ComputeBusy();
  ComputeBusy(const ComputeBusy&) = delete;
  ComputeBusy& operator=(const ComputeBusy&) = delete;
};

// The same without a scope, for a loop that goes idle and busy again (the decode loop): the
// process is busy while the count of SetComputeBusy(true) exceeds that of (false). No-ops
// outside a share.
void SetComputeBusy(bool busy);

// Says whether this process has work queued behind what it runs now (a prefill or draft worker's
// waiting prompts): it has while the count of SetCoreShareBacklog(true) exceeds that of (false),
// so that each queue of a process marks its own. A decode worker reads it to give way: while a
// neighbour's prompts queue, its CPUs do more for the burst in the neighbour's prefill than in
// small decode steps (DecodeEngineOptions::yield_to_prefill_ms). No-op outside a share.
void SetCoreShareBacklog(bool queued);

// Whether any other slot of the share has a member with work queued. False outside a share.
// Lock-free.
bool CoreShareOthersBacklogged();

}  // namespace tripod
