// The CPU Backend: quantised GEMV kernels for small batches (decode), oneDNN GEMMs for large
// ones (prefill), tiled attention, and the elementwise ops, all on the one compute pool.
#pragma once

#include <memory>

#include "common/compute/backend.h"
#include "common/compute/cpu/gemm_onednn.h"
#include "common/compute/cpu/quant_gemv.h"

namespace tripod {

struct CpuBackendOptions {
  GemmPrecision gemm = GemmPrecision::kF32;  // prefill GEMMs
  GemvMode gemv = GemvMode::kF32;            // decode GEMVs
  int gemv_max_rows = 8;  // Linear with at most this many rows uses QuantGemm, more: oneDNN
};

// The two paths the CLI offers: "fp32" (exact reference path) and "bf16" (reduced precision).
absl::StatusOr<CpuBackendOptions> CpuOptionsForPrecision(std::string_view precision);

std::unique_ptr<Backend> MakeCpuBackend(const CpuBackendOptions& options);

}  // namespace tripod
