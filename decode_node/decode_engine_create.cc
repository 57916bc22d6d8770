// DecodeEngine::Create on the backend the options name: the part that makes a backend by name (and
// so links every backend); see decode_engine.h.
#include "common/compute/cpu/cpu_backend.h"
#include "common/compute/make_backend.h"
#include "common/util/status_macros.h"
#include "decode_node/decode_engine.h"

namespace tripod {

absl::StatusOr<std::unique_ptr<DecodeEngine>> DecodeEngine::Create(
    const DecodeEngineOptions& options) {
  ASSIGN_OR_RETURN(CpuBackendOptions cpu, CpuOptionsForPrecision(options.precision));
  cpu.batch_invariant =
      options.batch_invariant < 0 ? options.precision == "fp32" : options.batch_invariant != 0;
  // Batch-invariant Linear never takes the GEMM path: no fp32 copy of the weights to prepack.
  if (cpu.batch_invariant) cpu.prepack_at_load = false;
  ASSIGN_OR_RETURN(MadeBackend made, MakeBackend(options.backend, cpu));
  return Create(options, std::move(made.backend), made.default_kv);
}

}  // namespace tripod
