// Continuous batching, vLLM v1 style: every step, each running sequence contributes its pending
// tokens (one when decoding, a chunk of its prompt while prefilling) within a token budget, and
// waiting sequences are admitted (free-block watermark) with their prompts chunked into the same
// step. When the cache runs out mid-step the NEWEST running sequence is preempted: its blocks are
// freed and it goes back to the front of the waiting queue, to be recomputed later (prompt and
// generated tokens, at unchanged positions). Nothing is ever dropped; a sequence that cannot fit
// even alone is failed with a clear status.
//
// Imported sequences (KV from a prefill worker) are admitted by PagedKvCache::Import; their cache
// length (snapshot slots) and positions (n-1 for the last prompt token) differ. Their KV cannot be
// recomputed exactly when trimmed, so they are the last choice of victim; a preempted one keeps
// its snapshot and is re-imported from it, then recomputes its last prompt token and generated
// tokens, so preemption changes none of its tokens.
//
// Adopting sequences (KV a transfer wrote in place into a reservation, DecodeEngine::ReserveKv)
// are admitted on the reservation's own cache sequence, which already holds their KV and room for
// the last prompt token. They too are the last choice of victim; a preempted one has no snapshot
// to re-import, so it recomputes its prompt and generated tokens with the engine's plan (exact for
// untrimmed full-plan KV; trimmed or pruned-plan KV is replaced by full KV).
#pragma once

#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/kv/kv_snapshot.h"
#include "common/kv/paged_kv_cache.h"

namespace tripod {

// A sequence as the scheduler sees it (the engine owns it and appends sampled tokens).
struct SchedSeq {
  int64_t id = 0;
  std::vector<int32_t> tokens;  // prompt, then generated tokens
  int n_prompt = 0;
  const KvSnapshot* snapshot = nullptr;  // imported KV of prompt tokens 0..n-2, if any
  // A filled reservation (cache sequence holding reserved_slots slots of KV of tokens 0..n-2)
  // that admission adopts; -1 once adopted, or when there is none.
  int32_t reserved_kv = -1;
  int reserved_slots = 0;
  bool adopted = false;  // running on an adopted reservation's KV (until preempted)
  int cached_slots = 0;  // prefix-cache slots attached at the first admission
  // Prompt log-probabilities: no prefix-cache attach (cached positions have no logits), and
  // chunks of at most max_chunk tokens (0: the step's budget) to bound the logits held.
  bool bypass_prefix_cache = false;
  int max_chunk = 0;
  // While running (kv_seq >= 0):
  int32_t kv_seq = -1;
  int n_computed = 0;  // tokens[0, n_computed) have their K/V in the cache (position count)
  int kv_len = 0;      // cache slots filled; == n_computed unless imported
  int preemptions = 0;
  uint64_t plan_key = 0;  // its cache sequences' key (0: SchedulerConfig::plan_key)
  // Blocks its choices will take when it forks after its prompt (one each, the copy of its last
  // partly filled block): admission asks for them too. 0 once forked.
  int fork_blocks = 0;
};

struct ScheduledChunk {
  SchedSeq* seq = nullptr;
  int n_tokens = 0;           // tokens[n_computed, n_computed + n_tokens) run this step
  bool wants_logits = false;  // the chunk reaches the last token: sample the next one
};

struct StepSchedule {
  std::vector<ScheduledChunk> chunks;  // in batch row order
  std::vector<SchedSeq*> preempted;    // back at the front of the waiting queue
  std::vector<SchedSeq*> admitted;
  // Removed from the queues, blocks freed: they can never run (e.g. longer than the cache).
  std::vector<std::pair<SchedSeq*, absl::Status>> failed;
  int attached_slots = 0;  // prefix-cache slots attached at admission
  // Tokens looked up in the prefix cache at admission (a sequence's whole token list, as vLLM
  // counts its prefix-cache queries): attached_slots / queried_tokens is the hit rate.
  int queried_tokens = 0;
  int n_tokens = 0;
};

struct SchedulerConfig {
  int max_tokens_per_step = 256;
  int max_running = 128;
  uint64_t plan_key = 0;  // ForwardPlan::KvKey() of the plan the engine runs
};

struct SchedulerQueues {
  std::deque<SchedSeq*> waiting;   // FIFO; preempted sequences re-enter at the front
  std::vector<SchedSeq*> running;  // admission order: the back is the newest
};

// Picks this step's work and makes room for it in the cache (EnsureCapacity for every chunk).
StepSchedule ScheduleStep(const SchedulerConfig& config, SchedulerQueues& queues,
                          PagedKvCache& cache);

// After the forward wrote the chunks' K/V: records them in the cache (Append, which publishes
// full blocks to the prefix cache) and advances n_computed / kv_len.
void CommitStep(const StepSchedule& schedule, PagedKvCache& cache);

// Takes a sequence out of the queues and frees its blocks (finished, cancelled, failed), an
// unadopted reservation's included.
void ReleaseSequence(SchedSeq* seq, SchedulerQueues& queues, PagedKvCache& cache);

}  // namespace tripod
