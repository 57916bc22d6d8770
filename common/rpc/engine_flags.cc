// The engine processes' flags; see engine_flags.h.
#include "common/rpc/engine_flags.h"

#include "absl/flags/flag.h"
#include "common/util/core_share.h"
#include "common/util/thread_pool.h"

ABSL_FLAG(std::string, backend, "cpu",
          "cpu | cuda (bf16 weights, the KV in device memory, f16 by default) | cpu-guarded-kv "
          "(tests: the CPU with its KV out of the host code's reach, as a GPU's)");
ABSL_FLAG(std::string, precision, "auto", "the CPU's: fp32 | bf16 | int8 | int16 | auto");
ABSL_FLAG(int, threads, 0, "compute threads (0: all cores)");
ABSL_FLAG(std::string, core_share, "",
          "a core share file (tripod serve writes it): this worker computes on its slot's CPUs and "
          "borrows idle neighbours' (needs --core_share_slot)");
ABSL_FLAG(int, core_share_slot, -1, "this worker's slot in --core_share");
ABSL_FLAG(int, core_share_member, 0,
          "this worker's place among the processes of its slot (tripod serve's draft workers share "
          "their prefill worker's slot as member 1 and up)");

namespace tripod {

absl::StatusOr<EngineFlags> SetUpEngineFlags() {
  const int threads = absl::GetFlag(FLAGS_threads);
  if (threads < 0) return absl::InvalidArgumentError("--threads must not be negative");
  const std::string share = absl::GetFlag(FLAGS_core_share);
  if (!share.empty()) {
    const int slot = absl::GetFlag(FLAGS_core_share_slot);
    if (slot < 0) return absl::InvalidArgumentError("--core_share needs --core_share_slot");
    if (absl::Status s = JoinCoreShare(share, slot, absl::GetFlag(FLAGS_core_share_member));
        !s.ok()) {
      return s;
    }
    // Before SetComputeThreads: it pins the team in the share's CPU order.
    if (threads == 0) SetComputeThreads(static_cast<int>(CoreShareCpuOrder().size()));
  }
  if (threads > 0) SetComputeThreads(threads);
  return EngineFlags{absl::GetFlag(FLAGS_backend), absl::GetFlag(FLAGS_precision)};
}

}  // namespace tripod
