// The device check of the CUDA backend (bench/gpu_check.sh runs it on the lent GPU machine):
//  1. each op against a host reference written here (double precision, the same bf16-rounded
//     weights and inputs, K/V read back through the CPU's layout code), paged and contiguous
//     caches, f32/f16/bf16 K/V, GQA, chunked prefill and batched decode;
//  2. the bundled model on the GPU against the CPU's fp32 reference (bench/gpu_reference):
//     relative error of the logits after the prompt, and the greedy tokens; the workers'
//     engines on device KV; decode steps replayed as CUDA graphs against the same steps op by op;
//  3. on a random-weight model of Llama-3.1-8B's shape (weights made on the device): prefill
//     full against POP 1/3 at 512 and 2048 tokens, decode tokens/s at batch 1 and 32 (op by op
//     and as CUDA graphs) against the weights' bytes and the measured copy bandwidth, and each
//     prefill GEMM through the backend against cuBLAS alone on the same shape.
// Prints a table per part and writes JSON lines to --out. Exit status 1 when a check fails.
//   gpu_check --reference ref.json --model M --out gpu_check.jsonl [--big=false]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <random>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "bench/gpu_check_common.h"
#include "common/compute/cuda/cuda_backend.h"
#include "common/compute/forwarding_backend.h"
#include "common/compute/profiling_backend.h"
#include "common/kv/contiguous_kv_cache.h"
#include "common/kv/kv_dtype.h"
#include "common/kv/kv_link_hash.h"
#include "common/kv/kv_snapshot.h"
#include "common/kv/kv_staging.h"
#include "common/kv/paged_kv_cache.h"
#include "common/model/model_resolver.h"
#include "common/model/quant_types.h"
#include "decode_node/decode_engine.h"
#include "eval/greedy_from_kv.h"
#include "nlohmann/json.hpp"
#include "prefill_node/pop_config.h"
#include "prefill_node/prefill_engine.h"

#if TRIPOD_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "common/compute/cuda/cuda_kernels.h"
#endif

ABSL_FLAG(std::string, model, "",
          "a GGUF file or a model catalogue name (scripts/fetch_model --list); default: the "
          "bundled model");
ABSL_FLAG(std::string, reference, "", "the CPU reference JSON (bench/gpu_reference)");
ABSL_FLAG(std::string, out, "", "JSON lines output (default: none)");
ABSL_FLAG(bool, big, true, "run the Llama-3.1-8B-shape timings");
ABSL_FLAG(int, reps, 5, "timed repetitions (median reported)");

namespace tripod {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

std::ofstream* g_out = nullptr;
bool g_failed = false;

void Emit(const json& j) {
  if (g_out != nullptr) *g_out << j.dump() << "\n";
}

// ---------------------------------------------------------------------------------------------
// Host helpers: rounding and decoding as the device does, random data, tensors over host floats.

float RoundBf16(float f) { return Bf16ToFp32(Fp32ToBf16(f)); }

// One K/V element of a row read back from the cache, as fp32.
float DecodeElem(const uint8_t* p, KvDtype t) {
  float f;
  ConvertKvRow(p, t, reinterpret_cast<uint8_t*>(&f), KvDtype::kF32, 1);
  return f;
}

std::vector<float> Random(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

GgufTensorInfo F32Tensor(const std::vector<float>& v, int64_t rows, int64_t cols) {
  GgufTensorInfo t;
  t.name = "check";
  t.dims = rows > 1 ? std::vector<int64_t>{cols, rows} : std::vector<int64_t>{cols};
  t.type = GgmlType::kF32;
  t.n_elements = static_cast<uint64_t>(rows * cols);
  t.n_bytes = t.n_elements * 4;
  t.data = reinterpret_cast<const uint8_t*>(v.data());
  return t;
}

// A device copy of host floats, freed with the scope.
struct Dev {
  Backend& b;
  float* p;
  size_t n;
  Dev(Backend& backend, const std::vector<float>& host) : b(backend), n(host.size()) {
    p = b.Alloc(n);
    b.FromHost(host.data(), n, p);
  }
  Dev(Backend& backend, size_t floats) : b(backend), n(floats) {
    p = b.Alloc(n);
    std::vector<float> zero(n, 0.0f);
    b.FromHost(zero.data(), n, p);
  }
  ~Dev() { b.Free(p); }
  std::vector<float> Host() const {
    std::vector<float> h(n);
    b.ToHost(p, n, h.data());
    return h;
  }
};

// The backend with its decode steps launched op by op: BeginGraphStep is not passed on, so a
// graph-enabled backend runs them as a backend without graphs would.
class EagerSteps final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  void BeginGraphStep() override {}
};

void Report(const std::string& name, double err, double tol) {
  const bool ok = err <= tol && std::isfinite(err);
  if (!ok) g_failed = true;
  std::printf("  %-44s err %-10.3g tol %-8.2g %s\n", name.c_str(), err, tol, ok ? "ok" : "FAIL");
  Emit({{"part", "ops"}, {"check", name}, {"error", err}, {"tolerance", tol}, {"ok", ok}});
}

// Largest |a - b| over the largest |b| (1 when b is all zero).
double RelErr(const std::vector<float>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num = std::max(num, std::abs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::abs(b[i]));
  }
  return num / (den > 0 ? den : 1);
}

// ---------------------------------------------------------------------------------------------
// Part 1: the ops.

void CheckLinear(Backend& be) {
  const int m = 37, k = 576, n = 1000, ldx = k + 3, ldy = n + 5;
  std::vector<float> w = Random(size_t{1} * n * k, 1), x = Random(size_t{1} * m * ldx, 2);
  const GgufTensorInfo t = F32Tensor(w, n, k);
  const GgufTensorInfo* parts[] = {&t};
  std::unique_ptr<PreparedMatrix> pw = be.PrepareMatrix(parts).value();
  Dev dx(be, x), dy(be, size_t{1} * m * ldy);
  be.Linear(*pw, dx.p, m, ldx, dy.p, ldy, false);
  std::vector<double> ref(size_t{1} * m * ldy, 0.0);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double acc = 0;
      for (int c = 0; c < k; ++c) {
        acc += double{RoundBf16(x[size_t{1} * i * ldx + c])} * RoundBf16(w[size_t{1} * j * k + c]);
      }
      ref[size_t{1} * i * ldy + j] = acc;
    }
  }
  Report("linear 37x576 -> 1000 (bf16 in, fp32 out)", RelErr(dy.Host(), ref), 1e-5);
  be.Linear(*pw, dx.p, m, ldx, dy.p, ldy, true);
  for (double& v : ref) v *= 2;
  Report("linear, accumulating", RelErr(dy.Host(), ref), 1e-5);
  // A few rows take the decode kernel (gemv.cu), which keeps the activations in fp32.
  const int mg = 3;
  Dev gy(be, size_t{1} * mg * ldy);
  be.Linear(*pw, dx.p, mg, ldx + 1, gy.p, ldy, false);  // odd ldx: cuBLAS path
  be.Linear(*pw, dx.p, mg, ldx - 3, gy.p, ldy, false);  // ldx = k: the gemv kernel
  std::vector<double> gref(size_t{1} * mg * ldy, 0.0);
  for (int i = 0; i < mg; ++i) {
    for (int j = 0; j < n; ++j) {
      double acc = 0;
      for (int c = 0; c < k; ++c) {
        acc += double{x[size_t{1} * i * (ldx - 3) + c]} * RoundBf16(w[size_t{1} * j * k + c]);
      }
      gref[size_t{1} * i * ldy + j] = acc;
    }
  }
  Report("linear 3x576 -> 1000 (decode gemv, fp32 x)", RelErr(gy.Host(), gref), 1e-5);
  be.Linear(*pw, dx.p, mg, ldx - 3, gy.p, ldy, true);
  for (double& v : gref) v *= 2;
  Report("linear 3 rows, accumulating", RelErr(gy.Host(), gref), 1e-5);
}

void CheckElementwise(Backend& be) {
  {  // RmsNorm, in place on a strided view
    const int m = 5, n = 576, ld = 600;
    std::vector<float> x = Random(size_t{1} * m * ld, 3), w = Random(n, 4);
    const GgufTensorInfo tw = F32Tensor(w, 1, n);
    auto pv = be.PrepareVector(tw).value();
    Dev dx(be, x);
    be.RmsNorm(dx.p, ld, *pv, m, n, 1e-5f, dx.p, ld);
    std::vector<double> ref(x.begin(), x.end());
    for (int i = 0; i < m; ++i) {
      double ss = 0;
      for (int j = 0; j < n; ++j) ss += double{x[i * ld + j]} * x[i * ld + j];
      const double inv = 1.0 / std::sqrt(ss / n + 1e-5);
      for (int j = 0; j < n; ++j) ref[i * ld + j] = x[i * ld + j] * inv * w[j];
    }
    Report("rmsnorm 5x576, in place", RelErr(dx.Host(), ref), 1e-5);
  }
  for (bool halves : {false, true}) {  // RoPE
    const int m = 4, heads = 3, hd = 64, rd = 64, ld = heads * hd + 7, half = rd / 2;
    std::vector<float> x = Random(size_t{1} * m * ld, 5), ang = Random(size_t{1} * m * half, 6, 3);
    std::vector<float> c(ang.size()), s(ang.size());
    for (size_t i = 0; i < ang.size(); ++i) c[i] = std::cos(ang[i]), s[i] = std::sin(ang[i]);
    Dev dx(be, x), dc(be, c), ds(be, s);
    be.Rope(dx.p, ld, m, heads, hd, RopeAngles{dc.p, ds.p, rd, halves});
    std::vector<double> ref(x.begin(), x.end());
    for (int r = 0; r < m; ++r) {
      for (int h = 0; h < heads; ++h) {
        for (int i = 0; i < half; ++i) {
          const int i0 = r * ld + h * hd + (halves ? i : 2 * i);
          const int i1 = r * ld + h * hd + (halves ? i + half : 2 * i + 1);
          const double cc = c[r * half + i], ss = s[r * half + i];
          ref[i0] = x[i0] * cc - x[i1] * ss;
          ref[i1] = x[i0] * ss + x[i1] * cc;
        }
      }
    }
    Report(halves ? "rope (halves)" : "rope (adjacent pairs)", RelErr(dx.Host(), ref), 1e-6);
  }
  {  // SwiGLU, bias, scaled add, gather
    const int m = 3, n = 100;
    std::vector<float> gu = Random(size_t{1} * m * 2 * n, 7, 4);
    Dev dgu(be, gu), dout(be, size_t{1} * m * n);
    be.SwiGlu(dgu.p, 2 * n, m, n, dout.p, n);
    std::vector<double> ref(size_t{1} * m * n);
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < n; ++j) {
        const double g = gu[i * 2 * n + j], u = gu[i * 2 * n + n + j];
        ref[i * n + j] = g / (1 + std::exp(-g)) * u;
      }
    }
    Report("swiglu", RelErr(dout.Host(), ref), 1e-5);
    std::vector<float> b = Random(n, 8);
    const GgufTensorInfo tb = F32Tensor(b, 1, n);
    auto pb = be.PrepareVector(tb).value();
    be.AddBias(dout.p, n, *pb, m, n);
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) ref[i * n + j] += b[j];
    Report("add bias", RelErr(dout.Host(), ref), 1e-5);
    be.AddScaled(dgu.p, 2 * n, 0.5f, m, n, dout.p, n);
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) ref[i * n + j] += 0.5 * gu[i * 2 * n + j];
    Report("add scaled", RelErr(dout.Host(), ref), 1e-5);
    const int32_t rows[] = {2, 0};
    Dev dg(be, size_t{2} * n);
    be.GatherRows(dout.p, n, rows, n, dg.p, n);
    std::vector<double> gref(ref.begin() + 2 * n, ref.begin() + 3 * n);
    gref.insert(gref.end(), ref.begin(), ref.begin() + n);
    Report("gather rows", RelErr(dg.Host(), gref), 1e-6);
  }
  {  // Embed
    const int vocab = 50, d = 64;
    std::vector<float> table = Random(size_t{1} * vocab * d, 9);
    const GgufTensorInfo tt = F32Tensor(table, vocab, d);
    const int32_t ids[] = {3, 49, 0};
    Dev out(be, size_t{3} * (d + 1));
    be.Embed(tt, ids, out.p, d + 1);
    std::vector<double> ref(size_t{3} * (d + 1), 0.0);
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < d; ++j) ref[i * (d + 1) + j] = RoundBf16(table[ids[i] * d + j]);
    Report("embed (bf16 table)", RelErr(out.Host(), ref), 1e-6);
  }
}

struct AttnCase {
  std::string name;
  int head_dim, n_heads, n_kv_heads;
  KvDtype dtype;
  int block_tokens;
  bool paged;  // blocks in reverse order (a block table to upload), else block b = b
  std::vector<std::pair<int, int>> seqs;  // (n_past, n_q)
  int first_visible = 0;
};

void CheckAttention(Backend& be, const AttnCase& c) {
  const int hd = c.head_dim, nkv = c.n_kv_heads, kvd = nkv * hd, qd = c.n_heads * hd;
  const size_t row_bytes = KvRowBytes(c.dtype, hd);
  const size_t block_bytes = size_t{1} * nkv * c.block_tokens * row_bytes;
  std::vector<std::vector<int32_t>> tables;
  int total_blocks = 0;
  for (auto [past, nq] : c.seqs) {
    const int nb = (past + nq + c.block_tokens - 1) / c.block_tokens;
    std::vector<int32_t> t(nb);
    for (int b = 0; b < nb; ++b) t[b] = c.paged ? total_blocks + nb - 1 - b : b;
    tables.push_back(t);
    total_blocks += nb;
  }
  KvMemory mem = be.DeviceKvMemory().value();
  const size_t pool_bytes = block_bytes * total_blocks;
  uint8_t* kpool = mem.alloc(pool_bytes);
  uint8_t* vpool = mem.alloc(pool_bytes);
  std::vector<KvLayerRef> refs;
  int block0 = 0;
  for (size_t i = 0; i < c.seqs.size(); ++i) {
    KvLayerRef r;
    // A paged sequence's table names pool blocks; a contiguous one owns its own stretch.
    r.k_base = kpool + (c.paged ? 0 : block_bytes * block0);
    r.v_base = vpool + (c.paged ? 0 : block_bytes * block0);
    r.block_ids = tables[i].data();
    r.n_blocks = static_cast<int>(tables[i].size());
    r.block_tokens = c.block_tokens;
    r.block_bytes = block_bytes;
    r.dtype = c.dtype;
    r.first_visible_slot = c.first_visible;
    refs.push_back(r);
    block0 += r.n_blocks;
  }
  // K/V rows, written in two calls per sequence (the past, then the new rows at slot n_past).
  std::vector<std::vector<float>> ks, vs;
  for (size_t i = 0; i < c.seqs.size(); ++i) {
    const auto [past, nq] = c.seqs[i];
    const int n = past + nq;
    ks.push_back(Random(size_t{1} * n * kvd, 100 + i));
    vs.push_back(Random(size_t{1} * n * kvd, 200 + i));
    Dev dk(be, ks.back()), dv(be, vs.back());
    if (past > 0) be.WriteKv(dk.p, dv.p, past, kvd, nkv, hd, refs[i], 0);
    be.WriteKv(dk.p + int64_t{past} * kvd, dv.p + int64_t{past} * kvd, nq, kvd, nkv, hd, refs[i],
               past);
  }
  // Read back through the CPU's layout code: what the device wrote is where the CPU looks.
  std::vector<float> kh(pool_bytes / 4), vh(pool_bytes / 4);
  be.ToHost(reinterpret_cast<const float*>(kpool), kh.size(), kh.data());
  be.ToHost(reinterpret_cast<const float*>(vpool), vh.size(), vh.data());
  std::vector<std::vector<float>> kd(c.seqs.size()), vd(c.seqs.size());  // decoded, [slot][kvd]
  double write_err = 0;
  std::vector<uint8_t> row(row_bytes);
  for (size_t i = 0; i < c.seqs.size(); ++i) {
    KvLayerRef host = refs[i];
    const ptrdiff_t off = refs[i].k_base - kpool;
    host.k_base = reinterpret_cast<uint8_t*>(kh.data()) + off;
    host.v_base = reinterpret_cast<uint8_t*>(vh.data()) + off;
    const int n = c.seqs[i].first + c.seqs[i].second;
    kd[i].resize(size_t{1} * n * kvd);
    vd[i].resize(size_t{1} * n * kvd);
    for (int s = 0; s < n; ++s) {
      for (int h = 0; h < nkv; ++h) {
        host.ReadK(s, h, hd, row.data());
        const uint8_t* vrow = host.v_at(s, h, hd);
        for (int d = 0; d < hd; ++d) {
          const size_t at = size_t{1} * s * kvd + h * hd + d;
          kd[i][at] = DecodeElem(row.data() + d * (row_bytes / hd), c.dtype);
          vd[i][at] = DecodeElem(vrow + d * (row_bytes / hd), c.dtype);
          write_err = std::max({write_err, std::abs(double{kd[i][at]} - ks[i][at]),
                                std::abs(double{vd[i][at]} - vs[i][at])});
        }
      }
    }
  }
  Report(c.name + ": write_kv, read back", write_err, c.dtype == KvDtype::kF32 ? 0 : 4e-3);

  // Attention of every sequence in one call, against the host on the decoded K/V.
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  int total_q = 0;
  for (auto [past, nq] : c.seqs) total_q += nq;
  const int q_ld = qd + 3;
  std::vector<float> q = Random(size_t{1} * total_q * q_ld, 300);
  Dev dq(be, q), dout(be, size_t{1} * total_q * qd);
  std::vector<AttentionArgs> args;
  std::vector<double> ref(size_t{1} * total_q * qd, 0.0);
  int q0 = 0;
  for (size_t i = 0; i < c.seqs.size(); ++i) {
    const auto [past, nq] = c.seqs[i];
    AttentionArgs a;
    a.q = dq.p + int64_t{q0} * q_ld;
    a.q_stride = q_ld;
    a.n_q = nq;
    a.n_past = past;
    a.n_heads = c.n_heads;
    a.n_kv_heads = nkv;
    a.head_dim = hd;
    a.scale = scale;
    a.kv = refs[i];
    a.out = dout.p + int64_t{q0} * qd;
    a.out_stride = qd;
    args.push_back(a);
    const int group = c.n_heads / nkv;
    for (int qi = 0; qi < nq; ++qi) {
      for (int hq = 0; hq < c.n_heads; ++hq) {
        const int h = hq / group;
        const float* qr = q.data() + size_t{1} * (q0 + qi) * q_ld + hq * hd;
        const int last = past + qi;
        std::vector<double> sc;
        double mx = -INFINITY;
        for (int s = c.first_visible; s <= last; ++s) {
          double acc = 0;
          for (int d = 0; d < hd; ++d)
            acc += double{qr[d]} * kd[i][size_t{1} * s * kvd + h * hd + d];
          sc.push_back(acc * scale);
          mx = std::max(mx, sc.back());
        }
        double sum = 0;
        for (double& v : sc) sum += (v = std::exp(v - mx));
        double* o = ref.data() + size_t{1} * (q0 + qi) * qd + hq * hd;
        for (int s = c.first_visible; s <= last; ++s) {
          const double p = sc[s - c.first_visible] / sum;
          for (int d = 0; d < hd; ++d) o[d] += p * vd[i][size_t{1} * s * kvd + h * hd + d];
        }
      }
    }
    q0 += nq;
  }
  be.Attention(args);
  // Prefill batches of 2-byte caches take the tensor-core kernel, whose operands (q, and the
  // probabilities; K/V of a bf16 cache too) are rounded to f16.
  int max_q = 0;
  for (auto [past, nq] : c.seqs) max_q = std::max(max_q, nq);
  double tol = 2e-5;
  if (c.dtype != KvDtype::kF32 && max_q >= 16) tol = 3e-3;
  Report(c.name + ": attention", RelErr(dout.Host(), ref), tol);

  // Scores of the first sequence's last w queries (SpecPC's ramp), against the host.
  const auto [past, nq] = c.seqs[0];
  const int w = std::min(8, nq), n_keys = past + nq;
  AttentionScoreArgs sa;
  sa.q = dq.p + int64_t{nq - w} * q_ld;
  sa.q_stride = q_ld;
  sa.n_q = w;
  sa.q_slot0 = past + nq - w;
  sa.n_keys = n_keys;
  sa.n_heads = c.n_heads;
  sa.n_kv_heads = nkv;
  sa.head_dim = hd;
  sa.scale = scale;
  sa.kv = refs[0];
  sa.ramp_weights = true;
  std::vector<float> mx_out(size_t{1} * nkv * n_keys, 0.0f), sum_out(mx_out.size(), 0.0f);
  sa.max_out = mx_out.data();
  sa.sum_out = sum_out.data();
  be.AttentionScores(std::span<const AttentionScoreArgs>(&sa, 1));
  std::vector<double> mref(mx_out.size(), 0.0), sref(mx_out.size(), 0.0);
  const int group = c.n_heads / nkv;
  for (int i = 0; i < w; ++i) {
    const int last = sa.q_slot0 + i;
    const double wt = w == 1 ? 1.0 : static_cast<double>(i) / (w - 1);
    for (int hq = 0; hq < c.n_heads; ++hq) {
      const int h = hq / group;
      const float* qr = q.data() + size_t{1} * (nq - w + i) * q_ld + hq * hd;
      std::vector<double> sc(n_keys, -INFINITY);
      double m = -INFINITY;
      for (int s = c.first_visible; s <= last; ++s) {
        double acc = 0;
        for (int d = 0; d < hd; ++d) acc += double{qr[d]} * kd[0][size_t{1} * s * kvd + h * hd + d];
        sc[s] = acc * scale;
        m = std::max(m, sc[s]);
      }
      double sum = 0;
      for (int s = c.first_visible; s <= last; ++s) sum += std::exp(sc[s] - m);
      for (int s = c.first_visible; s <= last; ++s) {
        const double p = std::exp(sc[s] - m) / sum;
        mref[size_t{1} * h * n_keys + s] = std::max(mref[size_t{1} * h * n_keys + s], wt * p);
        sref[size_t{1} * h * n_keys + s] += p;
      }
    }
  }
  Report(c.name + ": scores (max)", RelErr(mx_out, mref), 1e-4);
  Report(c.name + ": scores (sum)", RelErr(sum_out, sref), 1e-4);
  mem.free(kpool);
  mem.free(vpool);
}

// ---------------------------------------------------------------------------------------------
// Part 2: the bundled model against the CPU reference.

void CheckDraft(const json& ref, const std::string& path);
void CheckWorkers(const json& ref, const std::string& path);
void CheckGraphs(Backend& be, const std::string& path);

void CheckModel(Backend& be) {
  std::ifstream in(absl::GetFlag(FLAGS_reference));
  if (!in) {
    std::printf("  no --reference: skipped\n");
    g_failed = true;
    return;
  }
  const json ref = json::parse(in);
  const std::vector<int32_t> prompt = ref["prompt_ids"].get<std::vector<int32_t>>();
  const std::vector<int32_t> greedy = ref["greedy"].get<std::vector<int32_t>>();
  const std::vector<float> logits = ref["first_logits"].get<std::vector<float>>();
  absl::StatusOr<std::string> resolved = ResolveModel(absl::GetFlag(FLAGS_model));
  if (!resolved.ok()) {
    std::printf("  model: %s\n", resolved.status().ToString().c_str());
    g_failed = true;
    return;
  }
  const std::string& path = *resolved;
  absl::StatusOr<std::unique_ptr<LoadedModel>> m = LoadModel(path, be);
  if (!m.ok()) {
    std::printf("  load: %s\n", m.status().ToString().c_str());
    g_failed = true;
    return;
  }
  EagerSteps eager(be);  // the graphs are checked against these steps below
  for (KvDtype kv : {KvDtype::kF16, KvDtype::kBF16}) {
    absl::StatusOr<gpu_check::GreedyRun> run =
        gpu_check::RunGreedy<Clock>(**m, eager, prompt, static_cast<int>(greedy.size()), kv);
    if (!run.ok()) {
      std::printf("  run: %s\n", run.status().ToString().c_str());
      g_failed = true;
      return;
    }
    double num = 0, den = 0, max_abs = 0, max_ref = 0;
    for (size_t i = 0; i < logits.size(); ++i) {
      const double d = double{run->first_logits[i]} - logits[i];
      num += d * d;
      den += double{logits[i]} * logits[i];
      max_abs = std::max(max_abs, std::abs(d));
      max_ref = std::max(max_ref, std::abs(double{logits[i]}));
    }
    const double rel = std::sqrt(num / den);
    size_t same = 0;
    while (same < greedy.size() && run->tokens[same] == greedy[same]) ++same;
    const bool ok = rel <= 1e-2 && same == greedy.size();
    if (!ok) g_failed = true;
    std::printf(
        "  %-5s KV: logits rel. L2 error %.3g (max |diff| %.3g of max |logit| %.3g), "
        "greedy tokens equal %zu/%zu, prefill of %zu tokens %.2f ms  %s\n",
        KvDtypeName(kv), rel, max_abs, max_ref, same, greedy.size(), prompt.size(),
        run->prefill_s * 1e3, ok ? "ok" : "FAIL");
    Emit({{"part", "model"},
          {"kv", KvDtypeName(kv)},
          {"logits_rel_l2", rel},
          {"logits_max_abs", max_abs},
          {"greedy_equal", same},
          {"greedy_total", greedy.size()},
          {"ok", ok}});
  }
  CheckDraft(ref, path);
  CheckWorkers(ref, path);
  CheckGraphs(be, path);
}

// The draft worker's engine on the GPU against the CPU's (fp32) scores, kept positions and
// lookahead tokens.
void CheckDraft(const json& ref, const std::string& path) {
  const std::vector<int32_t> prompt = ref["prompt_ids"].get<std::vector<int32_t>>();
  const std::vector<float> scores = ref["draft"]["token_scores"].get<std::vector<float>>();
  const std::vector<int32_t> keep = ref["draft"]["keep"].get<std::vector<int32_t>>();
  const std::vector<int32_t> lookahead = ref["draft"]["lookahead"].get<std::vector<int32_t>>();
  absl::StatusOr<std::unique_ptr<Backend>> b = MakeCudaBackend();
  absl::StatusOr<std::unique_ptr<DraftEngine>> e =
      b.ok() ? DraftEngine::Create(gpu_check::DraftOptions(path), std::move(*b), KvDtype::kF16)
             : absl::StatusOr<std::unique_ptr<DraftEngine>>(b.status());
  absl::StatusOr<DraftResult> r =
      e.ok() ? (*e)->Score(gpu_check::DraftRequestFor(prompt)) : e.status();
  if (!r.ok()) {
    std::printf("  draft: %s\n", r.status().ToString().c_str());
    g_failed = true;
    return;
  }
  std::vector<double> sref(scores.begin(), scores.end());
  const double err = r->token_scores.size() == scores.size() ? RelErr(r->token_scores, sref) : 1e9;
  size_t common = 0;
  for (int32_t p : r->keep) common += std::count(keep.begin(), keep.end(), p);
  const double overlap = keep.empty() ? 0 : static_cast<double>(common) / keep.size();
  size_t same = 0;
  while (same < lookahead.size() && same < r->lookahead.size() &&
         r->lookahead[same] == lookahead[same]) {
    ++same;
  }
  const bool ok = err <= 5e-2 && overlap >= 0.9 && same == lookahead.size();
  if (!ok) g_failed = true;
  std::printf(
      "  draft engine (8-layer self-draft): token scores rel. error %.3g, kept positions "
      "shared %zu/%zu, lookahead tokens equal %zu/%zu, score pass %.2f ms  %s\n",
      err, common, keep.size(), same, lookahead.size(), r->prefill_s * 1e3, ok ? "ok" : "FAIL");
  Emit({{"part", "draft"},
        {"scores_rel_err", err},
        {"keep_overlap", overlap},
        {"lookahead_equal", same},
        {"lookahead_total", lookahead.size()},
        {"ok", ok}});
}

// The prefill and decode workers' engines on the GPU, their KV in device memory: the prefill's
// snapshot leaves through KvMemory::to_host (StagedKvLayer), the decode engine imports it through
// from_host (edge blocks read first), and its greedy tokens must be the CPU's. Then the same KV in
// a paged cache on the device: a prompt of whole blocks attached from the prefix cache copies its
// last block on the device (KvMemory::copy), and reads back as the original's bytes.
void CheckWorkers(const json& ref, const std::string& path) {
  const std::vector<int32_t> prompt = ref["prompt_ids"].get<std::vector<int32_t>>();
  const std::vector<int32_t> greedy = ref["greedy"].get<std::vector<int32_t>>();
  auto fail = [](const char* what, const absl::Status& st) {
    std::printf("  workers: %s: %s\n", what, st.ToString().c_str());
    g_failed = true;
  };
  PrefillOptions po;
  po.model_path = path;
  po.pop = PopConfig{};  // ratio 0: the full model, the exactness switch
  absl::StatusOr<std::unique_ptr<Backend>> pb = MakeCudaBackend();
  if (!pb.ok()) return fail("backend", pb.status());
  absl::StatusOr<std::unique_ptr<PrefillEngine>> pe =
      PrefillEngine::Create(po, std::move(*pb), KvDtype::kF16);
  if (!pe.ok()) return fail("prefill engine", pe.status());
  const auto t0 = Clock::now();
  absl::StatusOr<PrefillResult> pr = (*pe)->Run(prompt);
  if (!pr.ok()) return fail("prefill", pr.status());
  const double prefill_ms = std::chrono::duration<double>(Clock::now() - t0).count() * 1e3;

  DecodeEngineOptions dopt;
  dopt.model_path = path;
  dopt.kv_budget_bytes = size_t{256} << 20;
  dopt.context_tokens = 512;
  absl::StatusOr<std::unique_ptr<Backend>> db = MakeCudaBackend();
  if (!db.ok()) return fail("backend", db.status());
  absl::StatusOr<std::unique_ptr<DecodeEngine>> de =
      DecodeEngine::Create(dopt, std::move(*db), KvDtype::kF16);
  if (!de.ok()) return fail("decode engine", de.status());
  absl::StatusOr<std::vector<int32_t>> tokens =
      GreedyFromKv(**de, prompt, pr->kv, static_cast<int>(greedy.size()));
  if (!tokens.ok()) return fail("decode", tokens.status());
  size_t same = 0;
  while (same < greedy.size() && same < tokens->size() && (*tokens)[same] == greedy[same]) ++same;

  // The prefix cache's copy on the device.
  absl::StatusOr<std::unique_ptr<Backend>> cb = MakeCudaBackend();
  if (!cb.ok()) return fail("backend", cb.status());
  PagedKvOptions ko;
  ko.layout = pr->kv.layout;
  ko.budget_bytes = size_t{64} << 20;
  ko.device = (*cb)->DeviceKvMemory();
  absl::StatusOr<std::unique_ptr<PagedKvCache>> cache = PagedKvCache::Create(ko);
  if (!cache.ok()) return fail("paged cache", cache.status());
  const int32_t a = (*cache)->NewSequence(pr->kv.plan_key);
  absl::Status st = (*cache)->Import(a, pr->kv);
  if (!st.ok()) return fail("import", st);
  const int whole = pr->prefilled_tokens / 16 * 16;
  const int32_t b = (*cache)->NewSequence(pr->kv.plan_key);
  const int attached = (*cache)->AttachCachedPrefix(
      b, std::span<const int32_t>(pr->kv.token_ids.data(), static_cast<size_t>(whole)));
  absl::StatusOr<KvSnapshot> back_a = ExportSnapshot(**cache, a, whole - 1);
  absl::StatusOr<KvSnapshot> back_b = ExportSnapshot(**cache, b, whole - 1);
  if (!back_a.ok() || !back_b.ok()) return fail("export", back_a.status());
  const bool copied = attached == whole - 1 &&
                      (*cache)->Layer(b, 0).block_ids[whole / 16 - 1] !=
                          (*cache)->Layer(a, 0).block_ids[whole / 16 - 1] &&
                      back_a->k == back_b->k && back_a->v == back_b->v;
  // And the imported KV reads back as the prefill's bytes (f16 both).
  absl::StatusOr<KvSnapshot> full = ExportSnapshot(**cache, a, pr->prefilled_tokens);
  const bool round_trip = full.ok() && full->k == pr->kv.k && full->v == pr->kv.v;

  // The transfer's rows (kv_rows.cu through KvMemory::read_rows / write_rows): gathered from the
  // device blocks as the host gathers them from a host cache of the same KV, and written into
  // another sequence's blocks, read back whole.
  const int m = pr->prefilled_tokens;
  absl::StatusOr<std::unique_ptr<ContiguousKvCache>> host =
      ContiguousKvCache::Create(pr->kv.layout, 1, m);
  if (!host.ok()) return fail("host cache", host.status());
  st = WriteSnapshot(pr->kv, **host, 0);
  if (!st.ok()) return fail("host cache", st);
  const int32_t w = (*cache)->NewSequence(pr->kv.plan_key);
  if (!(*cache)->EnsureCapacity(w, m)) return fail("rows", absl::ResourceExhaustedError("blocks"));
  bool rows_ok = true;
  const int L = pr->kv.layout.n_layers;
  auto rows_bytes = [&](int n) {
    const KvLayout& l = pr->kv.layout;
    return 2 * size_t{1} * l.n_kv_heads * n * KvRowBytes(l.dtype, l.head_dim);
  };
  for (const auto& [s0, s1] : std::vector<std::pair<int, int>>{{0, m}, {5, 37}, {17, 18}}) {
    if (s1 > m) continue;
    for (int layer = 0; layer < L; ++layer) {
      const size_t bytes = rows_bytes(s1 - s0);
      std::vector<uint8_t> want(bytes), got(bytes);
      ReadLayerRows(**host, 0, layer, s0, s1, want.data());
      ReadLayerRows(**cache, a, layer, s0, s1, got.data());
      rows_ok = rows_ok && want == got;
    }
  }
  for (int layer = 0; layer < L; ++layer) {
    for (const auto& [s0, s1] : std::vector<std::pair<int, int>>{{0, 20}, {20, m}}) {
      if (s0 >= s1) continue;
      std::vector<uint8_t> rows(rows_bytes(s1 - s0));
      ReadLayerRows(**host, 0, layer, s0, s1, rows.data());
      WriteLayerRows(rows.data(), **cache, w, layer, s0, s1);  // the second starts mid-block
    }
  }
  absl::StatusOr<KvSnapshot> written = ExportSnapshot(**cache, w, m);
  rows_ok = rows_ok && written.ok() && written->k == pr->kv.k && written->v == pr->kv.v;

  // What a KV link does at its two ends (one GPU cannot hold both ranks of an NCCL communicator,
  // so the send itself is not checked here): rows gathered into a device buffer, their
  // KvLinkHash on the device against the host's, and the buffer scattered into blocks.
  const KvMemory& mem = *(*cache)->memory();
  bool link_ok = true;
  {
    const size_t bytes = rows_bytes(m);
    uint8_t* dev = mem.alloc(bytes);
    for (int layer = 0; layer < L && dev != nullptr; ++layer) {
      std::vector<uint8_t> want(bytes), got(bytes);
      ReadLayerRows(**host, 0, layer, 0, m, want.data());
      mem.gather_rows((*cache)->Layer(a, layer), pr->kv.layout.n_kv_heads, pr->kv.layout.head_dim,
                      0, m, dev);
      mem.to_host(got.data(), dev, bytes);
      link_ok = link_ok && got == want && mem.hash(dev, bytes) == KvLinkHash(want.data(), bytes);
      mem.scatter_rows(dev, pr->kv.layout.n_kv_heads, pr->kv.layout.head_dim, 0, m,
                       (*cache)->Layer(w, layer));
    }
    if (dev == nullptr)
      link_ok = false;
    else
      mem.free(dev);
    absl::StatusOr<KvSnapshot> again = ExportSnapshot(**cache, w, m);
    link_ok = link_ok && again.ok() && again->k == pr->kv.k && again->v == pr->kv.v;
  }
  const bool ok = same == greedy.size() && copied && round_trip && rows_ok && link_ok;
  if (!ok) g_failed = true;
  std::printf(
      "  workers (prefill and decode engines, KV in device memory): greedy tokens equal %zu/%zu, "
      "snapshot round trip %s, prefix-cache block copy %s (%d of %d slots attached), transfer "
      "rows gathered and scattered on the device %s, KV link ends (device rows and hash) %s, "
      "prefill of %zu tokens %.2f ms  %s\n",
      same, greedy.size(), round_trip ? "same bytes" : "DIFFERS", copied ? "same bytes" : "DIFFERS",
      attached, whole, rows_ok ? "same bytes" : "DIFFER", link_ok ? "same" : "DIFFER",
      prompt.size(), prefill_ms, ok ? "ok" : "FAIL");
  Emit({{"part", "workers"},
        {"greedy_equal", same},
        {"greedy_total", greedy.size()},
        {"snapshot_round_trip", round_trip},
        {"prefix_copy", copied},
        {"device_rows", rows_ok},
        {"link_ends", link_ok},
        {"ok", ok}});
}

// Decode steps replayed as CUDA graphs against the same steps launched op by op, in lockstep on
// one model and backend (two caches): the same kernels on the same inputs, so the logits should
// agree bit for bit, and the greedy tokens must. The cases take the graphs' paths: a split count
// that changes mid-run (a new graph), split attention's scratch, paged block tables that grow,
// and more than 8 rows (cuBLAS in the graph).
void CheckGraphs(Backend& be, const std::string& path) {
  absl::StatusOr<std::unique_ptr<LoadedModel>> loaded = LoadModel(path, be);
  if (!loaded.ok()) {
    std::printf("  graphs: load: %s\n", loaded.status().ToString().c_str());
    g_failed = true;
    return;
  }
  const LoadedModel& m = **loaded;
  const ModelConfig& c = m.config;
  const ForwardPlan plan = ForwardPlan::Full(c.n_layers);
  EagerSteps eager(be);
  struct Case {
    const char* name;
    bool paged;
    std::vector<int> prompts;
  };
  const std::vector<Case> cases = {
      {"batch 1, contiguous, splits 1 -> 2", false, {100}},
      {"batch 3, contiguous, split attention", false, {150, 200, 260}},
      {"batch 12, paged, cuBLAS rows", true, {20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120, 130}},
  };
  const int steps = 40;
  std::mt19937 g(17);
  for (const Case& k : cases) {
    const int B = static_cast<int>(k.prompts.size());
    const int longest = *std::max_element(k.prompts.begin(), k.prompts.end());
    const KvLayout layout{c.n_layers, c.n_kv_heads, c.head_dim, KvDtype::kF16};
    std::unique_ptr<KvStore> store[2];
    PagedKvCache* paged[2] = {nullptr, nullptr};
    std::vector<int32_t> seq[2];
    bool setup_ok = true;
    for (int i = 0; i < 2; ++i) {
      if (k.paged) {
        PagedKvOptions ko;
        ko.layout = layout;
        ko.budget_bytes = size_t{256} << 20;
        ko.device = be.DeviceKvMemory();
        absl::StatusOr<std::unique_ptr<PagedKvCache>> pc = PagedKvCache::Create(ko);
        if (!pc.ok()) {
          setup_ok = false;
          break;
        }
        for (int b = 0; b < B; ++b) seq[i].push_back((*pc)->NewSequence(0));
        paged[i] = pc->get();
        store[i] = std::move(*pc);
      } else {
        absl::StatusOr<std::unique_ptr<ContiguousKvCache>> cc =
            ContiguousKvCache::Create(layout, B, longest + steps + 1, be.DeviceKvMemory());
        if (!cc.ok()) {
          setup_ok = false;
          break;
        }
        for (int b = 0; b < B; ++b) seq[i].push_back(b);
        store[i] = std::move(*cc);
      }
    }
    if (!setup_ok) {
      std::printf("  graphs, %s: no cache\n", k.name);
      g_failed = true;
      continue;
    }
    Backend* run_on[2] = {&eager, &be};
    ForwardWorkspace ws0(eager), ws1(be);
    ForwardWorkspace* ws[2] = {&ws0, &ws1};
    std::vector<std::vector<int32_t>> prompts(B);
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < k.prompts[b]; ++t) {
        prompts[b].push_back(static_cast<int32_t>(g() % c.vocab_size));
      }
    }
    std::vector<float> logits[2];
    absl::Status st;
    for (int i = 0; i < 2 && st.ok(); ++i) {
      StepBatch pre;
      for (int b = 0; b < B; ++b) {
        if (paged[i] != nullptr) paged[i]->EnsureCapacity(seq[i][b], k.prompts[b]);
        pre.AddSequence(seq[i][b], prompts[b].data(), k.prompts[b], 0, 0, true);
      }
      st = Forward(m, *run_on[i], plan, pre, *store[i], *ws[i], &logits[i]);
    }
    const CudaGraphStats before = GetCudaGraphStats(be);
    std::vector<int32_t> next(B);
    std::vector<int> pos(k.prompts);
    auto argmax_rows = [&](const std::vector<float>& l) {
      std::vector<int32_t> t(B);
      for (int b = 0; b < B; ++b) {
        const float* row = l.data() + size_t{1} * b * c.vocab_size;
        t[b] = static_cast<int32_t>(std::max_element(row, row + c.vocab_size) - row);
      }
      return t;
    };
    if (st.ok()) next = argmax_rows(logits[0]);
    int exact = 0, tokens_equal = 0;
    double max_rel = 0;
    for (int step = 0; step < steps && st.ok(); ++step) {
      for (int i = 0; i < 2 && st.ok(); ++i) {
        StepBatch sb;
        for (int b = 0; b < B; ++b) {
          if (paged[i] != nullptr) paged[i]->EnsureCapacity(seq[i][b], pos[b] + 1);
          sb.AddSequence(seq[i][b], &next[b], 1, pos[b], pos[b], true);
        }
        st = Forward(m, *run_on[i], plan, sb, *store[i], *ws[i], &logits[i]);
      }
      if (!st.ok()) break;
      double num = 0, den = 0;
      for (size_t j = 0; j < logits[0].size(); ++j) {
        num = std::max(num, std::abs(double{logits[1][j]} - logits[0][j]));
        den = std::max(den, std::abs(double{logits[0][j]}));
      }
      max_rel = std::max(max_rel, num / (den > 0 ? den : 1));
      exact += logits[0] == logits[1];
      const std::vector<int32_t> t0 = argmax_rows(logits[0]), t1 = argmax_rows(logits[1]);
      tokens_equal += t0 == t1;
      next = t0;
      for (int b = 0; b < B; ++b) ++pos[b];
    }
    const CudaGraphStats after = GetCudaGraphStats(be);
    const int64_t replays = after.replays - before.replays;
    const int64_t captures = after.captures - before.captures;
    const int64_t runs = after.runs - before.runs;
    // A new graph costs one step run op by op and one captured: a few per case at most.
    const bool ok = st.ok() && tokens_equal == steps && max_rel <= 1e-5 && replays >= steps - 6;
    if (!ok) g_failed = true;
    std::printf(
        "  graphs, %-38s %d steps: logits bit-identical %d/%d (max rel. diff %.3g), tokens equal "
        "%d/%d; %lld replayed, %lld captured, %lld op by op%s  %s\n",
        k.name, steps, exact, steps, max_rel, tokens_equal, steps, static_cast<long long>(replays),
        static_cast<long long>(captures), static_cast<long long>(runs),
        st.ok() ? "" : (" (" + st.ToString() + ")").c_str(), ok ? "ok" : "FAIL");
    Emit({{"part", "graphs"},
          {"case", k.name},
          {"steps", steps},
          {"bit_identical", exact},
          {"max_rel_diff", max_rel},
          {"tokens_equal", tokens_equal},
          {"replays", replays},
          {"captures", captures},
          {"runs", runs},
          {"ok", ok}});
  }
}

// ---------------------------------------------------------------------------------------------
// Part 3: Llama-3.1-8B's shape with random weights.

struct ShapeModel {
  std::deque<GgufTensorInfo> tensors;
  std::vector<float> ones;

  const GgufTensorInfo* Matrix(const std::string& name, int64_t rows, int64_t cols) {
    GgufTensorInfo& t = tensors.emplace_back();
    t.name = name;
    t.dims = {cols, rows};
    t.type = GgmlType::kBF16;
    t.n_elements = static_cast<uint64_t>(rows * cols);
    t.n_bytes = t.n_elements * 2;
    t.data = nullptr;  // no bytes: the backend makes seeded random values
    return &t;
  }
  const GgufTensorInfo* Norm(const std::string& name, int64_t n) {
    if (ones.size() < static_cast<size_t>(n)) ones.assign(n, 1.0f);
    GgufTensorInfo& t = tensors.emplace_back();
    t.name = name;
    t.dims = {n};
    t.type = GgmlType::kF32;
    t.n_elements = static_cast<uint64_t>(n);
    t.n_bytes = t.n_elements * 4;
    t.data = reinterpret_cast<const uint8_t*>(ones.data());
    return &t;
  }
};

ModelConfig Llama8BConfig() {
  ModelConfig c;
  c.arch_name = "llama";
  c.n_layers = 32;
  c.d_model = 4096;
  c.n_heads = 32;
  c.n_kv_heads = 8;
  c.head_dim = 128;
  c.d_ff = 14336;
  c.vocab_size = 128256;
  c.context_length = 131072;
  c.rope_dims = 128;
  c.rope_theta = 500000.0f;
  c.rope_scaling.llama3 = true;
  c.rope_scaling.factor = 8.0f;
  c.rope_scaling.low_freq_factor = 1.0f;
  c.rope_scaling.high_freq_factor = 4.0f;
  c.rope_scaling.original_context = 8192;
  c.rms_eps = 1e-5f;
  return c;
}

absl::StatusOr<std::unique_ptr<LoadedModel>> ShapeOnly(Backend& be, ShapeModel& sm,
                                                       const WeightSelection& sel) {
  auto m = std::make_unique<LoadedModel>();
  m->config = Llama8BConfig();
  const ModelConfig& c = m->config;
  m->selection = sel;
  ModelWeights& w = m->weights;
  w.token_embd.tensor = sm.Matrix("token_embd", c.vocab_size, c.d_model);
  w.output_norm.tensor = sm.Norm("output_norm", c.d_model);
  w.output.tensor = sm.Matrix("output", c.vocab_size, c.d_model);
  w.layers.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    LayerWeights& lw = w.layers[l];
    lw.attn_norm.tensor = sm.Norm("attn_norm", c.d_model);
    lw.ffn_norm.tensor = sm.Norm("ffn_norm", c.d_model);
    lw.wq.tensor = sm.Matrix("wq", c.q_dim(), c.d_model);
    lw.wk.tensor = sm.Matrix("wk", c.kv_dim(), c.d_model);
    lw.wv.tensor = sm.Matrix("wv", c.kv_dim(), c.d_model);
    lw.wo.tensor = sm.Matrix("wo", c.d_model, c.q_dim());
    lw.w_gate.tensor = sm.Matrix("w_gate", c.d_ff, c.d_model);
    lw.w_up.tensor = sm.Matrix("w_up", c.d_ff, c.d_model);
    lw.w_down.tensor = sm.Matrix("w_down", c.d_model, c.d_ff);
  }
  RETURN_IF_ERROR(PrepareModel(*m, be));
  return m;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median seconds of one prefill of T tokens under `plan` (no head), into a fresh cache.
absl::StatusOr<double> TimePrefill(const LoadedModel& m, Backend& be, const ForwardPlan& plan,
                                   int T, int reps) {
  const ModelConfig& c = m.config;
  KvLayout layout{c.n_layers, c.n_kv_heads, c.head_dim, KvDtype::kF16};
  ASSIGN_OR_RETURN(auto kv, ContiguousKvCache::Create(layout, 1, T + 16, be.DeviceKvMemory()));
  ForwardWorkspace ws(be);
  std::vector<int32_t> ids(T);
  std::mt19937 g(7);
  for (int32_t& id : ids) id = static_cast<int32_t>(g() % c.vocab_size);
  StepBatch batch;
  batch.AddSequence(0, ids.data(), T, 0, 0, false);
  std::vector<double> times;
  for (int r = 0; r <= reps; ++r) {  // the first is the warm-up
    const auto t0 = Clock::now();
    RETURN_IF_ERROR(Forward(m, be, plan, batch, *kv, ws, nullptr));
    be.Synchronize();
    if (r > 0) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return Median(times);
}

#if TRIPOD_HAVE_CUDA
double CopyBandwidth() {  // bytes read + written per second, device to device
  const size_t bytes = size_t{2} << 30;
  void *a = nullptr, *b = nullptr;
  cudaMalloc(&a, bytes);
  cudaMalloc(&b, bytes);
  cudaMemset(a, 1, bytes);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
  cudaEventRecord(e0);
  for (int i = 0; i < 5; ++i) cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * bytes * 5 / (ms * 1e-3);
}

// cuBLAS alone on [m, k] x [n, k]^T, bf16 in, fp32 out (the backend's GEMM without its
// activation conversion): median seconds.
double RawGemm(int m, int n, int k, int reps) {
  uint16_t *w = nullptr, *x = nullptr;
  float* y = nullptr;
  cudaMalloc(&w, size_t{2} * n * k);
  cudaMalloc(&x, size_t{2} * m * k);
  cudaMalloc(&y, size_t{4} * m * n);
  cuda::FillRandomBf16(w, int64_t{n} * k, 1, 0.02f, nullptr);
  cuda::FillRandomBf16(x, int64_t{m} * k, 2, 1.0f, nullptr);
  cublasHandle_t h;
  cublasCreate(&h);
  const float alpha = 1, beta = 0;
  std::vector<double> times;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (int r = 0; r <= reps; ++r) {
    cudaEventRecord(e0);
    cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w, CUDA_R_16BF, k, x, CUDA_R_16BF, k,
                 &beta, y, CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (r > 0) times.push_back(ms * 1e-3);
  }
  cublasDestroy(h);
  cudaFree(w);
  cudaFree(x);
  cudaFree(y);
  return Median(times);
}
#endif

absl::Status BigModel(Backend& be) {
  const int reps = absl::GetFlag(FLAGS_reps);
  const ModelConfig c = Llama8BConfig();
  PopConfig pop;
  pop.ratio = 1.0 / 3;
  ASSIGN_OR_RETURN(std::vector<int> skipped, SkippedLayers(pop, c.n_layers));

  ShapeModel sm;
  auto t0 = Clock::now();
  ASSIGN_OR_RETURN(std::unique_ptr<LoadedModel> full, ShapeOnly(be, sm, WeightSelection{}));
  be.Synchronize();
  std::printf("  full model prepared: %.1f GB of bf16 weights in %.1f s\n",
              full->resident_weight_bytes() / 1e9,
              std::chrono::duration<double>(Clock::now() - t0).count());
  WeightSelection psel;
  psel.layers.assign(c.n_layers, LayerNeed::kFull);
  for (int l : skipped) psel.layers[l] = LayerNeed::kKvOnly;
  psel.output_head = false;
  ASSIGN_OR_RETURN(std::unique_ptr<LoadedModel> popm, ShapeOnly(be, sm, psel));
  std::printf("  POP model: %zu of %d layers K/V-only (%s), %.1f GB\n", skipped.size(), c.n_layers,
              DescribeSkipped(skipped, c.n_layers).c_str(), popm->resident_weight_bytes() / 1e9);

  std::printf("\n  %-28s %10s %10s %9s\n", "prefill (Llama-3.1-8B shape)", "full ms", "POP ms",
              "speed-up");
  const ForwardPlan full_plan = ForwardPlan::Full(c.n_layers);
  const ForwardPlan pop_plan = ForwardPlan::PopPrefill(c.n_layers, skipped);
  for (int T : {512, 2048}) {
    ASSIGN_OR_RETURN(double tf, TimePrefill(*full, be, full_plan, T, reps));
    ASSIGN_OR_RETURN(double tp, TimePrefill(*popm, be, pop_plan, T, reps));
    std::printf("  %-28s %10.2f %10.2f %8.2fx\n", absl::StrCat(T, " tokens").c_str(), tf * 1e3,
                tp * 1e3, tf / tp);
    Emit({{"part", "prefill"},
          {"tokens", T},
          {"full_s", tf},
          {"pop_s", tp},
          {"speedup", tf / tp},
          {"full_tokens_per_s", T / tf}});
  }
  {
    std::printf("\n  prefill of 2048 tokens (full), per op:\n");
    std::fflush(stdout);
    std::unique_ptr<Backend> prof = MakeSynchronizedProfile(be, stdout);
    RETURN_IF_ERROR(TimePrefill(*full, *prof, full_plan, 2048, 1).status());
  }
  popm.reset();

#if TRIPOD_HAVE_CUDA
  const double copy_bw = CopyBandwidth();
#else
  const double copy_bw = 0;
#endif
  // Decode: 32 sequences of 128 prompt tokens, then steps of 1 and of 32 sequences.
  {
    const int n_seqs = 32, prompt = 128, steps = 12;
    KvLayout layout{c.n_layers, c.n_kv_heads, c.head_dim, KvDtype::kF16};
    ASSIGN_OR_RETURN(auto kv, ContiguousKvCache::Create(layout, n_seqs, prompt + 6 * steps,
                                                        be.DeviceKvMemory()));
    ForwardWorkspace ws(be);
    std::vector<int32_t> ids(size_t{1} * n_seqs * prompt);
    std::mt19937 g(11);
    for (int32_t& id : ids) id = static_cast<int32_t>(g() % c.vocab_size);
    StepBatch pre;
    for (int s = 0; s < n_seqs; ++s)
      pre.AddSequence(s, ids.data() + s * prompt, prompt, 0, 0, false);
    RETURN_IF_ERROR(Forward(*full, be, full_plan, pre, *kv, ws, nullptr));
    std::vector<int32_t> pos(n_seqs, prompt);
    const size_t weight_bytes =
        full->resident_weight_bytes() - full->weights.token_embd.tensor->n_bytes;
    std::printf("\n  %-28s %10s %10s %12s %12s\n", "decode (logits to host)", "ms/step", "tokens/s",
                "weights GB/s", "of copy bw");
    // Op by op, then as graphs (steps 0 and 1 of these run and capture, untimed).
    EagerSteps eager(be);
    const CudaGraphStats before = GetCudaGraphStats(be);
    for (int B : {1, 32}) {
      for (bool graphs : {false, true}) {
        Backend& on = graphs ? be : static_cast<Backend&>(eager);
        std::vector<double> times;
        std::vector<float> logits;
        for (int st = 0; st < steps; ++st) {
          StepBatch step;
          std::vector<int32_t> tok(B);
          for (int s = 0; s < B; ++s) tok[s] = static_cast<int32_t>(g() % c.vocab_size);
          for (int s = 0; s < B; ++s) step.AddSequence(s, &tok[s], 1, pos[s], pos[s], true);
          const auto t1 = Clock::now();
          RETURN_IF_ERROR(Forward(*full, on, full_plan, step, *kv, ws, &logits));
          if (st >= 2) times.push_back(std::chrono::duration<double>(Clock::now() - t1).count());
          for (int s = 0; s < B; ++s) ++pos[s];
        }
        const double t = Median(times);
        const double bw = weight_bytes / t;
        std::printf("  %-28s %10.2f %10.1f %12.0f %11.0f%%\n",
                    absl::StrCat("batch ", B, graphs ? ", CUDA graph" : "").c_str(), t * 1e3, B / t,
                    bw / 1e9, copy_bw > 0 ? 100 * bw / copy_bw : 0.0);
        Emit({{"part", "decode"},
              {"batch", B},
              {"graphs", graphs},
              {"step_s", t},
              {"tokens_per_s", B / t},
              {"weight_bytes", weight_bytes},
              {"weights_bytes_per_s", bw},
              {"copy_bytes_per_s", copy_bw}});
      }
    }
    const CudaGraphStats after = GetCudaGraphStats(be);
    std::printf("  graph steps: %lld replayed, %lld captured, %lld op by op\n",
                static_cast<long long>(after.replays - before.replays),
                static_cast<long long>(after.captures - before.captures),
                static_cast<long long>(after.runs - before.runs));
    // Where a step's time goes: each op timed alone (the waits between ops add to the total).
    for (int B : {1, 32}) {
      std::printf("\n  decode step, batch %d, 3 steps, per op:\n", B);
      std::fflush(stdout);
      std::unique_ptr<Backend> prof = MakeSynchronizedProfile(be, stdout);
      std::vector<float> logits;
      for (int st = 0; st < 3; ++st) {
        StepBatch step;
        std::vector<int32_t> tok(B, 1);
        for (int s = 0; s < B; ++s) step.AddSequence(s, &tok[s], 1, pos[s], pos[s], true);
        RETURN_IF_ERROR(Forward(*full, *prof, full_plan, step, *kv, ws, &logits));
        for (int s = 0; s < B; ++s) ++pos[s];
      }
    }
    std::printf("  device-to-device copy: %.0f GB/s (read + written)\n", copy_bw / 1e9);
  }

  // Prefill GEMMs through the backend (with its bf16 conversion) against cuBLAS alone.
  std::printf("\n  %-28s %10s %10s %10s %8s\n", "GEMM, 2048 rows", "ours TF/s", "cuBLAS TF/s",
              "ours ms", "share");
  struct Shape {
    const char* name;
    int n, k;
  };
  const Shape shapes[] = {{"q|k|v 6144x4096", c.q_dim() + 2 * c.kv_dim(), c.d_model},
                          {"o 4096x4096", c.d_model, c.q_dim()},
                          {"gate|up 28672x4096", 2 * c.d_ff, c.d_model},
                          {"down 4096x14336", c.d_model, c.d_ff}};
  const int m = 2048;
  ShapeModel gm;
  for (const Shape& s : shapes) {
    const GgufTensorInfo* parts[] = {gm.Matrix(s.name, s.n, s.k)};
    ASSIGN_OR_RETURN(std::unique_ptr<PreparedMatrix> w, be.PrepareMatrix(parts));
    Dev x(be, Random(size_t{1} * m * s.k, 13)), y(be, size_t{1} * m * s.n);
    std::vector<double> times;
    for (int r = 0; r <= 2 * reps; ++r) {
      be.Synchronize();
      const auto t1 = Clock::now();
      be.Linear(*w, x.p, m, s.k, y.p, s.n, false);
      be.Synchronize();
      if (r > 0) times.push_back(std::chrono::duration<double>(Clock::now() - t1).count());
    }
    const double ours = Median(times), flops = 2.0 * m * s.n * s.k;
#if TRIPOD_HAVE_CUDA
    const double raw = RawGemm(m, s.n, s.k, 2 * reps);
#else
    const double raw = ours;
#endif
    std::printf("  %-28s %10.0f %10.0f %10.3f %7.0f%%\n", s.name, flops / ours / 1e12,
                flops / raw / 1e12, ours * 1e3, 100 * raw / ours);
    Emit({{"part", "gemm"},
          {"shape", s.name},
          {"m", m},
          {"n", s.n},
          {"k", s.k},
          {"ours_s", ours},
          {"cublas_s", raw},
          {"share", raw / ours}});
  }
  return absl::OkStatus();
}

int Main() {
  std::ofstream out;
  if (!absl::GetFlag(FLAGS_out).empty()) {
    out.open(absl::GetFlag(FLAGS_out));
    g_out = &out;
  }
  // Graphs on: decode steps that Forward marks run as graphs; the ops checked one by one, and
  // the steps run through EagerSteps, run as on a backend without them.
  CudaBackendOptions options;
  options.graphs = true;
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeCudaBackend(options);
  if (!backend.ok()) {
    std::printf("gpu_check: %s\n", backend.status().ToString().c_str());
    return 2;
  }
  Backend& be = **backend;
  std::printf("device: %s\n\n1. ops against the host\n", be.name().c_str());
  Emit({{"part", "device"}, {"name", be.name()}});
  CheckLinear(be);
  CheckElementwise(be);
  const AttnCase cases[] = {
      {"hd64 9/3 f16 prefill 100", 64, 9, 3, KvDtype::kF16, 16, false, {{0, 100}}},
      {"hd128 32/8 bf16 paged decode x3",
       128,
       32,
       8,
       KvDtype::kBF16,
       16,
       true,
       {{37, 1}, {200, 1}, {5, 1}}},
      {"hd128 32/8 f16 paged bt32 chunk", 128, 32, 8, KvDtype::kF16, 32, true, {{64, 70}}},
      {"hd64 9/3 f32 first_visible 20", 64, 9, 3, KvDtype::kF32, 16, false, {{40, 30}}, 20},
      {"hd64 9/3 f16 paged bt24 (rows)", 64, 9, 3, KvDtype::kF16, 24, true, {{10, 50}, {3, 2}}},
      {"hd128 32/8 bf16 paged prefill x2",
       128,
       32,
       8,
       KvDtype::kBF16,
       16,
       true,
       {{30, 80}, {0, 17}}},
      {"hd128 32/8 f16 long prefill 300", 128, 32, 8, KvDtype::kF16, 16, false, {{200, 300}}},
  };
  for (const AttnCase& c : cases) CheckAttention(be, c);
  std::printf("\n2. bundled model against the CPU's fp32 reference\n");
  CheckModel(be);
  if (absl::GetFlag(FLAGS_big)) {
    std::printf("\n3. Llama-3.1-8B shape, random weights\n");
    if (absl::Status s = BigModel(be); !s.ok()) {
      std::printf("  %s\n", s.ToString().c_str());
      g_failed = true;
    }
  }
  std::printf("\n%s\n", g_failed ? "gpu_check: FAILED" : "gpu_check: all checks passed");
  return g_failed ? 1 : 0;
}

}  // namespace
}  // namespace tripod

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tripod::Main();
}
