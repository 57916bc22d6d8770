// The engine processes' flags; see engine_flags.h.
#include "common/rpc/engine_flags.h"

#include "absl/flags/flag.h"
#include "common/util/thread_pool.h"

ABSL_FLAG(std::string, backend, "cpu",
          "cpu | cuda (bf16 weights, the KV in device memory, f16 by default) | cpu-guarded-kv "
          "(tests: the CPU with its KV out of the host code's reach, as a GPU's)");
ABSL_FLAG(std::string, precision, "auto", "the CPU's: fp32 | bf16 | int8 | int16 | auto");
ABSL_FLAG(int, threads, 0, "compute threads (0: all cores)");

namespace tripod {

absl::StatusOr<EngineFlags> SetUpEngineFlags() {
  const int threads = absl::GetFlag(FLAGS_threads);
  if (threads < 0) return absl::InvalidArgumentError("--threads must not be negative");
  if (threads > 0) SetComputeThreads(threads);
  return EngineFlags{absl::GetFlag(FLAGS_backend), absl::GetFlag(FLAGS_precision)};
}

}  // namespace tripod
