// One prefill job of the prefill worker: the engine's forward with its KV streamed to the decode
// worker as each layer is done (KvSender as the engine's sink), then the end message and the
// decode side's acknowledgement. This is the PrefillQueue's Runner; it runs on the engine thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>

#include "prefill_node/cancel_token.h"
#include "prefill_node/channel_cache.h"
#include "prefill_node/kv_link_cache.h"
#include "prefill_node/prefill_engine.h"
#include "prefill_node/prefill_queue.h"
#include "prefill_node/transfer_faults.h"

namespace tripod {

struct TransferOptions {
  size_t max_queued_bytes = size_t{64} << 20;      // encoded KV waiting for the network, at most
  std::chrono::milliseconds ack_timeout{30000};    // end message -> acknowledgement, at most
  std::chrono::milliseconds stall_timeout{10000};  // a full send buffer waited on, at most
  std::shared_ptr<TransferFaultInjector> faults;   // test-only (transfer_faults.h); null: none
  // KV links (device to device) for untrimmed KV; null or disabled: payloads in PushKv messages.
  std::shared_ptr<KvLinkCache> links;
  absl::Duration link_timeout = absl::Seconds(30);  // one payload on a link, at most
};

// Runs `job` on `engine` (engine thread) and streams its KV to job.decode_address. Cancelling
// `cancel` stops the forward at the next layer and aborts the stream: CANCELLED. A decode side
// that refuses the transfer ends it with the decode side's status, code and message unchanged.
// Timing: queue_s from job.accepted to the start; compute_s the forward; transfer_s from the
// first message handed to the stream to the acknowledgement; tail_s from the end of the forward
// to the acknowledgement; total_s from job.accepted to the end.
// The forward runs here; the end message and the wait for the acknowledgement are the result's
// `finish`, which PrefillQueue runs off the engine thread (`job` and `cancel`, the ticket's,
// outlive it). A forward that fails returns its outcome at once.
RunnerResult RunPrefillJob(PrefillEngine& engine, ChannelCache& channels,
                           const TransferOptions& options, const PrefillJob& job,
                           CancelToken& cancel);

}  // namespace tripod
