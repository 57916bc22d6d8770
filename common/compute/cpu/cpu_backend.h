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
  GemvMode gemv_few_rows = GemvMode::kF32;   // ... of fewer than kBf16MinRows rows
  int gemv_max_rows = 16;  // Linear with at most this many rows uses QuantGemm, more: oneDNN
  // The same for matrices of K-quants, Q5_0 and Q5_1 only (0: gemv_max_rows). Their GEMM form is
  // streamed (a tile dequantised per call), so the GEMV stays ahead to more rows than for types
  // whose GEMM weights are prepacked.
  int gemv_max_rows_kquant = 0;
  // 0, or the row count from which QuantGemm runs kF32Tile instead of gemv (Q4_0/Q4_1/Q8_0).
  int gemv_tile_min_rows = 0;
  KvDtype kv = KvDtype::kF32;  // what callers should store K/V as
  // Where oneDNN has no plain-weights GEMM (so large batches multiply a prepacked fp32 / bf16 copy
  // of each matrix): build the copy when the matrix is prepared, rather than on its first large
  // batch, so that the first prompt does not pay for it. Elsewhere no such copy exists (large
  // batches stream dequantised tiles; see cpu_backend.cc) and this only concerns scaled matrices,
  // which are always prepacked.
  bool prepack_at_load = true;
  // Every row's result independent of the batch it is in (fp32 exactness under continuous
  // batching): Linear runs every row through the GEMV kernels, whose per-row arithmetic does not
  // depend on m, and attention treats every query like a decode query (AttentionArgs). Slower
  // prefill; the decode engine sets it for "fp32".
  bool batch_invariant = false;
};

// The precision paths, by name:
//  "fp32": fp32 activations everywhere, fp32 KV (the exact reference path);
//  "bf16": bf16 prefill GEMMs (AMX / AVX512_BF16 only), bf16 decode GEMVs where the CPU has
//          AVX512_BF16 (else fp32), f16 KV;
//  "int8": fp32 prefill GEMMs, int8-activation decode GEMVs, f16 KV;
//  "int16": fp32 prefill GEMMs, int16-activation decode GEMVs, f16 KV;
//  "auto": bf16 GEMMs where the CPU multiplies bf16 fast (AMX, or CpuFeatures::bf16_dot_fast);
//          decode GEMVs of 1-3 rows with int16 activations, of more rows in bf16 where the dots
//          are fast; else int16 (up to the GEMM's rows with AMX; without it up to 12 rows and
//          the fp32 tile (kF32Tile) from 13 to 64); f16 KV.
absl::StatusOr<CpuBackendOptions> CpuOptionsForPrecision(std::string_view precision);

std::unique_ptr<Backend> MakeCpuBackend(const CpuBackendOptions& options);

}  // namespace tripod
