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

// y[m, n] = x[m, k] * W[n, k]^T with W handed over at each call in plain row-major form (a tile of
// a larger matrix, dequantised just before; nothing prepacked or kept). x and W are bf16 (uint16
// bits) for kBF16, fp32 for kF32; y is fp32. Primitives are cached per shape. Thread-safe.
class DnnlPlainGemm {
 public:
  // Unimplemented where oneDNN has no fast matmul of that precision on this CPU.
  static absl::StatusOr<std::unique_ptr<DnnlPlainGemm>> Create(GemmPrecision precision);
  ~DnnlPlainGemm();
  void Run(const void* x, int64_t m, int64_t ldx, const void* w, int64_t n, int64_t k, int64_t ldw,
           float* y, int64_t ldy) const;
  GemmPrecision precision() const;

 private:
  struct Impl;
  explicit DnnlPlainGemm(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tripod
