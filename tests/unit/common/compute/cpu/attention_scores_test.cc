// AttentionScoresCpu against softmax rows computed in double from the same K rows (read back
// from the cache, so that f16 rounding is the reference's too): every KV dtype and both K
// layouts, grouped query heads, a window with causal masking inside it, a first visible slot.
#include "common/compute/cpu/attention_scores.h"

#include <cmath>
#include <random>
#include <vector>

#include "common/compute/cpu/attention.h"
#include "common/kv/contiguous_kv_cache.h"
#include "common/kv/kv_dtype.h"
#include "gtest/gtest.h"

namespace tripod {
namespace {

TEST(AttentionScoresTest, MatchesDoubleSoftmaxReducedPerKvHead) {
  const int n_heads = 6, n_kv = 2, hd = 64, n_keys = 75, n_q = 9;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (KvDtype dt : {KvDtype::kF32, KvDtype::kF16, KvDtype::kBF16}) {
    for (int first_visible : {0, 7}) {
      for (bool ramp : {false, true}) {
        KvLayout layout{1, n_kv, hd, dt};
        auto cache = *ContiguousKvCache::Create(layout, 1, 128);
        std::vector<float> k(n_keys * n_kv * hd), v(k.size());
        for (float& x : k) x = nd(rng);
        for (float& x : v) x = nd(rng);
        KvLayerRef ref = cache->Layer(0, 0);
        WriteKvCpu(k.data(), v.data(), n_keys, n_kv * hd, n_kv, hd, ref, 0);
        ref.first_visible_slot = first_visible;
        std::vector<float> q(n_q * n_heads * hd);
        for (float& x : q) x = 0.3f * nd(rng);
        AttentionScoreArgs a;
        a.q = q.data();
        a.q_stride = n_heads * hd;
        a.n_q = n_q;
        a.q_slot0 = n_keys - n_q;  // the window is the last n_q slots
        a.n_keys = n_keys;
        a.n_heads = n_heads;
        a.n_kv_heads = n_kv;
        a.head_dim = hd;
        a.scale = 0.125f;
        a.kv = ref;
        a.ramp_weights = ramp;
        std::vector<float> mx(n_kv * n_keys, 0.0f), sm(n_kv * n_keys, 0.0f);
        a.max_out = mx.data();
        a.sum_out = sm.data();
        AttentionScoresCpu(std::span<const AttentionScoreArgs>(&a, 1));

        // The reference, from the K the cache holds.
        std::vector<double> kd(n_keys * n_kv * hd);
        std::vector<uint8_t> raw(KvRowBytes(dt, hd));
        std::vector<float> row(hd);
        for (int s = 0; s < n_keys; ++s) {
          for (int h = 0; h < n_kv; ++h) {
            ref.ReadK(s, h, hd, raw.data());
            ConvertKvRow(raw.data(), dt, reinterpret_cast<uint8_t*>(row.data()), KvDtype::kF32, hd);
            for (int d = 0; d < hd; ++d) kd[(s * n_kv + h) * hd + d] = row[d];
          }
        }
        std::vector<double> want_max(n_kv * n_keys, 0.0), want_sum(n_kv * n_keys, 0.0);
        for (int qh = 0; qh < n_heads; ++qh) {
          const int h = qh / (n_heads / n_kv);
          for (int i = 0; i < n_q; ++i) {
            const int last = a.q_slot0 + i;  // sees [first_visible, last]
            std::vector<double> p(n_keys, 0.0);
            double m = -1e300, total = 0;
            for (int s = first_visible; s <= last; ++s) {
              double dot = 0;
              for (int d = 0; d < hd; ++d) {
                dot += double{q[i * a.q_stride + qh * hd + d]} * kd[(s * n_kv + h) * hd + d];
              }
              p[s] = dot * a.scale;
              m = std::max(m, p[s]);
            }
            for (int s = first_visible; s <= last; ++s) total += (p[s] = std::exp(p[s] - m));
            const double w = ramp ? double(i) / (n_q - 1) : 1.0;
            for (int s = first_visible; s <= last; ++s) {
              want_max[h * n_keys + s] = std::max(want_max[h * n_keys + s], w * p[s] / total);
              want_sum[h * n_keys + s] += p[s] / total;
            }
          }
        }
        for (int e = 0; e < n_kv * n_keys; ++e) {
          ASSERT_NEAR(mx[e], want_max[e], 1e-5 + 1e-4 * want_max[e])
              << KvDtypeName(dt) << " first " << first_visible << " ramp " << ramp << " e=" << e;
          ASSERT_NEAR(sm[e], want_sum[e], 1e-5 + 1e-4 * want_sum[e])
              << KvDtypeName(dt) << " first " << first_visible << " e=" << e;
        }
        // Slots before the first visible one get nothing; every query's row sums to 1.
        for (int h = 0; h < n_kv; ++h) {
          double total = 0;
          for (int s = 0; s < n_keys; ++s) {
            if (s < first_visible) {
              EXPECT_EQ(sm[h * n_keys + s], 0.0f);
            }
            total += sm[h * n_keys + s];
          }
          EXPECT_NEAR(total, double(n_q) * (n_heads / n_kv), 1e-3);
        }
      }
    }
  }
}

}  // namespace
}  // namespace tripod
