// ScheduleStep and friends; see batch_scheduler.h.
#include "decode_node/batch_scheduler.h"

#include <algorithm>
#include <span>

#include "absl/strings/str_cat.h"

namespace tripod {
namespace {

void Preempt(SchedSeq* s, SchedulerQueues& q, PagedKvCache& cache, StepSchedule& out) {
  cache.FreeSequence(s->kv_seq);
  s->kv_seq = -1;
  s->n_computed = 0;
  s->kv_len = 0;
  s->adopted = false;  // no snapshot to re-import: it recomputes from its tokens
  ++s->preemptions;
  q.running.erase(std::find(q.running.begin(), q.running.end(), s));
  q.waiting.push_front(s);
  out.preempted.push_back(s);
}

// The newest running sequence whose KV is its own (not imported, not adopted), else the newest.
size_t PickVictim(const std::vector<SchedSeq*>& running) {
  for (size_t j = running.size(); j-- > 0;) {
    if (running[j]->snapshot == nullptr && !running[j]->adopted) return j;
  }
  return running.size() - 1;
}

int ChunkBudget(const SchedSeq& s, int budget) {
  return s.max_chunk > 0 ? std::min(budget, s.max_chunk) : budget;
}

// Whether `slots` could never be held, even with every block free: only then is waiting futile.
// (Nothing running is not enough: KV reservations for transfers in flight hold blocks too, and
// give them back when the transfer is adopted, released or its lease ends.)
bool NeverFits(int slots, const PagedKvCache& cache) {
  return cache.BlocksFor(slots) > cache.num_blocks() - cache.watermark_blocks();
}

absl::Status TooBig(const SchedSeq& s, int slots, const PagedKvCache& cache) {
  return absl::ResourceExhaustedError(
      absl::StrCat("request ", s.id, " needs ", cache.BlocksFor(slots), " KV blocks of ",
                   cache.block_tokens(), " tokens; the cache has ", cache.num_blocks(),
                   " (watermark ", cache.watermark_blocks(), "): raise the KV budget"));
}

// Admits the sequence at the front of the waiting queue with a chunk of at most `budget` tokens.
// Returns the chunk size, 0 when it does not fit now (it stays waiting), or -1 when it failed.
// An adopting sequence: its reservation already holds its KV and the last prompt token's room
// (the watermark was honoured when it was reserved), so it only runs that token.
int AdmitReserved(SchedSeq* s, SchedulerQueues& q, PagedKvCache& cache, StepSchedule& out) {
  const int32_t kv = s->reserved_kv;
  s->reserved_kv = -1;
  s->n_computed = s->n_prompt - 1;
  const int n = static_cast<int>(s->tokens.size()) - s->n_computed;
  const int held = cache.length(kv);
  if (held != s->reserved_slots || !cache.EnsureCapacity(kv, s->reserved_slots + n)) {
    cache.FreeSequence(kv);
    s->n_computed = 0;
    q.waiting.pop_front();
    out.failed.emplace_back(
        s, absl::InternalError(absl::StrCat("request ", s->id, ": its KV reservation holds ", held,
                                            " slots, not ", s->reserved_slots,
                                            ", or has no room for the last prompt token")));
    return -1;
  }
  s->kv_seq = kv;
  s->kv_len = s->reserved_slots;
  s->adopted = true;
  q.waiting.pop_front();
  q.running.push_back(s);
  out.admitted.push_back(s);
  out.chunks.push_back({s, n, true});
  return n;
}

int Admit(SchedSeq* s, int budget, const SchedulerConfig& config, SchedulerQueues& q,
          PagedKvCache& cache, StepSchedule& out) {
  if (s->reserved_kv >= 0) return AdmitReserved(s, q, cache, out);
  const int32_t kv = cache.NewSequence(s->plan_key != 0 ? s->plan_key : config.plan_key);
  int attached = 0;
  int base_slots = 0;  // slots already held before this chunk
  if (s->snapshot != nullptr) {
    s->n_computed = s->n_prompt - 1;
    base_slots = s->snapshot->n_slots;
  } else {
    attached = s->bypass_prefix_cache ? 0 : cache.AttachCachedPrefix(kv, s->tokens);
    s->n_computed = attached;
    base_slots = attached;
  }
  const int n =
      std::min(static_cast<int>(s->tokens.size()) - s->n_computed, ChunkBudget(*s, budget));
  const int new_slots = s->snapshot != nullptr ? base_slots + n : n;
  auto fail = [&](absl::Status st) {
    cache.FreeSequence(kv);
    s->n_computed = 0;
    q.waiting.pop_front();
    out.failed.emplace_back(s, std::move(st));
    return -1;
  };
  const int fork_slots = s->fork_blocks * cache.block_tokens();
  if (!cache.CanAdmit(new_slots + fork_slots)) {
    cache.FreeSequence(kv);
    s->n_computed = 0;
    const int slots = base_slots + n + fork_slots;
    if (NeverFits(slots, cache)) return fail(TooBig(*s, slots, cache));
    return 0;
  }
  if (s->snapshot != nullptr) {
    if (absl::Status st = cache.Import(kv, *s->snapshot); !st.ok()) return fail(st);
  }
  if (!cache.EnsureCapacity(kv, base_slots + n)) {
    cache.FreeSequence(kv);
    s->n_computed = 0;
    if (NeverFits(base_slots + n, cache)) return fail(TooBig(*s, base_slots + n, cache));
    return 0;
  }
  s->kv_seq = kv;
  s->kv_len = base_slots;
  if (s->preemptions == 0) s->cached_slots = attached;
  out.attached_slots += attached;
  if (s->snapshot == nullptr) out.queried_tokens += static_cast<int>(s->tokens.size());
  q.waiting.pop_front();
  q.running.push_back(s);
  out.admitted.push_back(s);
  out.chunks.push_back({s, n, s->n_computed + n == static_cast<int>(s->tokens.size())});
  return n;
}

}  // namespace

StepSchedule ScheduleStep(const SchedulerConfig& config, SchedulerQueues& q, PagedKvCache& cache) {
  StepSchedule out;
  int budget = std::max(1, config.max_tokens_per_step);

  // Running sequences, oldest first: each takes its pending tokens (chunked by the budget).
  for (size_t i = 0; i < q.running.size() && budget > 0;) {
    SchedSeq* s = q.running[i];
    const int n =
        std::min(static_cast<int>(s->tokens.size()) - s->n_computed, ChunkBudget(*s, budget));
    if (n <= 0) {
      ++i;
      continue;
    }
    bool self_preempted = false;
    while (!cache.EnsureCapacity(s->kv_seq, s->kv_len + n)) {
      if (q.running.size() == 1) {
        const int slots = s->kv_len + n;
        if (!NeverFits(slots, cache)) {
          // Alone, and KV reservations hold the rest of the pool: wait for them.
          Preempt(s, q, cache, out);
          self_preempted = true;
          break;
        }
        // Alone and too big for the whole pool: no victim can make room.
        cache.FreeSequence(s->kv_seq);
        s->kv_seq = -1;
        q.running.clear();
        out.failed.emplace_back(s, TooBig(*s, slots, cache));
        self_preempted = true;
        break;
      }
      const size_t v = PickVictim(q.running);
      SchedSeq* victim = q.running[v];
      Preempt(victim, q, cache, out);
      if (victim == s) {
        self_preempted = true;
        break;
      }
      if (v < i) {
        // An older sequence already scheduled this step (the newer ones are all imported):
        // take its chunk back.
        auto it = std::find_if(out.chunks.begin(), out.chunks.end(),
                               [&](const ScheduledChunk& c) { return c.seq == victim; });
        budget += it->n_tokens;
        out.chunks.erase(it);
        --i;
      }
    }
    if (self_preempted) break;  // the pool is exhausted: nothing later fits either
    out.chunks.push_back({s, n, s->n_computed + n == static_cast<int>(s->tokens.size())});
    budget -= n;
    ++i;
  }

  // Admission, FIFO, unless this step had to preempt (memory is short).
  while (out.preempted.empty() && budget > 0 && !q.waiting.empty() &&
         static_cast<int>(q.running.size()) < config.max_running) {
    int n = Admit(q.waiting.front(), budget, config, q, cache, out);
    if (n == 0) {
      // The head of line waits for blocks. A sequence whose KV a transfer already put in a
      // reservation needs none: it goes ahead, or the head could wait forever for the blocks
      // that such sequences hold behind it.
      auto it = std::find_if(q.waiting.begin(), q.waiting.end(),
                             [](const SchedSeq* w) { return w->reserved_kv >= 0; });
      if (it == q.waiting.end()) break;
      SchedSeq* ready = *it;
      q.waiting.erase(it);
      q.waiting.push_front(ready);
      n = Admit(ready, budget, config, q, cache, out);
    }
    if (n > 0) budget -= n;
  }

  for (const ScheduledChunk& c : out.chunks) out.n_tokens += c.n_tokens;
  return out;
}

void CommitStep(const StepSchedule& schedule, PagedKvCache& cache) {
  for (const ScheduledChunk& c : schedule.chunks) {
    SchedSeq* s = c.seq;
    cache.Append(s->kv_seq, std::span<const int32_t>(s->tokens).subspan(s->n_computed, c.n_tokens));
    s->n_computed += c.n_tokens;
    s->kv_len += c.n_tokens;
  }
}

void ReleaseSequence(SchedSeq* s, SchedulerQueues& q, PagedKvCache& cache) {
  if (s->kv_seq >= 0) cache.FreeSequence(s->kv_seq);
  if (s->reserved_kv >= 0) cache.FreeSequence(s->reserved_kv);
  s->kv_seq = -1;
  s->reserved_kv = -1;
  if (auto it = std::find(q.running.begin(), q.running.end(), s); it != q.running.end()) {
    q.running.erase(it);
  }
  if (auto it = std::find(q.waiting.begin(), q.waiting.end(), s); it != q.waiting.end()) {
    q.waiting.erase(it);
  }
}

}  // namespace tripod
