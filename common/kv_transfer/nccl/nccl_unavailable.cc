// The NCCL KvLink's entry points in a build without NCCL (or without CUDA): they say so.
#include "common/kv_transfer/nccl_kv_link.h"

namespace tripod {

bool NcclLinksBuilt() { return false; }

absl::StatusOr<std::string> NewNcclLinkId() {
  return absl::FailedPreconditionError("this build has no NCCL (no CUDA toolkit with NCCL found)");
}

absl::StatusOr<std::unique_ptr<KvLink>> OpenNcclLink(const std::string&, int, absl::Duration) {
  return absl::FailedPreconditionError("this build has no NCCL (no CUDA toolkit with NCCL found)");
}

}  // namespace tripod
