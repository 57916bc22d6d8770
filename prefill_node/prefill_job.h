// The prefill worker's job runner: one job's forward on the engine with its KV streamed to the
// decode worker as each layer is done (a KvSender as the engine's sink), then the end message and
// the decode side's acknowledgement. This is the PrefillQueue's Runner; it runs on the engine
// thread. It knows the transfer only through the sender (common/kv_transfer/kv_sender.h).
#pragma once

#include "common/kv_transfer/kv_sender.h"
#include "prefill_node/cancel_token.h"
#include "prefill_node/prefill_engine.h"
#include "prefill_node/prefill_queue.h"

namespace tripod {

// Runs `job` on `engine` (engine thread) and streams its KV to job.decode_address through the
// sender `open_sender` gives. Cancelling
// `cancel` stops the forward at the next layer and aborts the stream: CANCELLED. A decode side
// that refuses the transfer ends it with the decode side's status, code and message unchanged.
// Timing: queue_s from job.accepted to the start; compute_s the forward; transfer_s from the
// first message handed to the stream to the acknowledgement; tail_s from the end of the forward
// to the acknowledgement; total_s from job.accepted to the end.
// The forward runs here; the end message and the wait for the acknowledgement are the result's
// `finish`, which PrefillQueue runs off the engine thread (`job` and `cancel`, the ticket's,
// outlive it). A forward that fails returns its outcome at once.
RunnerResult RunPrefillJob(PrefillEngine& engine, const OpenKvSender& open_sender,
                           const PrefillJob& job, CancelToken& cancel);

}  // namespace tripod
