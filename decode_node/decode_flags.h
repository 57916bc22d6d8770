// tripod-decode's own flags (beside the shared ones of common/rpc/worker_process.h and
// common/rpc/engine_flags.h), checked and turned into the engine's and the service's options.
#pragma once

#include "absl/status/statusor.h"
#include "common/rpc/worker_process.h"
#include "decode_node/decode_engine.h"
#include "decode_node/decode_service.h"

namespace tripod {

struct DecodeFlags {
  DecodeEngineOptions engine;    // the model, precision and backend included
  DecodeServiceOptions service;  // leases and KV links (TCP links on the gRPC address's host)
};

// INVALID_ARGUMENT names the flag whose value is wrong.
absl::StatusOr<DecodeFlags> DecodeFlagsFromCommandLine(const WorkerProcess& process);

}  // namespace tripod
