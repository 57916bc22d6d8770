// The CUDA Backend: the same table as the CPU's on one GPU. Weights are dequantised to bf16 at
// load (a tensor without bytes, as in a shape-only benchmark model, gets seeded random values
// made on the device), activations stay fp32 between ops, GEMMs run in cuBLAS (bf16 inputs, fp32
// accumulation and output), K/V live in device memory in the CPU's layout (DeviceKvMemory).
// One thread of control at a time: every op is enqueued on the backend's one stream, and only
// ToHost waits for it.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/compute/backend.h"

namespace tripod {

struct CudaBackendOptions {
  int device = 0;
};

// Unavailable (with the reason) when the build has no CUDA or the machine no usable GPU.
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(const CudaBackendOptions& options = {});

// "" when a CUDA device can be used, else why not (built without CUDA, no driver, no device).
std::string CudaUnavailableReason();

// Head dimensions the CUDA attention kernels cover.
bool CudaSupportsHeadDim(int head_dim);

}  // namespace tripod
