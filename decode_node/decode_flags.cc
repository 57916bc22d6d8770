#include "decode_node/decode_flags.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/flags/flag.h"
#include "absl/time/time.h"
#include "common/kv_transfer/kv_links.h"
#include "common/rpc/engine_flags.h"
#include "common/rpc/worker_server.h"
#include "common/util/status_macros.h"

ABSL_FLAG(std::string, kv_cache_dtype, "auto", "KV element type: auto | f32 | f16 | bf16 | q8_0");
ABSL_FLAG(int64_t, kv_budget_mb, 512, "KV cache memory in MiB");
ABSL_FLAG(int, block_tokens, 16, "token slots per KV block");
ABSL_FLAG(int, max_running, 128, "sequences in the continuous batch at most");
ABSL_FLAG(int, max_tokens_per_step, 256, "forward rows per step (decode tokens + prompt chunks)");
ABSL_FLAG(std::string, kv_links, "nccl,ipc",
          "KV links (device-to-device payloads, Decode.OpenKvLink) this worker takes, "
          "comma-separated: nccl (with --backend cuda, in a build with NCCL) | ipc (a prefill "
          "worker on this worker's device: a shared buffer, in NCCL's place) | tcp (tests: the "
          "same protocol over TCP, for a KV out of the host's reach without a GPU) | none");
ABSL_FLAG(int, yield_to_prefill_ms, 1000,
          "in a core share (--core_share), while a prefill or draft worker has prompts queued, "
          "hold back steps of streams already started for at most this long (or four times the "
          "last step's time, if longer), lending the CPUs to the prefill (new requests still run "
          "at once); 0: never");
ABSL_FLAG(int64_t, lease_ms, 30000,
          "default lease of a KV reservation: freed unless adopted by then (Reserve may ask for "
          "another)");

namespace tripod {

absl::StatusOr<DecodeFlags> DecodeFlagsFromCommandLine(const WorkerProcess& process) {
  if (absl::GetFlag(FLAGS_kv_budget_mb) <= 0) {
    return absl::InvalidArgumentError("--kv_budget_mb must be > 0");
  }
  if (absl::GetFlag(FLAGS_yield_to_prefill_ms) < 0) {
    return absl::InvalidArgumentError("--yield_to_prefill_ms must be >= 0");
  }
  if (absl::GetFlag(FLAGS_lease_ms) <= 0) {
    return absl::InvalidArgumentError("--lease_ms must be > 0");
  }
  ASSIGN_OR_RETURN(const EngineFlags engine, SetUpEngineFlags());
  DecodeFlags f;
  DecodeEngineOptions& eo = f.engine;
  ASSIGN_OR_RETURN(eo.model_path, process.ModelPath());
  eo.precision = engine.precision;
  eo.backend = engine.backend;
  eo.kv_cache_dtype = absl::GetFlag(FLAGS_kv_cache_dtype);
  eo.kv_budget_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_kv_budget_mb)) << 20;
  eo.block_tokens = absl::GetFlag(FLAGS_block_tokens);
  eo.max_running = absl::GetFlag(FLAGS_max_running);
  eo.max_tokens_per_step = absl::GetFlag(FLAGS_max_tokens_per_step);
  eo.yield_to_prefill_ms = absl::GetFlag(FLAGS_yield_to_prefill_ms);
  DecodeServiceOptions& so = f.service;
  so.transfers.default_lease = absl::Milliseconds(absl::GetFlag(FLAGS_lease_ms));
  so.transfers.max_lease = std::max(so.transfers.max_lease, so.transfers.default_lease);
  // TCP links listen where the gRPC server does.
  ASSIGN_OR_RETURN(so.links, ParseKvLinks(absl::GetFlag(FLAGS_kv_links), eo.backend,
                                          ParseHostPort("listen", process.listen())->host));
  return f;
}

}  // namespace tripod
