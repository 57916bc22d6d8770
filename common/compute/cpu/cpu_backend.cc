// CPU Backend implementation; see cpu_backend.h. Elementwise loops are plain C++ that the
// compiler vectorises (target_clones picks AVX-512 / AVX2 at run time); the heavy kernels
// (GEMV, GEMM, attention) have their own files.
#include "common/compute/cpu/cpu_backend.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/compute/cpu/attention.h"
#include "common/compute/cpu/cpu_features.h"
#include "common/compute/cpu/quant_gemv_internal.h"
#include "common/util/huge_pages.h"
#include "common/util/log.h"
#include "common/util/status_macros.h"
#include "common/util/thread_pool.h"

namespace tripod {
namespace {

#define TRIPOD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

// Weight rows per StreamedGemm tile, in bytes of the GEMM's input type: the tile stays in L2 while
// oneDNN sweeps x over it.
constexpr int64_t kStreamTileBytes = 1 << 20;

class CpuMatrix final : public PreparedMatrix {
 public:
  std::vector<QuantPart> parts;  // stacked along n: part p is output rows [col, col + q.n)
  // Where the parts' bytes live when they were copied out of the GGUF (the backend's weight
  // arena, on huge pages); null while they point into the mapping.
  std::shared_ptr<HugePageArena> arena;
  // Per part, [k] input-column scales (folded norm weight); empty: none.
  std::vector<std::vector<float>> col_scales;
  int64_t n_ = 0, k_ = 0;
  GemmPrecision precision = GemmPrecision::kF32;
  mutable std::once_flag gemm_once;
  mutable std::unique_ptr<DnnlLinear> gemm;  // prepacked on first large-batch use
  mutable absl::Status gemm_status;
  // Scaled matrices exist only in GEMM form: small batches use the GEMM too, and the GGUF bytes
  // are not read after preparation. The others are multiplied from their quantised bytes at every
  // batch size (large batches: StreamedGemm, a tile of rows dequantised at a time).
  bool gemm_only = false;
  // Every part a K-quant, Q5_0 or Q5_1 (CpuBackendOptions::gemv_max_rows_kquant applies).
  bool kquant = false;

  int64_t n() const override { return n_; }
  int64_t k() const override { return k_; }
  size_t resident_bytes() const override {
    size_t b = 0;
    if (!gemm_only) {
      for (const QuantPart& p : parts) b += p.q.row_bytes * p.q.n;
    }
    if (gemm) b += gemm->packed_bytes();
    return b;
  }

  // Dequantises the parts to fp32 and has oneDNN prepack them, once.
  absl::Status EnsureGemm() const {
    std::call_once(gemm_once, [this] {
      std::vector<float> w(static_cast<size_t>(n_) * k_);
      ParallelFor(n_, [&](int64_t r0, int64_t r1) {
        std::vector<uint8_t> bytes;
        for (size_t pi = 0; pi < parts.size(); ++pi) {
          const QuantPart& p = parts[pi];
          const std::vector<float>& scale = col_scales[pi];
          const int64_t end = std::min(r1, p.col + p.q.n);
          bytes.resize(p.q.row_bytes);
          for (int64_t r = std::max(r0, p.col); r < end; ++r) {
            float* row = w.data() + r * k_;
            DequantizeRow(p.q.type, GgufRow(p.q, r - p.col, bytes.data()), row, k_);
            if (!scale.empty()) {
              for (int64_t j = 0; j < k_; ++j) row[j] *= scale[j];
            }
          }
        }
      });
      auto g = DnnlLinear::Create(w.data(), n_, k_, precision);
      if (g.ok()) {
        gemm = std::move(g).value();
      } else {
        gemm_status = g.status();
      }
    });
    return gemm_status;
  }

  const DnnlLinear& Gemm() const {
    if (absl::Status s = EnsureGemm(); !s.ok()) {
      // Only reachable without prepack_at_load, where preparation errors surface at first use.
      Logger("compute.cpu").critical("GEMM preparation failed: {}", s.ToString());
      std::abort();
    }
    return *gemm;
  }
};

class CpuVector final : public PreparedVector {
 public:
  std::vector<float> v;
  int64_t size() const override { return static_cast<int64_t>(v.size()); }
  const float* data() const override { return v.data(); }
};

TRIPOD_CLONES void RmsNormRow(const float* x, const float* w, int n, float eps, float* y) {
  float ss = 0;
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  const float scale = 1.0f / std::sqrt(ss / n + eps);
  for (int i = 0; i < n; ++i) y[i] = x[i] * scale * w[i];
}

// silu(g) * u with e^-g computed inline so that the loop vectorises (libm's expf is one call per
// element: a few ms per step of a 16-sequence decode batch). e^x by Cody-Waite reduction to
// [-ln2/2, ln2/2] and a degree-6 polynomial (Cephes' expf coefficients), about 2 ulp; x is
// clamped to [-87, 88], where silu is already g or 0 to fp32 precision.
TRIPOD_CLONES void SwiGluRow(const float* g, const float* u, int n, float* out) {
  for (int i = 0; i < n; ++i) {
    const float x = std::min(std::max(-g[i], -87.0f), 88.0f);
    // Round x * log2(e) to the nearest integer by the 1.5 * 2^23 shift.
    const float fx = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - fx * 0.693359375f;
    r = r - fx * -2.12194440e-4f;
    float y = 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * (r * r) + (r + 1.0f);
    const float pow2 =
        std::bit_cast<float>(static_cast<uint32_t>(static_cast<int32_t>(fx) + 127) << 23);
    // One division: written as g / (1 + e) * u, GCC also divided g by the clamped bounds' e
    // and blended, and vdivps dominated (docs/cpu-kernels.md, "SwiGLU with one division").
    out[i] = g[i] * u[i] / (1.0f + y * pow2);
  }
}

TRIPOD_CLONES void AddRow(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void RopeRow(float* x, int n_heads, int head_dim, const float* c, const float* s, int rope_dims,
             bool halves) {
  const int half = rope_dims / 2;
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + h * head_dim;
    if (halves) {
      for (int i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * c[i] - b * s[i];
        v[i + half] = a * s[i] + b * c[i];
      }
    } else {
      for (int i = 0; i < half; ++i) {
        const float a = v[2 * i], b = v[2 * i + 1];
        v[2 * i] = a * c[i] - b * s[i];
        v[2 * i + 1] = a * s[i] + b * c[i];
      }
    }
  }
}

// Rows per ParallelFor chunk for row-wise elementwise ops: enough work to pay for a fork.
int64_t RowGrain(int64_t row_floats) { return std::max<int64_t>(1, 16384 / (row_floats + 1)); }

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& o)
      : opts_(o), arena_(std::make_shared<HugePageArena>()) {
    auto g = DnnlPlainGemm::Create(o.gemm);
    if (!g.ok() && o.gemm == GemmPrecision::kBF16) g = DnnlPlainGemm::Create(GemmPrecision::kF32);
    if (g.ok()) plain_gemm_ = std::move(g).value();
  }

  // y = x W^T for a large batch from W's quantised bytes: kStreamTileBytes of W's rows at a time
  // are dequantised (by the vector dequantisers, on the compute threads) into a tile in the GEMM's
  // input type, which oneDNN multiplies from its plain layout. No wider copy of W is kept; a tile
  // is reused for all m rows of x, so the dequantisation costs 1 / m of the GEMM's work per weight.
  void StreamedGemm(const CpuMatrix& w, const float* x, int m, int64_t ldx, float* y, int64_t ldy) {
    const int64_t n = w.n_, k = w.k_;
    const bool bf16 = plain_gemm_->precision() == GemmPrecision::kBF16;
    const void* src = x;
    int64_t ld_src = ldx;
    if (bf16) {
      xb_.resize(static_cast<size_t>(m) * k);
      ConvertRowsCpu(x, m, ldx, static_cast<int>(k), KvDtype::kBF16,
                     reinterpret_cast<uint8_t*>(xb_.data()), k * 2);
      src = xb_.data();
      ld_src = k;
    }
    const int64_t elem = bf16 ? 2 : 4;
    const int64_t nt = std::clamp<int64_t>(kStreamTileBytes / (k * elem) / 16 * 16, 16, n);
    // With AVX512_BF16 each row goes to bf16 straight from an L1 row (no fp32 tile in L2).
    const bool direct_bf16 =
        bf16 && ActiveIsa() >= IsaLevel::kAvx512 && GetCpuFeatures().avx512bf16;
    if (!direct_bf16) tile_f32_.resize(static_cast<size_t>(nt) * k);
    if (bf16) tile_bf16_.resize(static_cast<size_t>(nt) * k);
    for (int64_t j0 = 0; j0 < n; j0 += nt) {
      const int64_t rows = std::min(nt, n - j0);
      ParallelFor(
          rows,
          [&](int64_t r0, int64_t r1) {
            thread_local std::vector<float> row;
            if (direct_bf16) row.resize(k);
            for (int64_t r = r0; r < r1; ++r) {
              const int64_t j = j0 + r;
              size_t p = 0;
              while (p + 1 < w.parts.size() && j >= w.parts[p + 1].col) ++p;
              float* out = direct_bf16 ? row.data() : tile_f32_.data() + r * k;
              DequantizeMatrixRow(w.parts[p].q, j - w.parts[p].col, out);
              if (direct_bf16) qgemv::avx512::ConvertActBf16(out, 1, k, k, &tile_bf16_[r * k]);
            }
          },
          4);
      const void* tile = direct_bf16 ? static_cast<const void*>(tile_bf16_.data())
                                     : static_cast<const void*>(tile_f32_.data());
      if (bf16 && !direct_bf16) {
        ConvertRowsCpu(tile_f32_.data(), rows, k, static_cast<int>(k), KvDtype::kBF16,
                       reinterpret_cast<uint8_t*>(tile_bf16_.data()), k * 2);
        tile = tile_bf16_.data();
      }
      plain_gemm_->Run(src, m, ld_src, tile, rows, k, k, y + j0, ldy);
    }
  }

  std::string name() const override {
    std::string few;
    if (opts_.gemv_few_rows != opts_.gemv) {
      few =
          absl::StrCat(" (", GemvModeName(opts_.gemv_few_rows), " below ", kBf16MinRows, " rows)");
    }
    if (opts_.gemv_tile_min_rows > 0) {
      absl::StrAppend(&few, " (", GemvModeName(GemvMode::kF32Tile), " from ",
                      opts_.gemv_tile_min_rows, " to ", opts_.gemv_max_rows, " rows)");
    }
    return absl::StrCat("cpu(", IsaName(ActiveIsa()), ", gemm ",
                        opts_.gemm == GemmPrecision::kBF16 ? "bf16" : "fp32", ", gemv ",
                        GemvModeName(opts_.gemv), few, ")");
  }

  float* Alloc(size_t floats) override {
    const size_t bytes = (std::max<size_t>(floats, 16) * sizeof(float) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, bytes);
    if (p == nullptr) {
      Logger("compute.cpu").critical("out of memory allocating {} bytes", bytes);
      std::abort();
    }
    return static_cast<float*>(p);
  }
  void Free(float* p) override { std::free(p); }

  absl::StatusOr<std::unique_ptr<PreparedMatrix>> PrepareMatrix(
      std::span<const GgufTensorInfo* const> parts) override {
    ASSIGN_OR_RETURN(std::unique_ptr<PreparedMatrix> m, PrepareUnpacked(parts));
    auto& cm = static_cast<CpuMatrix&>(*m);
    // The GEMVs stream these bytes every decode step: copy them onto huge pages (see
    // huge_pages.h for why and by how much).
    // Q4_0, Q4_1 and Q8_0 are copied with their rows interleaved in the kernels' row groups, so
    // a decode GEMV reads one stream per thread, which the prefetchers follow (docs/cpu-kernels.md,
    // "Interleaved weight rows").
    // The other types are read in place from the file's mapping, whose pages the workers of one
    // host share (the K-quant kernels read the GGUF layout).
    for (QuantPart& p : cm.parts) {
      if (!CanInterleave(p.q)) continue;
      const size_t bytes = static_cast<size_t>(p.q.row_bytes) * p.q.n;
      ASSIGN_OR_RETURN(uint8_t * copy, arena_->Allocate(bytes));
      InterleaveRows(p.q, copy);
      p.q.interleave = kInterleaveRows;
      p.q.data = copy;
      cm.arena = arena_;
    }
    if (opts_.prepack_at_load && plain_gemm_ == nullptr) RETURN_IF_ERROR(cm.EnsureGemm());
    return m;
  }

  bool CopiesWeights() const override { return true; }
  bool CopiesTensor(const GgufTensorInfo& t) const override {
    const QuantMatrix q{t.type, t.data, t.rows(), t.cols(),
                        static_cast<int64_t>(RowBytes(t.type, t.cols()).value_or(0))};
    return t.dims.size() == 2 && CanInterleave(q);
  }

  // The parts bound as quantised blocks, the GEMM form not yet built.
  absl::StatusOr<std::unique_ptr<PreparedMatrix>> PrepareUnpacked(
      std::span<const GgufTensorInfo* const> parts) {
    auto m = std::make_unique<CpuMatrix>();
    m->precision = opts_.gemm;
    for (const GgufTensorInfo* t : parts) {
      if (t->dims.size() != 2) {
        return absl::InvalidArgumentError(absl::StrCat("tensor ", t->name, " is not a matrix"));
      }
      if (m->k_ != 0 && t->cols() != m->k_) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor ", t->name, " has ", t->cols(), " columns, expected ", m->k_));
      }
      m->k_ = t->cols();
      ASSIGN_OR_RETURN(size_t row_bytes, RowBytes(t->type, t->cols()));
      QuantMatrix q{t->type, t->data, t->rows(), t->cols(), static_cast<int64_t>(row_bytes)};
      m->parts.push_back({q, m->n_});
      m->col_scales.emplace_back();
      m->n_ += t->rows();
    }
    m->kquant = std::all_of(m->parts.begin(), m->parts.end(),
                            [](const QuantPart& p) { return qgemv::IsIntBlockType(p.q.type); });
    return std::unique_ptr<PreparedMatrix>(std::move(m));
  }

  absl::StatusOr<std::unique_ptr<PreparedMatrix>> PrepareScaledMatrix(
      std::span<const GgufTensorInfo* const> parts,
      std::span<const float* const> col_scales) override {
    if (col_scales.size() != parts.size()) {
      return absl::InvalidArgumentError("scaled matrix: one column-scale vector per part");
    }
    ASSIGN_OR_RETURN(std::unique_ptr<PreparedMatrix> pm, PrepareUnpacked(parts));
    auto* m = static_cast<CpuMatrix*>(pm.get());
    for (size_t i = 0; i < parts.size(); ++i) {
      if (col_scales[i] == nullptr) return absl::InvalidArgumentError("scaled matrix: null scale");
      m->col_scales[i].assign(col_scales[i], col_scales[i] + m->k_);
    }
    m->gemm_only = true;
    // Always prepared now: the GEMM form is the only form it has.
    RETURN_IF_ERROR(m->EnsureGemm());
    return pm;
  }

  absl::StatusOr<std::unique_ptr<PreparedVector>> PrepareVector(const GgufTensorInfo& t) override {
    auto v = std::make_unique<CpuVector>();
    v->v.resize(t.n_elements);
    ASSIGN_OR_RETURN(size_t bytes, RowBytes(t.type, static_cast<int64_t>(t.n_elements)));
    if (bytes != t.n_bytes) return absl::InvalidArgumentError("vector size mismatch");
    DequantizeRow(t.type, t.data, v->v.data(), static_cast<int64_t>(t.n_elements));
    return std::unique_ptr<PreparedVector>(std::move(v));
  }

  void Embed(const GgufTensorInfo& table, std::span<const int32_t> ids, float* out,
             int64_t ld) override {
    const int64_t d = table.cols();
    const size_t row_bytes = *RowBytes(table.type, d);
    ParallelFor(
        static_cast<int64_t>(ids.size()),
        [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) {
            DequantizeRow(table.type, table.data + row_bytes * ids[i], out + i * ld, d);
          }
        },
        64);
  }

  void RmsNorm(const float* x, int64_t ldx, const PreparedVector& w, int m, int n, float eps,
               float* y, int64_t ldy) override {
    ParallelFor(
        m,
        [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) RmsNormRow(x + i * ldx, w.data(), n, eps, y + i * ldy);
        },
        RowGrain(n));
  }

  void Linear(const PreparedMatrix& pw, const float* x, int m, int64_t ldx, float* y, int64_t ldy,
              bool accumulate) override {
    const auto& w = static_cast<const CpuMatrix&>(pw);
    const int max_rows = w.kquant && opts_.gemv_max_rows_kquant > 0 ? opts_.gemv_max_rows_kquant
                                                                    : opts_.gemv_max_rows;
    if ((m <= max_rows || opts_.batch_invariant) && !w.gemm_only) {
      // Slabs of rows keep x in L2 while the weights stream by; a row's result is the same in
      // any slab (the GEMV kernels' per-row arithmetic does not depend on m). All parts, and
      // the accumulation, in one parallel region per slab.
      constexpr int kSlab = 64;
      for (int i0 = 0; i0 < m; i0 += kSlab) {
        const int mi = std::min(kSlab, m - i0);
        const GemvMode mode = mi < kBf16MinRows ? opts_.gemv_few_rows
                              : opts_.gemv_tile_min_rows > 0 && mi >= opts_.gemv_tile_min_rows
                                  ? GemvMode::kF32Tile
                                  : opts_.gemv;
        QuantGemm(w.parts, x + int64_t{i0} * ldx, mi, ldx, y + int64_t{i0} * ldy, ldy, mode,
                  accumulate);
      }
      return;
    }
    float* dst = y;
    int64_t ldd = ldy;
    if (accumulate) {
      tmp_.resize(static_cast<size_t>(m) * w.n_);
      dst = tmp_.data();
      ldd = w.n_;
    }
    if (w.gemm_only || plain_gemm_ == nullptr) {
      w.Gemm().Run(x, m, ldx, dst, ldd);
    } else {
      StreamedGemm(w, x, m, ldx, dst, ldd);
    }
    if (accumulate) {
      ParallelFor(
          m,
          [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) AddRow(y + i * ldy, dst + i * ldd, w.n_);
          },
          RowGrain(w.n_));
    }
  }

  void AddBias(float* x, int64_t ldx, const PreparedVector& b, int m, int n) override {
    for (int i = 0; i < m; ++i) AddRow(x + int64_t{i} * ldx, b.data(), n);
  }

  void AddScaled(const float* x, int64_t ldx, float alpha, int m, int n, float* y,
                 int64_t ldy) override {
    for (int i = 0; i < m; ++i) {
      const float* xr = x + int64_t{i} * ldx;
      float* yr = y + int64_t{i} * ldy;
      for (int j = 0; j < n; ++j) yr[j] += alpha * xr[j];
    }
  }

  void Rope(float* x, int64_t ldx, int m, int n_heads, int head_dim, const RopeAngles& a) override {
    const int half = a.rope_dims / 2;
    ParallelFor(
        m,
        [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) {
            RopeRow(x + i * ldx, n_heads, head_dim, a.cos + i * half, a.sin + i * half, a.rope_dims,
                    a.halves);
          }
        },
        RowGrain(n_heads * head_dim));
  }

  void SwiGlu(const float* gu, int64_t ldgu, int m, int n, float* out, int64_t ldo) override {
    ParallelFor(
        m,
        [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i)
            SwiGluRow(gu + i * ldgu, gu + i * ldgu + n, n, out + i * ldo);
        },
        RowGrain(n));
  }

  void GatherRows(const float* src, int64_t lds, std::span<const int32_t> rows, int n, float* dst,
                  int64_t ldd) override {
    for (size_t i = 0; i < rows.size(); ++i) {
      std::memcpy(dst + i * ldd, src + int64_t{rows[i]} * lds, sizeof(float) * n);
    }
  }

  void WriteKv(const float* k, const float* v, int m, int64_t ld, int n_kv_heads, int head_dim,
               const KvLayerRef& kv, int64_t slot_begin) override {
    WriteKvCpu(k, v, m, ld, n_kv_heads, head_dim, kv, slot_begin);
  }

  void AttentionScores(std::span<const AttentionScoreArgs> seqs) override {
    AttentionScoresCpu(seqs);
  }

  void Attention(std::span<const AttentionArgs> seqs) override {
    if (!opts_.batch_invariant) return AttentionCpu(seqs);
    invariant_args_.assign(seqs.begin(), seqs.end());
    for (AttentionArgs& a : invariant_args_) a.batch_invariant = true;
    AttentionCpu(invariant_args_);
  }

  void ToHost(const float* src, size_t n, float* dst) override {
    std::memcpy(dst, src, n * sizeof(float));
  }
  void FromHost(const float* src, size_t n, float* dst) override {
    std::memcpy(dst, src, n * sizeof(float));
  }

 private:
  CpuBackendOptions opts_;
  std::shared_ptr<HugePageArena> arena_;  // PrepareMatrix's weight copies
  std::vector<float> tmp_;  // Linear's accumulate scratch: one forward at a time per backend
  std::vector<AttentionArgs> invariant_args_;  // Attention's copy of the args (batch_invariant)
  // StreamedGemm: the plain-weights GEMM (null where oneDNN has none: prepacked copies then), x in
  // bf16, and the weight tile (fp32, and bf16 for a bf16 GEMM). One forward at a time.
  std::unique_ptr<DnnlPlainGemm> plain_gemm_;
  std::vector<uint16_t> xb_, tile_bf16_;
  std::vector<float> tile_f32_;
};

}  // namespace

// With bf16 GEMMs, batches of more than 8 rows go to oneDNN: from there its prepacked bf16
// weights beat the bf16 GEMV, up to there the GEMV is ahead (docs/cpu-kernels.md, "bf16 GEMV or
// oneDNN by row count").
constexpr int kBf16GemvMaxRows = 8;
// K-quants, Q5_0 and Q5_1: the bf16 GEMV up to 32 rows, before the streamed GEMM, which
// dequantises the whole matrix on every call.
constexpr int kBf16GemvMaxRowsKQuant = 32;

// Without bf16 hardware: the fp32 tile GEMV from 13 rows (int16 below), and up to 64 rows
// rather than oneDNN's fp32 GEMM, whose fp32 weights read 8 times the bytes; below 13 rows int16
// is faster (docs/cpu-kernels.md, "The fp32 tile GEMV's row range").
constexpr int kTileGemvMinRows = 13;
constexpr int kTileGemvMaxRows = 64;

absl::StatusOr<CpuBackendOptions> CpuOptionsForPrecision(std::string_view precision) {
  // What the kernels may use: the CPU's features under SetIsaCap's cap, so that a capped run
  // (bench/decode --isa avx2) picks what an AVX2-only CPU would.
  CpuFeatures f = GetCpuFeatures();
  if (ActiveIsa() < IsaLevel::kAmx) f.amx_bf16 = false;
  if (ActiveIsa() < IsaLevel::kAvx512) f.avx512bf16 = false;
  const bool bf16_hw = f.amx_bf16 || f.avx512bf16;
  CpuBackendOptions o;
  if (precision == "fp32") return o;
  o.kv = KvDtype::kF16;
  if (precision == "auto") {
    // Prefill gains from bf16 only where the CPU multiplies bf16 fast: AMX, or AVX512_BF16 dot
    // products at least at the fp32 FMAs' rate (bf16_dot_fast; Intel's run at half of it, so
    // there, without AMX, oneDNN's fp32 GEMM is 1.8x its bf16 one). Decode: 1-3 rows take int16
    // activations (about twice as fast as fp32 per weight block, so one core keeps up with DRAM,
    // and with 2^-16 of a block's range as x's error); 4-8 rows the bf16 GEMV where bf16 dots
    // are fast, which shares each block's conversion among the rows (with the bf16 GEMM's
    // rounding); larger batches the bf16 GEMM. With AMX but slow bf16 dots, int16 in the
    // GEMV's place (1.8x the bf16 GEMV at 4 rows on such a core). Without either, int16 up to
    // 12 rows and the fp32 tile GEMV from 13 to 64 (see kTileGemvMinRows).
    const bool bf16_dot = f.avx512bf16 && f.bf16_dot_fast;  // under the ISA cap
    const bool bf16_gemm = f.amx_bf16 || bf16_dot;
    if (bf16_gemm) o.gemm = GemmPrecision::kBF16;
    o.gemv = bf16_dot ? GemvMode::kBf16 : GemvMode::kInt16;
    o.gemv_few_rows = GemvMode::kInt16;
    if (bf16_gemm) {
      o.gemv_max_rows = kBf16GemvMaxRows;
      if (f.avx512bf16) o.gemv_max_rows_kquant = kBf16GemvMaxRowsKQuant;
    } else if (ActiveIsa() >= IsaLevel::kAvx2) {
      o.gemv_tile_min_rows = kTileGemvMinRows;
      o.gemv_max_rows = kTileGemvMaxRows;
    }
    return o;
  }
  if (precision == "int8") {
    o.gemv = o.gemv_few_rows = GemvMode::kInt8;
    return o;
  }
  if (precision == "int16") {
    o.gemv = o.gemv_few_rows = GemvMode::kInt16;
    return o;
  }
  if (precision == "bf16") {
    if (!bf16_hw) {
      return absl::FailedPreconditionError(
          "precision bf16 needs AMX or AVX512_BF16, which this CPU lacks; use int16 or auto");
    }
    o.gemm = GemmPrecision::kBF16;
    o.gemv = f.avx512bf16 ? GemvMode::kBf16 : GemvMode::kInt16;
    o.gemv_few_rows = GemvMode::kInt16;
    o.gemv_max_rows = kBf16GemvMaxRows;
    if (f.avx512bf16) o.gemv_max_rows_kquant = kBf16GemvMaxRowsKQuant;
    return o;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown precision '", std::string(precision),
                                                 "' (expected fp32, bf16, int8, int16 or auto)"));
}

std::unique_ptr<Backend> MakeCpuBackend(const CpuBackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

}  // namespace tripod
