// RunPrefillJob; see prefill_job.h.
#include "prefill_node/prefill_job.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tripod {
namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

RunnerResult RunPrefillJob(PrefillEngine& engine, const OpenKvSender& open_sender,
                           const PrefillJob& job, CancelToken& cancel) {
  PrefillOutcome o;
  const Clock::time_point start = Clock::now();
  o.queue_s = Seconds(job.accepted, start);
  o.plan_key = job.plan.KvKey();
  const bool untrimmed = KeepsEverything(job.trim, static_cast<int>(job.prompt.size()) - 1);
  // Shared with the finish below, which may outlive this call.
  const std::shared_ptr<KvSender> sender = open_sender(
      KvSendTarget{job.decode_address, job.decode_tls_name, job.transfer_id, job.deadline,
                   /*may_link=*/untrimmed});
  absl::StatusOr<PrefillResult> r;
  {
    // A cancel wakes a Push blocked on the network, and ends the call.
    ScopedOnCancel abort_stream(cancel, [&sender] { sender->Abort(); });
    if (untrimmed) {
      PrefillRun run;
      run.plan = &job.plan;
      run.cancel = &cancel.flag();
      run.sink = [&sender](KvStore& store, int32_t kv_seq, const KvRange& range) {
        return sender->PushRange(store, kv_seq, range);
      };
      r = engine.Run(job.prompt, run);
    } else {
      // Trimmed KV leaves after the scoring, all at once: which entries each layer keeps is
      // known only when the window's attention has been seen in every layer.
      r = engine.RunTrimmed(job.prompt, job.trim, &job.plan);
      if (r.ok() && cancel.flag().load()) {
        r = absl::CancelledError("prefill: cancelled after the trimmed forward");
      }
      if (r.ok()) {
        if (absl::Status s = sender->PushTrimmed(r->kv); !s.ok()) r = s;
      }
    }
  }
  const Clock::time_point computed = Clock::now();
  o.compute_s = Seconds(start, computed);
  if (!r.ok()) {
    o.status = r.status();
    sender->Abort();
    const KvSenderStats st = sender->stats();
    o.chunks_sent = st.chunks;
    o.bytes_sent = st.bytes;
    o.total_s = Seconds(job.accepted, Clock::now());
    return o;
  }
  o.prefilled_tokens = r->prefilled_tokens;
  // The engine is done with this job: the end message and the wait for the decode side's
  // acknowledgement happen off the engine thread, which takes the next job meanwhile (a decode
  // worker that is slow to acknowledge, or paused, no longer holds up every other prefill).
  RunnerResult result;
  result.finish = [sender, o, computed, &job, &cancel]() mutable {
    ScopedOnCancel abort_stream(cancel, [&sender] { sender->Abort(); });
    absl::StatusOr<v1::PushKvResponse> ack = sender->Finish();
    const KvSenderStats st = sender->stats();
    o.chunks_sent = st.chunks;
    o.bytes_sent = st.bytes;
    if (!ack.ok()) {
      o.status = ack.status();
    } else if (ack->chunks() != st.chunks || ack->bytes() != st.bytes) {
      o.status = absl::InternalError(absl::StrCat(
          "KV transfer ", job.transfer_id, ": the decode worker acknowledged ", ack->chunks(),
          " chunks of ", ack->bytes(), " bytes, ", st.chunks, " of ", st.bytes, " were sent"));
    }
    if (st.ack.has_value()) {
      if (st.first_handed.has_value()) o.transfer_s = Seconds(*st.first_handed, *st.ack);
      o.tail_s = std::max(0.0, Seconds(computed, *st.ack));
    }
    o.total_s = Seconds(job.accepted, Clock::now());
    return o;
  };
  return result;
}

}  // namespace tripod
