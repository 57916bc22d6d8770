// The prefill worker's KV transfers as its flags configure them: checked, the KV links' cache on
// the engine's KV memory, test-only fault injection, and their counters in the worker's metrics.
// The prefill worker's main hands the result to PrefillWorker; nothing here runs a transfer.
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/kv/kv_layout.h"
#include "common/kv/kv_memory.h"
#include "common/kv_transfer/kv_sender_factory.h"
#include "common/metrics/metrics.h"

namespace tripod {

// The prefill worker's transfer flags (prefill_node/main.cc documents each).
struct PrefillTransferFlags {
  int ack_timeout_ms = 30000;
  int send_stall_ms = 10000;
  int send_buffer_mb = 64;
  std::string kv_link = "auto";
  int kv_link_timeout_ms = 10000;
  std::string inject_faults;  // --inject_transfer_faults
  std::string backend = "cpu";
};

// The checks that need no engine (positive sizes and timeouts, the fault spec, the link mode's
// name): run before loading a model, so that a mistyped flag fails at once.
absl::Status CheckPrefillTransferFlags(const PrefillTransferFlags& flags);

// kv_memory: the engine's KV memory where it is out of the host code's reach (a GPU's, or the
// guarded CPU test backend's); nullopt for a plain host KV. The returned options keep `registry`'s
// counters and, through the link cache, `*kv_memory` (both must outlive them).
absl::StatusOr<TransferOptions> SetUpPrefillTransfer(const PrefillTransferFlags& flags,
                                                     const std::optional<KvMemory>& kv_memory,
                                                     KvDtype kv_dtype, metrics::Registry& registry);

}  // namespace tripod
