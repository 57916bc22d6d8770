// The Backend interface: prepared weights and the dozen ops the forward pass is made of.
// The forward pass (forward.cc) calls only these; a CPU backend runs them now, a CUDA backend
// can implement the same table later. Activations are fp32 rows, row-major, in memory the
// backend allocated (Alloc); shapes are [rows, columns] with an explicit row stride.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "common/compute/cpu/attention.h"
#include "common/compute/cpu/attention_scores.h"
#include "common/kv/kv_layout.h"
#include "common/kv/kv_memory.h"
#include "common/model/gguf.h"
#include "common/model/model_config.h"

namespace tripod {

// A weight matrix [n, k] (n output features) prepared for Linear. It may be the concatenation
// of several GGUF tensors along n (Q|K|V, gate|up), so that one GEMM computes them all.
class PreparedMatrix {
 public:
  virtual ~PreparedMatrix() = default;
  virtual int64_t n() const = 0;
  virtual int64_t k() const = 0;
  virtual size_t resident_bytes() const = 0;  // memory this backend holds for it
};

// A weight vector (norm weights, biases) as fp32.
class PreparedVector {
 public:
  virtual ~PreparedVector() = default;
  virtual int64_t size() const = 0;
  virtual const float* data() const = 0;
};

// RoPE angles of one batch: for each row, cos and sin of position * inv_freq[i], i < rope_dims/2.
struct RopeAngles {
  const float* cos = nullptr;  // [rows, rope_dims / 2]
  const float* sin = nullptr;
  int rope_dims = 0;
  bool halves = false;  // RopeStyle::kHalves (NeoX) pairing; else adjacent pairs
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // Activation memory. Alloc never returns null (aborts on exhaustion).
  virtual float* Alloc(size_t floats) = 0;
  virtual void Free(float* p) = 0;

  // Weights. `parts` are stacked along n; all must have the same k.
  virtual absl::StatusOr<std::unique_ptr<PreparedMatrix>> PrepareMatrix(
      std::span<const GgufTensorInfo* const> parts) = 0;
  virtual absl::StatusOr<std::unique_ptr<PreparedVector>> PrepareVector(
      const GgufTensorInfo& tensor) = 0;
  // True if PrepareMatrix copies the tensors' bytes (the caller may then release the file's
  // pages of them).
  virtual bool CopiesWeights() const { return false; }
  // Whether PrepareMatrix copies this tensor's bytes (some backends copy only some types).
  virtual bool CopiesTensor(const GgufTensorInfo& tensor) const { return CopiesWeights(); }
  // Like PrepareMatrix, with the input columns of part p scaled: W'[:, j] = W[:, j] *
  // col_scales[p][j] (k floats each), so that a norm weight folds into the matrix. Meant for
  // large-batch GEMMs (POP's stacked K/V projection); a backend may keep it in its GEMM form
  // only. Backends without it return Unimplemented and callers fall back to unscaled parts.
  virtual absl::StatusOr<std::unique_ptr<PreparedMatrix>> PrepareScaledMatrix(
      std::span<const GgufTensorInfo* const> parts, std::span<const float* const> col_scales) {
    return absl::UnimplementedError("this backend has no scaled matrices");
  }

  // out[i, :] = row ids[i] of the table [vocab, d] (dequantised).
  virtual void Embed(const GgufTensorInfo& table, std::span<const int32_t> ids, float* out,
                     int64_t ld_out) = 0;
  // y[i, :] = x[i, :] / rms(x[i, :]) * w  over rows i < m of width n. y may equal x.
  virtual void RmsNorm(const float* x, int64_t ldx, const PreparedVector& w, int m, int n,
                       float eps, float* y, int64_t ldy) = 0;
  // y[m, n] = x[m, k] * W^T (+ y when accumulate).
  virtual void Linear(const PreparedMatrix& w, const float* x, int m, int64_t ldx, float* y,
                      int64_t ldy, bool accumulate) = 0;
  // x[i, :n] += b over m rows.
  virtual void AddBias(float* x, int64_t ldx, const PreparedVector& b, int m, int n) = 0;
  // y[i, :n] += alpha * x[i, :n] over m rows.
  virtual void AddScaled(const float* x, int64_t ldx, float alpha, int m, int n, float* y,
                         int64_t ldy) = 0;
  // Rotates the first rope_dims of each of n_heads heads (head_dim apart) in each row.
  virtual void Rope(float* x, int64_t ldx, int m, int n_heads, int head_dim,
                    const RopeAngles& angles) = 0;
  // out[i, j] = silu(gate[i, j]) * up[i, j]; gate and up are the two halves of gu's rows.
  virtual void SwiGlu(const float* gu, int64_t ldgu, int m, int n, float* out, int64_t ldo) = 0;
  // Copies rows src_rows[i] of src to row i of dst.
  virtual void GatherRows(const float* src, int64_t lds, std::span<const int32_t> src_rows, int n,
                          float* dst, int64_t ldd) = 0;
  // K/V rows into cache slots, and attention over the cache (see cpu/attention.h for the
  // argument meaning; pointers are this backend's memory).
  virtual void WriteKv(const float* k, const float* v, int m, int64_t ld, int n_kv_heads,
                       int head_dim, const KvLayerRef& kv, int64_t slot_begin) = 0;
  virtual void Attention(std::span<const AttentionArgs> seqs) = 0;
  // Attention probabilities of a window of queries, reduced per KV head and key (draft scoring;
  // see cpu/attention_scores.h). Outputs are host memory.
  virtual void AttentionScores(std::span<const AttentionScoreArgs> seqs) = 0;
  // Copies n floats from backend memory to host memory (logits out).
  virtual void ToHost(const float* src, size_t n, float* host_dst) = 0;
  // Copies n floats from host memory to backend memory (RoPE angles in). The host memory may be
  // reused as soon as the call returns.
  virtual void FromHost(const float* host_src, size_t n, float* dst) = 0;
  // Waits until every op enqueued so far has finished (for timing; the CPU's ops are
  // synchronous).
  virtual void Synchronize() {}
  // The ops from here to the next ToHost (or Synchronize) are one decode step, which a backend
  // may record and replay as a whole (the CUDA backend's graphs). Said by Forward for batches of
  // one token per sequence; the ops' meaning is unchanged, only when they run.
  virtual void BeginGraphStep() {}
  // Where KV stores for this backend keep their bytes: nullopt for host memory (the CPU), else
  // the backend's own (device) memory, which the kernels read through KvLayerRef. Host code must
  // not touch K/V bytes of such a store.
  virtual std::optional<KvMemory> DeviceKvMemory() { return std::nullopt; }
  // Whether this backend runs `config` with K/V stored as `kv` (the CUDA kernels cover some head
  // sizes and KV types only): an error naming what it lacks.
  virtual absl::Status Supports(const ModelConfig& config, KvDtype kv) const {
    return absl::OkStatus();
  }
};

}  // namespace tripod
