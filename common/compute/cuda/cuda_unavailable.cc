// The CUDA backend's entry points in a build without CUDA (no nvcc found, or a sanitizer build):
// every call says why there is no GPU backend.
#include "absl/status/status.h"
#include "common/compute/cuda/cuda_backend.h"

namespace tripod {

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(const CudaBackendOptions&) {
  return absl::UnavailableError(CudaUnavailableReason());
}

std::string CudaUnavailableReason() {
  return "this build has no CUDA backend (nvcc was not found at configure time, or the build is "
         "a sanitizer build)";
}

bool CudaSupportsHeadDim(int) { return false; }

CudaGraphStats GetCudaGraphStats(Backend&) { return {}; }

}  // namespace tripod
