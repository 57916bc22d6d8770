// The NCCL KvLink: a two-rank communicator (the prefill worker rank 0, the decode worker rank 1),
// ncclSend / ncclRecv of device memory on the link's own stream. Built where CMake finds NCCL
// with the CUDA toolkit; elsewhere every entry point says there is none.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/kv_transfer/kv_link.h"

namespace tripod {

// Whether this build has NCCL.
bool NcclLinksBuilt();
// A new communicator's unique id (ncclUniqueId's bytes); the caller's process is its bootstrap
// root, so the decode worker makes it and hands it out.
absl::StatusOr<std::string> NewNcclLinkId();
// Joins the communicator of `id` as `rank` (0 or 1) of two, waiting at most `timeout` for the
// other end (non-blocking initialisation, aborted when the time is up).
absl::StatusOr<std::unique_ptr<KvLink>> OpenNcclLink(const std::string& id, int rank,
                                                     absl::Duration timeout);

}  // namespace tripod
