#include "common/compute/cpu/attention_scores.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/kv/kv_dtype.h"
#include "common/util/thread_pool.h"

namespace tripod {
namespace {

// One (sequence, KV head): K of the visible slots converted to fp32 once, transposed ([d][slot])
// so that a query's scores are hd axpy passes over contiguous slots, which the compiler
// vectorises without reassociating (a dot product per slot needs a horizontal sum each), and is
// faster than the dot-product form (docs/cpu-kernels.md, "Draft attention scores: K
// transposed"). Then per query head of the group and per query a softmax row, reduced into the
// head's outputs.
void ScoreHead(const AttentionScoreArgs& a, int h) {
  const int hd = a.head_dim;
  const int first = std::max(0, a.kv.first_visible_slot);
  const int last = std::min(a.n_keys, a.q_slot0 + a.n_q);  // slots [first, last) can be seen
  if (last <= first) return;
  const int nk = last - first;
  std::vector<float> kt(static_cast<size_t>(nk) * hd);  // [d][slot - first]
  std::vector<float> row(hd);
  std::vector<uint8_t> raw(KvRowBytes(a.kv.dtype, hd));
  for (int s = first; s < last; ++s) {
    a.kv.ReadK(s, h, hd, raw.data());
    ConvertKvRow(raw.data(), a.kv.dtype, reinterpret_cast<uint8_t*>(row.data()), KvDtype::kF32, hd);
    for (int d = 0; d < hd; ++d) kt[size_t{1} * d * nk + (s - first)] = row[d];
  }
  const int group = a.n_heads / a.n_kv_heads;
  std::vector<float> p(nk);
  float* mx = a.max_out ? a.max_out + int64_t{h} * a.n_keys : nullptr;
  float* sm = a.sum_out ? a.sum_out + int64_t{h} * a.n_keys : nullptr;
  for (int g = 0; g < group; ++g) {
    const int qh = h * group + g;
    for (int i = 0; i < a.n_q; ++i) {
      const float* q = a.q + i * a.q_stride + int64_t{qh} * hd;
      const int seen = std::min(nk, a.q_slot0 + i + 1 - first);  // keys [first, first + seen)
      if (seen <= 0) continue;
      std::fill(p.begin(), p.begin() + seen, 0.0f);
      for (int d = 0; d < hd; ++d) {
        const float qd = q[d] * a.scale;
        const float* kd = &kt[size_t{1} * d * nk];
        float* pp = p.data();
        for (int j = 0; j < seen; ++j) pp[j] += qd * kd[j];
      }
      const float m = *std::max_element(p.begin(), p.begin() + seen);
      float total = 0;
      for (int j = 0; j < seen; ++j) {
        p[j] = std::exp(p[j] - m);
        total += p[j];
      }
      const float inv = 1.0f / total;
      const float w = a.ramp_weights && a.n_q > 1
                          ? static_cast<float>(i) / static_cast<float>(a.n_q - 1)
                          : 1.0f;
      for (int j = 0; j < seen; ++j) {
        const float pj = p[j] * inv;
        if (mx) mx[first + j] = std::max(mx[first + j], w * pj);
        if (sm) sm[first + j] += pj;
      }
    }
  }
}

}  // namespace

void AttentionScoresCpu(std::span<const AttentionScoreArgs> seqs) {
  std::vector<std::pair<int, int>> work;  // (sequence, kv head)
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (seqs[i].n_q <= 0) continue;
    for (int h = 0; h < seqs[i].n_kv_heads; ++h) work.emplace_back(static_cast<int>(i), h);
  }
  ParallelFor(
      static_cast<int64_t>(work.size()),
      [&](int64_t b, int64_t e) {
        for (int64_t w = b; w < e; ++w) ScoreHead(seqs[work[w].first], work[w].second);
      },
      1);
}

}  // namespace tripod
