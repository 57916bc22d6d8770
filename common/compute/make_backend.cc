// MakeBackend; see make_backend.h.
#include "common/compute/make_backend.h"

#include <cstdlib>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/compute/cpu/cpu_backend.h"
#include "common/compute/cuda/cuda_backend.h"
#include "common/compute/guarded_kv_backend.h"
#include "common/compute/profiling_backend.h"
#include "common/util/status_macros.h"

namespace tripod {
namespace {

// TRIPOD_CUDA_GRAPHS=1 replays decode steps as CUDA graphs. Off by default until the device check
// (bench/gpu_check) has run them on a GPU; an environment variable so that every worker `tripod
// serve` starts, and a pod's spec, can set it.
CudaBackendOptions CudaOptionsFromEnv() {
  CudaBackendOptions o;
  const char* env = std::getenv("TRIPOD_CUDA_GRAPHS");
  o.graphs = env != nullptr && std::strcmp(env, "1") == 0;
  return o;
}

}  // namespace

absl::StatusOr<MadeBackend> MakeBackend(const std::string& name, const std::string& precision) {
  ASSIGN_OR_RETURN(CpuBackendOptions cpu, CpuOptionsForPrecision(precision));
  return MakeBackend(name, cpu);
}

absl::StatusOr<MadeBackend> MakeBackend(const std::string& name, const CpuBackendOptions& cpu) {
  MadeBackend m;
  if (name == "cuda") {
    ASSIGN_OR_RETURN(std::unique_ptr<Backend> gpu, MakeCudaBackend(CudaOptionsFromEnv()));
    m.backend = MaybeProfile(std::move(gpu));
    m.default_kv = KvDtype::kF16;
  } else if (name == "cpu") {
    m.backend = MaybeProfile(MakeCpuBackend(cpu));
    m.default_kv = cpu.kv;
  } else if (name == "cpu-guarded-kv") {
    m.backend = MaybeProfile(MakeGuardedKvBackend(MakeCpuBackend(cpu)));
    m.default_kv = cpu.kv;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown backend '", name, "' (", kBackendNames, ")"));
  }
  return m;
}

}  // namespace tripod
