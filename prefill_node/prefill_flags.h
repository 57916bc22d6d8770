// tripod-prefill's own flags (beside the shared ones of common/rpc/worker_process.h and
// common/rpc/engine_flags.h), checked and turned into the engine's, the queue's and the KV
// transfer's options. The transfer's flags are checked before any model loads.
#pragma once

#include "absl/status/statusor.h"
#include "common/kv_transfer/prefill_transfer_setup.h"
#include "common/rpc/worker_process.h"
#include "prefill_node/prefill_engine.h"

namespace tripod {

struct PrefillFlags {
  PrefillOptions engine;  // the model, precision, backend, chunk and POP plan
  int max_queue = 64;
  PrefillTransferFlags transfer;
};

// INVALID_ARGUMENT names the flag whose value is wrong.
absl::StatusOr<PrefillFlags> PrefillFlagsFromCommandLine(const WorkerProcess& process);

}  // namespace tripod
