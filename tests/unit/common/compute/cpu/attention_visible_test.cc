// KvLayerRef::first_visible_slot in AttentionCpu: every ISA path, decode (incl. the split-slot
// path) and prefill tiles, against a naive double softmax over slots [first_visible, n_past + i].
#include <cmath>
#include <random>
#include <vector>

#include "common/compute/cpu/attention.h"
#include "common/compute/cpu/cpu_features.h"
#include "gtest/gtest.h"

namespace tripod {
namespace {

struct Case {
  int n_q, n_past, first_visible;
};

void RunCase(const Case& cs) {
  const int n_heads = 9, n_kv = 3, D = 64, g = n_heads / n_kv;
  const int slots = cs.n_past + cs.n_q;
  const int block_tokens = 32;
  const int n_blocks = (slots + block_tokens - 1) / block_tokens;
  const size_t block_bytes = size_t{1} * n_kv * block_tokens * D * 4;
  std::vector<uint8_t> kmem(n_blocks * block_bytes), vmem(n_blocks * block_bytes);
  std::vector<int32_t> ids(n_blocks);
  for (int b = 0; b < n_blocks; ++b) ids[b] = n_blocks - 1 - b;  // reversed: a paged layout
  KvLayerRef kv{kmem.data(),  vmem.data(), ids.data(),   n_blocks,
                block_tokens, block_bytes, KvDtype::kF32};
  std::mt19937 rng(5 + cs.first_visible);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> kf(size_t{1} * slots * n_kv * D), vf(kf.size());
  for (float& x : kf) x = nd(rng);
  for (float& x : vf) x = nd(rng);
  WriteKvCpu(kf.data(), vf.data(), slots, n_kv * D, n_kv, D, kv, 0);
  kv.first_visible_slot = cs.first_visible;
  std::vector<float> q(size_t{1} * cs.n_q * n_heads * D);
  for (float& x : q) x = 1.5f * nd(rng);

  for (IsaLevel isa : {IsaLevel::kScalar, IsaLevel::kAvx2, IsaLevel::kAvx512}) {
    SetIsaCap(IsaLevel::kAmx);
    if (isa > ActiveIsa()) continue;
    SetIsaCap(isa);
    std::vector<float> out(q.size(), -7.0f);
    AttentionArgs a{q.data(), n_heads * D, cs.n_q,     cs.n_past,
                    n_heads,  n_kv,        D,          1.0f / std::sqrt(float(D)),
                    kv,       out.data(),  n_heads * D};
    AttentionCpu(std::span<const AttentionArgs>(&a, 1));
    for (int i = 0; i < cs.n_q; ++i) {
      for (int h = 0; h < n_heads; ++h) {
        const int kvh = h / g, last = cs.n_past + i;
        std::vector<double> p;
        double mx = -1e300;
        for (int t = cs.first_visible; t <= last; ++t) {
          double dot = 0;
          for (int e = 0; e < D; ++e) {
            dot +=
                double(q[(size_t(i) * n_heads + h) * D + e]) * kf[(size_t(t) * n_kv + kvh) * D + e];
          }
          p.push_back(dot * a.scale);
          mx = std::max(mx, p.back());
        }
        double den = 0;
        for (double& x : p) den += (x = std::exp(x - mx));
        for (int e = 0; e < D; ++e) {
          double ref = 0;
          for (size_t j = 0; j < p.size(); ++j) {
            ref += p[j] * vf[((cs.first_visible + j) * n_kv + kvh) * D + e];
          }
          ref = p.empty() ? 0.0 : ref / den;  // an empty window gives zeros
          ASSERT_NEAR(out[(size_t(i) * n_heads + h) * D + e], ref, 2e-5 * (1 + std::fabs(ref)))
              << IsaName(isa) << " n_q=" << cs.n_q << " n_past=" << cs.n_past
              << " first=" << cs.first_visible << " i=" << i << " h=" << h;
        }
      }
    }
  }
  SetIsaCap(IsaLevel::kAmx);
}

TEST(AttentionVisibleTest, DecodeSeesOnlyFromFirstVisible) {
  RunCase({1, 100, 99});    // the boundary token's slot and its own
  RunCase({1, 1500, 700});  // long: the split-slot path
  RunCase({1, 300, 0});     // 0 = everything (the default)
}

TEST(AttentionVisibleTest, PrefillTilesSeeOnlyFromFirstVisible) {
  RunCase({32, 200, 199});
  RunCase({130, 50, 37});
  RunCase({40, 10, 25});  // queries 0..14 see nothing: zero rows
}

}  // namespace
}  // namespace tripod
