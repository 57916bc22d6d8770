// The real forward pass over a PagedKvCache: the attention kernels read the block table, so a
// prompt's logits through paged blocks equal those through the contiguous cache bit for bit
// (fp32), and a sequence that starts from prefix-cache blocks another sequence computed gets the
// same logits as computing everything itself.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "common/compute/cpu/cpu_backend.h"
#include "common/compute/forward.h"
#include "common/kv/contiguous_kv_cache.h"
#include "common/kv/paged_kv_cache.h"
#include "tests/unit/test_model.h"

namespace tripod {
namespace {

class PagedKvForwardTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = TestModelPath();
    backend_ = MakeCpuBackend(*CpuOptionsForPrecision("fp32")).release();
    auto m = LoadModel(path, *backend_);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = m->release();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete backend_;
    model_ = nullptr;
    backend_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(model_, nullptr) << "the model did not load"; }

  KvLayout Layout() const {
    const ModelConfig& c = model_->config;
    return KvLayout{c.n_layers, c.n_kv_heads, c.head_dim, KvDtype::kF32};
  }

  std::unique_ptr<PagedKvCache> NewPaged(int blocks) {
    PagedKvOptions o;
    o.layout = Layout();
    o.block_tokens = 16;
    o.budget_bytes = size_t{1} * blocks * 16 * o.layout.bytes_per_token();
    auto c = PagedKvCache::Create(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return std::move(*c);
  }

  // Runs ids[from, from + sum(chunks)) of sequence seq through the model, one forward per chunk,
  // growing and appending a paged cache when given one; returns each chunk's last-row logits.
  std::vector<std::vector<float>> Run(KvStore& kv, PagedKvCache* paged, int32_t seq,
                                      const std::vector<int32_t>& ids, int from,
                                      const std::vector<int>& chunks) {
    ForwardWorkspace ws(*backend_);
    const ForwardPlan plan = ForwardPlan::Full(model_->config.n_layers);
    std::vector<std::vector<float>> out;
    int pos = from;
    for (int n : chunks) {
      if (paged != nullptr) {
        EXPECT_TRUE(paged->EnsureCapacity(seq, pos + n));
      }
      StepBatch batch;
      batch.AddSequence(seq, ids.data() + pos, n, pos, pos, true);
      std::vector<float> logits;
      const absl::Status st = Forward(*model_, *backend_, plan, batch, kv, ws, &logits);
      EXPECT_TRUE(st.ok()) << st;
      if (paged != nullptr) {
        EXPECT_TRUE(paged->Append(seq, std::span<const int32_t>(ids.data() + pos, n)));
      }
      out.push_back(std::move(logits));
      pos += n;
    }
    return out;
  }

  static Backend* backend_;
  static LoadedModel* model_;
};
Backend* PagedKvForwardTest::backend_ = nullptr;
LoadedModel* PagedKvForwardTest::model_ = nullptr;

std::vector<int32_t> SomeIds(int n, int seed) {
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = 100 + (seed * 7919 + i * 104729) % 40000;
  return ids;
}

TEST_F(PagedKvForwardTest, LogitsEqualContiguousCacheBitForBit) {
  const std::vector<int32_t> ids = SomeIds(100, 1);
  const std::vector<int> chunks = {37, 16, 1, 30, 16};  // 100 tokens, across block edges
  auto contiguous = *ContiguousKvCache::Create(Layout(), 1, 128);
  const auto want = Run(*contiguous, nullptr, 0, ids, 0, chunks);

  auto paged = NewPaged(16);
  // Another sequence first, so that the tested one's blocks are not 0, 1, 2, ... in order.
  const uint64_t key = ForwardPlan::Full(model_->config.n_layers).KvKey();
  const int32_t other = paged->NewSequence(key);
  ASSERT_TRUE(paged->EnsureCapacity(other, 20));
  const int32_t seq = paged->NewSequence(key);
  const auto got = Run(*paged, paged.get(), seq, ids, 0, chunks);
  ASSERT_EQ(got.size(), want.size());
  for (size_t c = 0; c < want.size(); ++c) {
    ASSERT_EQ(got[c].size(), static_cast<size_t>(model_->config.vocab_size));
    EXPECT_EQ(got[c], want[c]) << "chunk " << c;  // bit for bit
  }
  EXPECT_EQ(paged->length(seq), 100);
  EXPECT_TRUE(paged->CheckConsistency().ok());
}

TEST_F(PagedKvForwardTest, PrefixCacheHitGivesTheSameLogits) {
  const std::vector<int32_t> a = SomeIds(72, 2);
  std::vector<int32_t> b(a.begin(), a.begin() + 70);  // shares 4 full blocks and 6 tokens
  const std::vector<int32_t> tail = SomeIds(10, 3);
  b.insert(b.end(), tail.begin(), tail.end());
  const std::vector<int> a_chunks = {16, 16, 16, 16, 8};

  auto paged = NewPaged(16);
  const uint64_t key = ForwardPlan::Full(model_->config.n_layers).KvKey();
  const int32_t sa = paged->NewSequence(key);
  Run(*paged, paged.get(), sa, a, 0, a_chunks);
  const int32_t sb = paged->NewSequence(key);
  ASSERT_EQ(paged->AttachCachedPrefix(sb, b), 64);
  const auto got = Run(*paged, paged.get(), sb, b, 64, {16});
  paged->FreeSequence(sa);  // b keeps the shared blocks alive
  EXPECT_TRUE(paged->CheckConsistency().ok());

  // b computed on its own, with the same chunk edges as the blocks it reused.
  auto contiguous = *ContiguousKvCache::Create(Layout(), 1, 128);
  const auto want = Run(*contiguous, nullptr, 0, b, 0, {16, 16, 16, 16, 16});
  EXPECT_EQ(got.back(), want.back());
}

}  // namespace
}  // namespace tripod
