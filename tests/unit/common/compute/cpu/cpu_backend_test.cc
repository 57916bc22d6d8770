// Tests for the CPU backend's elementwise ops against double-precision references.
#include "common/compute/cpu/cpu_backend.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tripod {
namespace {

// SwiGLU computes e^-g inline (vectorised); it must stay within a few ulp of silu(g) * u over
// the whole range, including where e^-g over- or underflows.
TEST(CpuBackendTest, SwiGluMatchesDoubleReference) {
  std::unique_ptr<Backend> b = MakeCpuBackend(CpuBackendOptions{});
  const int m = 3, n = 1000;
  std::vector<float> gu(size_t{m} * 2 * n), out(size_t{m} * n, -1.0f);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> wide(-120.0f, 120.0f), narrow(-8.0f, 8.0f);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      gu[i * 2 * n + j] = j % 3 == 0 ? wide(rng) : narrow(rng);
      gu[i * 2 * n + n + j] = narrow(rng);
    }
  }
  const float edges[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 87.0f, -87.0f, 88.5f, -88.5f, 1e4f, -1e4f};
  for (int j = 0; j < 10; ++j) gu[j] = edges[j];
  b->SwiGlu(gu.data(), 2 * n, m, n, out.data(), n);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      const double g = gu[i * 2 * n + j], u = gu[i * 2 * n + n + j];
      const double ref = g / (1.0 + std::exp(-g)) * u;
      const double got = out[i * n + j];
      ASSERT_TRUE(std::isfinite(got)) << "g=" << g;
      // Below 1e-30 (g < -70) the clamped exponent only moves values that are zero to the model.
      ASSERT_NEAR(got, ref, 1e-6 * std::fabs(ref) + 1e-30) << "g=" << g << " u=" << u;
    }
  }
}

}  // namespace
}  // namespace tripod
