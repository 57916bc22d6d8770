// The CUDA Backend: the same table as the CPU's on one GPU. Weights are dequantised to bf16 at
// load (a tensor without bytes, as in a shape-only benchmark model, gets seeded random values
// made on the device), activations stay fp32 between ops, GEMMs run in cuBLAS (bf16 inputs, fp32
// accumulation and output), K/V live in device memory in the CPU's layout (DeviceKvMemory).
// One thread of control at a time: every op is enqueued on the backend's one stream, and only
// ToHost waits for it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/compute/backend.h"

namespace tripod {

struct CudaBackendOptions {
  int device = 0;
  // Decode steps (Backend::BeginGraphStep) replayed as CUDA graphs (step_graph.h), at most
  // max_graphs of them kept (one per batch shape seen twice).
  bool graphs = false;
  size_t max_graphs = 64;
};

// How a CUDA backend's decode steps ran (StepGraphs): all zero for another backend, or one
// without graphs.
struct CudaGraphStats {
  int64_t replays = 0, captures = 0, runs = 0;  // steps replayed, captured, launched op by op
  size_t graphs = 0;                            // graphs held now
};
CudaGraphStats GetCudaGraphStats(Backend& backend);

// Unavailable (with the reason) when the build has no CUDA or the machine no usable GPU.
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(const CudaBackendOptions& options = {});

// "" when a CUDA device can be used, else why not (built without CUDA, no driver, no device).
std::string CudaUnavailableReason();

// Head dimensions the CUDA attention kernels cover.
bool CudaSupportsHeadDim(int head_dim);

}  // namespace tripod
