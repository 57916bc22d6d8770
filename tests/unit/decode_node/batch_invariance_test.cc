// The CPU backend's batch-invariant mode (what the decode engine runs for fp32): a token's logits
// are bit-identical whether its sequence runs alone, in prompt chunks of any size, or in one
// forward with other sequences (decode rows, prompt chunks, more than 16 rows: the sizes where
// the default mode switches GEMV -> GEMM and decode -> prefill attention), with an f32 KV cache
// and with a q8_0 one (its rows are quantised alike however they were computed).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/compute/cpu/cpu_backend.h"
#include "common/compute/forward.h"
#include "common/kv/contiguous_kv_cache.h"
#include "tests/unit/test_model.h"

namespace tripod {
namespace {

class BatchInvarianceTest : public ::testing::TestWithParam<KvDtype> {};

TEST_P(BatchInvarianceTest, LogitsDoNotDependOnBatchOrChunking) {
  const std::string path = TestModelPath();
  CpuBackendOptions o = *CpuOptionsForPrecision("fp32");
  o.batch_invariant = true;
  o.prepack_at_load = false;
  auto backend = MakeCpuBackend(o);
  auto model = LoadModel(path, *backend);
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config;
  const ForwardPlan plan = ForwardPlan::Full(c.n_layers);
  ForwardWorkspace ws(*backend);
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> tok(200, 40000);
  auto prompt = [&](int n) {
    std::vector<int32_t> p(n);
    for (int32_t& t : p) t = tok(rng);
    return p;
  };
  const std::vector<int32_t> a = prompt(40), b = prompt(23), d = prompt(9);
  auto cache = [&](int seqs) {
    return *ContiguousKvCache::Create({c.n_layers, c.n_kv_heads, c.head_dim, GetParam()}, seqs, 64);
  };

  // Alone, one chunk: logits of a's last token.
  std::vector<float> alone;
  {
    auto kv = cache(1);
    StepBatch batch;
    batch.AddSequence(0, a.data(), 40, 0, 0, true);
    ASSERT_TRUE(Forward(**model, *backend, plan, batch, *kv, ws, &alone).ok());
  }
  // Chunked 1 + 6 + 33 rows, with b (prompt chunk) and d (one decode-like row at a time)
  // in the same forwards.
  std::vector<float> mixed;
  {
    auto kv = cache(3);
    StepBatch s1;
    s1.AddSequence(0, a.data(), 1, 0, 0, false);
    s1.AddSequence(1, b.data(), 23, 0, 0, true);
    s1.AddSequence(2, d.data(), 8, 0, 0, true);
    ASSERT_TRUE(Forward(**model, *backend, plan, s1, *kv, ws, &mixed).ok());
    StepBatch s2;
    s2.AddSequence(2, d.data() + 8, 1, 8, 8, true);
    s2.AddSequence(0, a.data() + 1, 6, 1, 1, false);
    ASSERT_TRUE(Forward(**model, *backend, plan, s2, *kv, ws, &mixed).ok());
    StepBatch s3;
    s3.AddSequence(1, a.data(), 1, 23, 23, true);  // b continues with some token
    s3.AddSequence(0, a.data() + 7, 33, 7, 7, true);
    ASSERT_TRUE(Forward(**model, *backend, plan, s3, *kv, ws, &mixed).ok());
  }
  const size_t vocab = c.vocab_size;
  ASSERT_EQ(alone.size(), vocab);
  ASSERT_EQ(mixed.size(), 2 * vocab);
  EXPECT_EQ(std::memcmp(alone.data(), mixed.data() + vocab, vocab * sizeof(float)), 0)
      << "a's last logits differ between alone and batched/chunked";
}

INSTANTIATE_TEST_SUITE_P(KvTypes, BatchInvarianceTest,
                         ::testing::Values(KvDtype::kF32, KvDtype::kBF16, KvDtype::kQ8_0),
                         [](const auto& info) { return std::string(KvDtypeName(info.param)); });

}  // namespace
}  // namespace tripod
