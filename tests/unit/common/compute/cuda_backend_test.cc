// The CUDA backend from the CPU machines' side: a machine (or build) without a GPU refuses it
// with the reason, through the backend and through a Session; where a GPU is, the bundled model
// on it matches the CPU's exact fp32 path. The GPU's own kernels are checked on the lent GPU by
// bench/gpu_check.sh (op by op against host references, and the model's logits and tokens).
#include "common/compute/cuda/cuda_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/compute/session.h"
#include "draft_node/draft_engine.h"
#include "tests/unit/test_model.h"

namespace tripod {
namespace {

TEST(CudaBackendTest, WithoutAGpuItIsRefusedWithTheReason) {
  const std::string why = CudaUnavailableReason();
  if (why.empty()) GTEST_SKIP() << "this machine has a usable GPU: the refusal is not taken here";
  absl::StatusOr<std::unique_ptr<Backend>> b = MakeCudaBackend();
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(b.status().message(), why);

  SessionOptions o;
  o.model_path = TestModelPath();
  o.backend = "cuda";
  absl::StatusOr<std::unique_ptr<Session>> s = Session::Open(o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(s.status().message().find(why), std::string::npos) << s.status();
}

TEST(CudaBackendTest, DraftEngineOnCudaWithoutAGpuIsRefusedWithTheReason) {
  const std::string why = CudaUnavailableReason();
  if (why.empty()) GTEST_SKIP() << "this machine has a usable GPU: the refusal is not taken here";
  DraftEngineOptions o;
  o.model_path = TestModelPath();
  o.self_draft_layers = 4;
  o.backend = "cuda";
  absl::StatusOr<std::unique_ptr<DraftEngine>> e = DraftEngine::Create(o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(e.status().message().find(why), std::string::npos) << e.status();
  o.backend = "tpu";
  e = DraftEngine::Create(o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CudaBackendTest, UnknownBackendNamesTheChoices) {
  SessionOptions o;
  o.model_path = TestModelPath();
  o.backend = "tpu";
  absl::StatusOr<std::unique_ptr<Session>> s = Session::Open(o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("cpu | cuda"), std::string::npos) << s.status();
}

TEST(CudaBackendTest, BundledModelMatchesTheCpuReference) {
  if (const std::string why = CudaUnavailableReason(); !why.empty()) {
    GTEST_SKIP() << "no GPU here (" << why << "); bench/gpu_check.sh checks this on the lent GPU";
  }
  SessionOptions o;
  o.model_path = TestModelPath();
  o.context_tokens = 512;
  o.precision = "fp32";
  std::unique_ptr<Session> cpu = Session::Open(o).value();
  o.backend = "cuda";
  std::unique_ptr<Session> gpu = Session::Open(o).value();
  std::vector<int32_t> ids;
  for (int i = 0; i < 60; ++i) ids.push_back(100 + 37 * i % 5000);
  std::vector<float> a = cpu->Append(ids).value(), b = gpu->Append(ids).value();
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += a[i] * a[i];
  }
  EXPECT_LE(std::sqrt(num / den), 1e-2);
  for (int step = 0; step < 16; ++step) {
    const int32_t ta = static_cast<int32_t>(std::max_element(a.begin(), a.end()) - a.begin());
    const int32_t tb = static_cast<int32_t>(std::max_element(b.begin(), b.end()) - b.begin());
    ASSERT_EQ(ta, tb) << "greedy step " << step;
    a = cpu->Append({ta}).value();
    b = gpu->Append({tb}).value();
  }
}

}  // namespace
}  // namespace tripod
