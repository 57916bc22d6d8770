#include "prefill_node/prefill_flags.h"

#include <string>

#include "absl/flags/flag.h"
#include "common/rpc/engine_flags.h"
#include "common/util/status_macros.h"
#include "prefill_node/pop_config.h"

ABSL_FLAG(std::string, pop_ratio, "0",
          "POP pruning ratio of the plan loaded, e.g. 1/3 (0: full weights, any request's plan)");
ABSL_FLAG(std::string, pop_layers, "",
          "skipped layers instead of a ratio, e.g. 20-29 or 3,7 (none: skip nothing)");
ABSL_FLAG(int, chunk, tripod::PrefillOptions{}.chunk, "prompt tokens per forward pass");
ABSL_FLAG(int, max_queue, 64, "requests waiting at most; more are refused (RESOURCE_EXHAUSTED)");
ABSL_FLAG(int, ack_timeout_ms, 30000,
          "how long a KV transfer waits for the decode side's acknowledgement of its end");
ABSL_FLAG(int, send_stall_ms, 10000,
          "a KV push that finds the send buffer full waits at most this long for the decode "
          "worker to take some (a paused decode worker then fails its transfer, and the "
          "scheduler moves the request, rather than holding this worker's engine)");
ABSL_FLAG(int, send_buffer_mb, 64,
          "encoded KV waiting for the network per transfer, at most (the forward then waits)");
ABSL_FLAG(std::string, kv_link, "auto",
          "where KV payloads travel: auto (a link, GPU to GPU, when this worker and the decode "
          "worker keep their KV on GPUs: NCCL, or IPC when they share one GPU; else in the "
          "PushKv messages) | none | nccl | ipc (one device only) | tcp (tests: the link's "
          "protocol over TCP, for a KV out of the host's reach without a GPU)");
ABSL_FLAG(int, kv_link_timeout_ms, 10000,
          "a KV link's set-up, and one payload on it, at most; a decode worker that offers no "
          "link, or whose link fails (the transfer then fails and the scheduler retries it), is "
          "not asked again for a minute, doubled after each failure in a row up to 64 minutes");
ABSL_FLAG(std::string, inject_transfer_faults, "",
          "TESTING ONLY: drop, corrupt or delay KV chunks on their way to the decode worker, "
          "e.g. drop=0.02,corrupt=0.02,delay=0.05,delay_ms=300,seed=1 (tests/chaos/)");

namespace tripod {
namespace {

absl::StatusOr<PrefillOptions> EngineOptions(const WorkerProcess& process) {
  PrefillOptions o;
  ASSIGN_OR_RETURN(o.model_path, process.ModelPath());
  ASSIGN_OR_RETURN(const EngineFlags engine, SetUpEngineFlags());
  o.precision = engine.precision;
  o.backend = engine.backend;
  o.chunk = absl::GetFlag(FLAGS_chunk);
  if (o.chunk <= 0) return absl::InvalidArgumentError("--chunk must be positive");
  std::string ratio = absl::GetFlag(FLAGS_pop_ratio);
  const std::string layers = absl::GetFlag(FLAGS_pop_layers);
  if (!layers.empty()) {
    // --pop_ratio's default gives way to an explicit layer list; a ratio given too is an error.
    if (ratio != "0") {
      return absl::InvalidArgumentError("give --pop_ratio or --pop_layers, not both");
    }
    ratio.clear();
  }
  ASSIGN_OR_RETURN(o.pop, ParsePopConfig(ratio, layers));
  return o;
}

}  // namespace

absl::StatusOr<PrefillFlags> PrefillFlagsFromCommandLine(const WorkerProcess& process) {
  PrefillFlags f;
  f.max_queue = absl::GetFlag(FLAGS_max_queue);
  if (f.max_queue < 1) return absl::InvalidArgumentError("--max_queue must be at least 1");
  f.transfer = {.ack_timeout_ms = absl::GetFlag(FLAGS_ack_timeout_ms),
                .send_stall_ms = absl::GetFlag(FLAGS_send_stall_ms),
                .send_buffer_mb = absl::GetFlag(FLAGS_send_buffer_mb),
                .kv_link = absl::GetFlag(FLAGS_kv_link),
                .kv_link_timeout_ms = absl::GetFlag(FLAGS_kv_link_timeout_ms),
                .inject_faults = absl::GetFlag(FLAGS_inject_transfer_faults)};
  RETURN_IF_ERROR(CheckPrefillTransferFlags(f.transfer));
  ASSIGN_OR_RETURN(f.engine, EngineOptions(process));
  f.transfer.backend = f.engine.backend;
  return f;
}

}  // namespace tripod
