// Tests for AttentionCpu and WriteKvCpu: every ISA path on this CPU against a naive double
// softmax over the stored K/V, for paged (shuffled blocks) caches, f32 / f16 / bf16 / q8_0 KV,
// decode (incl. the split-slot path), prefill tiles, odd sizes and several sequences in one call.
#include "common/compute/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "common/compute/cpu/cpu_features.h"
#include "common/kv/kv_dtype.h"
#include "common/model/quant_types.h"
#include "gtest/gtest.h"

namespace tripod {
namespace {

std::vector<IsaLevel> Levels() {
  SetIsaCap(IsaLevel::kAmx);
  std::vector<IsaLevel> out;
  for (IsaLevel l : {IsaLevel::kScalar, IsaLevel::kAvx2, IsaLevel::kAvx512}) {
    if (l <= ActiveIsa()) out.push_back(l);
  }
  return out;
}

struct PagedKv {
  std::vector<uint8_t> k, v;
  std::vector<int32_t> ids;
  KvLayerRef ref;
};

PagedKv MakeKv(KvDtype dt, int n_kv, int head_dim, int block_tokens, int slots, std::mt19937& rng) {
  PagedKv kv;
  const int n_blocks = (slots + block_tokens - 1) / block_tokens;
  const size_t block_bytes = size_t(n_kv) * block_tokens * KvRowBytes(dt, head_dim);
  const int physical = n_blocks + 2;
  kv.k.assign(physical * block_bytes, 0xcd);
  kv.v.assign(physical * block_bytes, 0xcd);
  std::vector<int32_t> perm(physical);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  kv.ids.assign(perm.begin(), perm.begin() + n_blocks);
  kv.ref =
      KvLayerRef{kv.k.data(), kv.v.data(), kv.ids.data(), n_blocks, block_tokens, block_bytes, dt};
  return kv;
}

// Element e of a stored row, as the cache holds it.
float Stored(const uint8_t* row, int e, KvDtype dt) {
  if (dt == KvDtype::kQ8_0) {
    const uint8_t* blk = row + (e / kKvQ8Block) * kKvQ8BlockBytes;
    uint16_t h;
    std::memcpy(&h, blk, 2);
    return Fp16ToFp32(h) * static_cast<float>(static_cast<int8_t>(blk[2 + e % kKvQ8Block]));
  }
  if (dt == KvDtype::kF32) {
    float f;
    std::memcpy(&f, row + 4 * e, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, row + 2 * e, 2);
  return dt == KvDtype::kF16 ? Fp16ToFp32(h) : Bf16ToFp32(h);
}

struct Seq {
  int n_q, n_past, n_heads, n_kv, head_dim;
  KvDtype dt;
  int block_tokens;
};

struct SeqData {
  PagedKv kv;
  std::vector<float> q, kf, vf;  // kf / vf: the fp32 rows written, [slots][n_kv * head_dim]
  AttentionArgs args;
  std::vector<float> out;
};

void Prepare(const Seq& s, std::mt19937& rng, SeqData& d) {
  const int slots = s.n_past + s.n_q;
  const int kvw = s.n_kv * s.head_dim;
  d.kv = MakeKv(s.dt, s.n_kv, s.head_dim, s.block_tokens, slots, rng);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  d.kf.resize(size_t(slots) * kvw);
  d.vf.resize(size_t(slots) * kvw);
  for (float& x : d.kf) x = nd(rng);
  for (float& x : d.vf) x = nd(rng);
  // Written in two pieces to exercise slot_begin.
  const int first = slots / 3;
  WriteKvCpu(d.kf.data(), d.vf.data(), first, kvw, s.n_kv, s.head_dim, d.kv.ref, 0);
  WriteKvCpu(d.kf.data() + size_t(first) * kvw, d.vf.data() + size_t(first) * kvw, slots - first,
             kvw, s.n_kv, s.head_dim, d.kv.ref, first);
  const int qw = s.n_heads * s.head_dim;
  d.q.resize(size_t(s.n_q) * (qw + 5));
  for (float& x : d.q) x = 1.5f * nd(rng);
  d.out.assign(size_t(s.n_q) * (qw + 3), -9.0f);
  d.args = AttentionArgs{d.q.data(), qw + 5,       s.n_q,      s.n_past,
                         s.n_heads,  s.n_kv,       s.head_dim, 1.0f / std::sqrt(float(s.head_dim)),
                         d.kv.ref,   d.out.data(), qw + 3};
}

// The reference output of query i, head h over the stored K/V: ref[e], and abs[e] = the
// softmax-weighted mean of |V[.][e]|. round_q: q * scale rounded to bf16 first, as the bf16 dot
// kernel does.
void Reference(const Seq& s, const SeqData& d, int i, int h, bool round_q, std::vector<double>& ref,
               std::vector<double>& abs) {
  const int g = s.n_heads / s.n_kv, D = s.head_dim, kvh = h / g, last = s.n_past + i;
  std::vector<double> sc(last + 1);
  std::vector<uint8_t> krow(KvRowBytes(s.dt, D));
  double mx = -1e300;
  for (int t = 0; t <= last; ++t) {
    d.kv.ref.ReadK(t, kvh, D, krow.data());  // rows or tiles alike
    double dot = 0;
    for (int e = 0; e < D; ++e) {
      const float q = d.q[i * d.args.q_stride + h * D + e];
      const double k = Stored(krow.data(), e, s.dt);
      dot += round_q ? double(Bf16ToFp32(Fp32ToBf16(q * d.args.scale))) * k
                     : double(q) * k * d.args.scale;
    }
    sc[t] = dot;
    mx = std::max(mx, sc[t]);
  }
  double den = 0;
  for (double& x : sc) den += (x = std::exp(x - mx));
  ref.assign(D, 0.0);
  abs.assign(D, 0.0);
  for (int e = 0; e < D; ++e) {
    for (int t = 0; t <= last; ++t) {
      const double v = Stored(d.kv.ref.v_at(t, kvh, D), e, s.dt);
      ref[e] += sc[t] * v;
      abs[e] += sc[t] * std::fabs(v);
    }
    ref[e] /= den;
    abs[e] /= den;
  }
}

// Each output row against the reference: within 2e-5 relative; or, for bf16 KV, the bf16 dot
// kernel's arithmetic: scores from q rounded to bf16, and each probability rounded to bf16 before
// PV (|error| <= 2^-9 of the weighted mean of |V|; 2^-8 allows for the sums' own rounding).
void CheckAgainstReference(const Seq& s, const SeqData& d, IsaLevel isa) {
  const int D = s.head_dim;
  std::vector<double> ref, abs;
  for (int i = 0; i < s.n_q; ++i) {
    for (int h = 0; h < s.n_heads; ++h) {
      const float* out = d.out.data() + i * d.args.out_stride + h * D;
      Reference(s, d, i, h, false, ref, abs);
      bool exact = true;
      for (int e = 0; e < D; ++e)
        exact &= std::fabs(out[e] - ref[e]) <= 2e-5 * (1 + std::fabs(ref[e]));
      if (exact) continue;
      const bool rounded = s.dt == KvDtype::kBF16 && isa >= IsaLevel::kAvx512;
      if (rounded) Reference(s, d, i, h, true, ref, abs);
      for (int e = 0; e < D; ++e) {
        const double tol =
            2e-5 * (1 + std::fabs(ref[e])) + (rounded ? std::ldexp(abs[e], -8) : 0.0);
        ASSERT_NEAR(out[e], ref[e], tol)
            << "isa=" << IsaName(isa) << " n_q=" << s.n_q << " n_past=" << s.n_past << " D=" << D
            << " i=" << i << " h=" << h << " e=" << e << (rounded ? " (bf16 dots)" : "");
      }
    }
    for (int e = s.n_heads * D; e < d.args.out_stride; ++e) {
      ASSERT_EQ(d.out[i * d.args.out_stride + e], -9.0f);
    }
  }
}

void RunCases(const std::vector<Seq>& seqs, bool together) {
  for (IsaLevel isa : Levels()) {
    SetIsaCap(isa);
    std::mt19937 rng(77);
    std::vector<SeqData> data(seqs.size());
    for (size_t i = 0; i < seqs.size(); ++i) Prepare(seqs[i], rng, data[i]);
    if (together) {
      std::vector<AttentionArgs> args;
      for (const SeqData& d : data) args.push_back(d.args);
      AttentionCpu(args);
    } else {
      for (const SeqData& d : data) AttentionCpu(std::span<const AttentionArgs>(&d.args, 1));
    }
    for (size_t i = 0; i < seqs.size(); ++i) CheckAgainstReference(seqs[i], data[i], isa);
  }
  SetIsaCap(IsaLevel::kAmx);
}

TEST(AttentionCpuTest, DecodeF32) {
  RunCases({{1, 0, 9, 3, 64, KvDtype::kF32, 16},
            {1, 100, 9, 3, 64, KvDtype::kF32, 16},
            {1, 1500, 9, 3, 64, KvDtype::kF32, 256}},
           false);
}

TEST(AttentionCpuTest, DecodeHalfFormats) {
  RunCases({{1, 700, 9, 3, 64, KvDtype::kF16, 32}, {1, 333, 9, 3, 64, KvDtype::kBF16, 16}}, false);
}

TEST(AttentionCpuTest, DecodeQ8) {
  RunCases({{1, 700, 9, 3, 64, KvDtype::kQ8_0, 16},
            {1, 0, 9, 3, 64, KvDtype::kQ8_0, 16},
            {1, 260, 16, 2, 128, KvDtype::kQ8_0, 7},
            {1, 90, 8, 8, 32, KvDtype::kQ8_0, 5}},
           false);
}

TEST(AttentionCpuTest, ShortPrefillAndVerify) {
  // Few queries over a long past (speculative verification, chunked prefill tails).
  RunCases({{3, 50, 9, 3, 64, KvDtype::kF32, 16}, {5, 900, 9, 3, 64, KvDtype::kF16, 64}}, false);
}

TEST(AttentionCpuTest, PrefillTiles) {
  RunCases({{7, 13, 9, 3, 64, KvDtype::kF32, 16},
            {40, 0, 9, 3, 64, KvDtype::kF32, 8},
            {100, 37, 9, 3, 64, KvDtype::kBF16, 16},
            {130, 200, 9, 3, 64, KvDtype::kF16, 1000},
            {70, 20, 9, 3, 64, KvDtype::kQ8_0, 16}},
           false);
}

TEST(AttentionCpuTest, OtherShapes) {
  RunCases({{20, 5, 4, 4, 32, KvDtype::kF32, 16},   // no grouping, head_dim 32
            {9, 70, 8, 2, 48, KvDtype::kF32, 16},   // head_dim 48: scalar fallback
            {33, 3, 8, 2, 128, KvDtype::kF16, 16},  // group of 4, head_dim 128
            {1, 90, 8, 1, 16, KvDtype::kBF16, 7}},
           false);
}

TEST(AttentionCpuTest, BatchOfSequences) {
  RunCases({{1, 300, 9, 3, 64, KvDtype::kF16, 16},
            {1, 0, 9, 3, 64, KvDtype::kF16, 16},
            {50, 10, 9, 3, 64, KvDtype::kF16, 16},
            {2, 600, 9, 3, 64, KvDtype::kF16, 16},
            {1, 400, 9, 3, 64, KvDtype::kQ8_0, 16}},
           true);
}

// The decode kernel's shapes: head_dim 128 (fewer rows per register pass), groups of 4 and 7
// (row passes with a remainder), blocks of 7 and 40 slots (tiles that cross blocks), few queries
// with different causal limits in one task, and more KV heads than one decode task takes (10:
// tasks of 8 and 2 heads).
TEST(AttentionCpuTest, DecodeKernelShapes) {
  RunCases({{1, 300, 32, 8, 128, KvDtype::kF16, 16},
            {1, 900, 20, 10, 64, KvDtype::kF16, 16},
            {3, 40, 30, 10, 32, KvDtype::kF32, 16},
            {1, 77, 28, 4, 128, KvDtype::kBF16, 7},
            {2, 61, 14, 2, 64, KvDtype::kF32, 40},
            {4, 33, 8, 2, 32, KvDtype::kF16, 7},
            {1, 5000, 9, 3, 64, KvDtype::kF16, 16}},
           false);
}

// Batch-invariant mode: every query of a prefill chunk gives the same bits as the same query
// run alone as a decode step (what lets fp32 continuous batching reproduce a lone run).
TEST(AttentionCpuTest, BatchInvariantChunkRowsEqualLoneQueries) {
  for (IsaLevel isa : Levels()) {
    SetIsaCap(isa);
    for (KvDtype dt : {KvDtype::kF32, KvDtype::kF16, KvDtype::kBF16, KvDtype::kQ8_0}) {
      std::mt19937 rng(31);
      const Seq s{40, 90, 9, 3, 64, dt, 16};
      SeqData d;
      Prepare(s, rng, d);
      d.args.batch_invariant = true;
      AttentionCpu(std::span<const AttentionArgs>(&d.args, 1));
      const int qw = s.n_heads * s.head_dim;
      for (int i = 0; i < s.n_q; ++i) {
        AttentionArgs one = d.args;
        one.q = d.q.data() + i * d.args.q_stride;
        one.n_q = 1;
        one.n_past = s.n_past + i;
        std::vector<float> out(qw, -1.0f);
        one.out = out.data();
        AttentionCpu(std::span<const AttentionArgs>(&one, 1));
        ASSERT_EQ(0,
                  std::memcmp(out.data(), d.out.data() + i * d.args.out_stride, qw * sizeof(float)))
            << IsaName(isa) << " dt=" << int(dt) << " query " << i;
      }
    }
  }
  SetIsaCap(IsaLevel::kAmx);
}

// Invalid sequences (null pointers, heads not a multiple of the KV heads, a cache shorter than
// the window) are skipped without writing their output; valid ones in the same call still run.
TEST(AttentionCpuTest, BadArgsAreSkipped) {
  const Seq seq{1, 40, 9, 3, 64, KvDtype::kF16, 16};
  std::mt19937 rng(5);
  SeqData good, bad_heads, short_cache, null_q;
  Prepare(seq, rng, good);
  Prepare(seq, rng, bad_heads);
  Prepare(seq, rng, short_cache);
  Prepare(seq, rng, null_q);
  bad_heads.args.n_kv_heads = 2;
  short_cache.args.n_past = 200;  // the cache holds 41 slots
  null_q.args.q = nullptr;
  std::vector<AttentionArgs> args = {AttentionArgs{}, bad_heads.args, good.args, short_cache.args,
                                     null_q.args};
  AttentionCpu(args);
  CheckAgainstReference(seq, good, ActiveIsa());
  for (const SeqData* d : {&bad_heads, &short_cache, &null_q}) {
    EXPECT_TRUE(std::all_of(d->out.begin(), d->out.end(), [](float x) { return x == -9.0f; }));
  }
}

TEST(WriteKvCpuTest, ConversionsMatchReference) {
  const float specials[] = {0.0f,
                            -0.0f,
                            1.0f,
                            65504.0f,
                            65519.0f,
                            65520.0f,
                            1e-6f,
                            6e-8f,
                            3e-8f,
                            -2.5e-5f,
                            1e30f,
                            -1e-40f,
                            0.1f,
                            -3.14159f,
                            1.0f + 1.0f / 2048,
                            1.0f + 3.0f / 4096,
                            std::numeric_limits<float>::infinity()};
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 10.0f);
  const int n_kv = 2, D = 64;
  // 11 slots stay on one thread; 160 (40960 values) are written in parallel.
  for (const int n : {11, 160}) {
    std::vector<float> rows(n * n_kv * D);
    for (size_t i = 0; i < rows.size(); ++i) {
      rows[i] = i < std::size(specials) ? specials[i] : nd(rng);
    }
    for (IsaLevel isa : Levels()) {
      SetIsaCap(isa);
      // Blocks of 4 slots keep K in rows; of 16, the 2-byte types' K in tiles (kv_layout.h).
      for (const auto& [dt, bt] : std::vector<std::pair<KvDtype, int>>{{KvDtype::kF32, 4},
                                                                       {KvDtype::kF16, 4},
                                                                       {KvDtype::kBF16, 4},
                                                                       {KvDtype::kF16, 16},
                                                                       {KvDtype::kBF16, 16}}) {
        PagedKv kv = MakeKv(dt, n_kv, D, bt, n + 3, rng);
        ASSERT_EQ(kv.ref.k_tiled(D), bt == 16);
        WriteKvCpu(rows.data(), rows.data(), n, n_kv * D, n_kv, D, kv.ref, 3);
        std::vector<uint8_t> krow(KvRowBytes(dt, D));
        for (int t = 0; t < n; ++t) {
          for (int h = 0; h < n_kv; ++h) {
            kv.ref.ReadK(3 + t, h, D, krow.data());
            for (int e = 0; e < D; ++e) {
              const float x = rows[(t * n_kv + h) * D + e];
              const uint8_t* pk = krow.data() + e * KvRowBytes(dt, 1);
              const uint8_t* pv = kv.ref.v_at(3 + t, h, D) + e * KvRowBytes(dt, 1);
              if (dt == KvDtype::kF32) {
                ASSERT_EQ(std::memcmp(pk, &x, 4), 0);
                ASSERT_EQ(std::memcmp(pv, &x, 4), 0);
                continue;
              }
              const uint16_t want = dt == KvDtype::kF16 ? Fp32ToFp16(x) : Fp32ToBf16(x);
              uint16_t gk, gv;
              std::memcpy(&gk, pk, 2);
              std::memcpy(&gv, pv, 2);
              ASSERT_EQ(gk, want) << IsaName(isa) << " x=" << x << " dt=" << int(dt);
              ASSERT_EQ(gv, want);
            }
          }
        }
      }
    }
  }
  SetIsaCap(IsaLevel::kAmx);
}

// ConvertRowsCpu (the bf16 GEMMs' activations): every row, strided on both sides, equal to the
// scalar conversion, the bytes between rows untouched; small inputs on one thread, large ones
// (rows x n >= 32768) over the compute threads.
TEST(ConvertRowsCpuTest, StridedRowsMatchTheScalarConversion) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 4.0f);
  for (IsaLevel isa : Levels()) {
    SetIsaCap(isa);
    for (const auto& [rows, n] : std::vector<std::pair<int, int>>{{3, 40}, {300, 200}}) {
      const int src_ld = n + 7, dst_ld = 2 * n + 10;
      std::vector<float> src(size_t(rows) * src_ld);
      for (float& x : src) x = nd(rng);
      for (KvDtype dt : {KvDtype::kBF16, KvDtype::kF16}) {
        std::vector<uint8_t> dst(size_t(rows) * dst_ld, 0xab);
        ConvertRowsCpu(src.data(), rows, src_ld, n, dt, dst.data(), dst_ld);
        for (int r = 0; r < rows; ++r) {
          for (int e = 0; e < n; ++e) {
            const float x = src[size_t(r) * src_ld + e];
            const uint16_t want = dt == KvDtype::kF16 ? Fp32ToFp16(x) : Fp32ToBf16(x);
            uint16_t got;
            std::memcpy(&got, dst.data() + size_t(r) * dst_ld + 2 * e, 2);
            ASSERT_EQ(got, want) << IsaName(isa) << " row " << r << " e " << e << " x=" << x;
          }
          for (int b = 2 * n; b < dst_ld; ++b) ASSERT_EQ(dst[size_t(r) * dst_ld + b], 0xab);
        }
      }
    }
  }
  SetIsaCap(IsaLevel::kAmx);
}

// q8_0 rows are the bits of the one quantiser (kv_dtype.h) on every ISA.
TEST(WriteKvCpuTest, Q8RowsAreTheQuantisersOnEveryIsa) {
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  const int n_kv = 3, D = 64, n = 9;
  std::vector<float> rows(n * n_kv * D);
  for (float& x : rows) x = nd(rng);
  for (int e = 0; e < 32; ++e) rows[e] = 0.0f;  // an all-zero block
  for (IsaLevel isa : Levels()) {
    SetIsaCap(isa);
    PagedKv kv = MakeKv(KvDtype::kQ8_0, n_kv, D, 4, n + 1, rng);
    WriteKvCpu(rows.data(), rows.data(), n, n_kv * D, n_kv, D, kv.ref, 1);
    std::vector<uint8_t> want(KvRowBytes(KvDtype::kQ8_0, D));
    for (int t = 0; t < n; ++t) {
      for (int h = 0; h < n_kv; ++h) {
        QuantizeKvQ8Row(rows.data() + (t * n_kv + h) * D, D, want.data());
        ASSERT_EQ(0, std::memcmp(kv.ref.k_at(1 + t, h, D), want.data(), want.size()))
            << IsaName(isa) << " slot " << t << " head " << h;
        ASSERT_EQ(0, std::memcmp(kv.ref.v_at(1 + t, h, D), want.data(), want.size()));
      }
    }
  }
  SetIsaCap(IsaLevel::kAmx);
}

}  // namespace
}  // namespace tripod
