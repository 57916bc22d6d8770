// Prefill GEMMs through oneDNN: y[m, n] = x[m, k] * W[n, k]^T with W prepacked once in the
// layout oneDNN prefers. bf16 reaches AMX on CPUs that have it; fp32 runs oneDNN's AVX-512 path.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"

namespace tripod {

enum class GemmPrecision { kF32, kBF16 };

class DnnlLinear {
 public:
  // w: [n, k] row-major fp32 (dequantised weights); copied and prepacked.
  static absl::StatusOr<std::unique_ptr<DnnlLinear>> Create(const float* w, int64_t n, int64_t k,
                                                            GemmPrecision precision);
  ~DnnlLinear();
  // x: [m, k] fp32 rows ldx apart; y: [m, n] fp32 rows ldy apart. Any m >= 1.
  void Run(const float* x, int64_t m, int64_t ldx, float* y, int64_t ldy) const;

  int64_t n() const;
  int64_t k() const;
  size_t packed_bytes() const;

 private:
  struct Impl;
  explicit DnnlLinear(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tripod
