// ForwardingBackend: a Backend that hands every op to another one, for decorators that change a
// few (the guarded KV backend moves the KV ops' refs; guarded_kv_backend.h).
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>

#include "common/compute/backend.h"

namespace tripod {

class ForwardingBackend : public Backend {
 public:
  // `inner` must outlive this backend.
  explicit ForwardingBackend(Backend& inner) : inner_(inner) {}

  std::string name() const override { return inner_.name(); }
  float* Alloc(size_t floats) override { return inner_.Alloc(floats); }
  void Free(float* p) override { inner_.Free(p); }
  absl::StatusOr<std::unique_ptr<PreparedMatrix>> PrepareMatrix(
      std::span<const GgufTensorInfo* const> parts) override {
    return inner_.PrepareMatrix(parts);
  }
  absl::StatusOr<std::unique_ptr<PreparedVector>> PrepareVector(
      const GgufTensorInfo& tensor) override {
    return inner_.PrepareVector(tensor);
  }
  bool CopiesWeights() const override { return inner_.CopiesWeights(); }
  bool CopiesTensor(const GgufTensorInfo& t) const override { return inner_.CopiesTensor(t); }
  absl::StatusOr<std::unique_ptr<PreparedMatrix>> PrepareScaledMatrix(
      std::span<const GgufTensorInfo* const> parts,
      std::span<const float* const> col_scales) override {
    return inner_.PrepareScaledMatrix(parts, col_scales);
  }
  void Embed(const GgufTensorInfo& table, std::span<const int32_t> ids, float* out,
             int64_t ld_out) override {
    inner_.Embed(table, ids, out, ld_out);
  }
  void RmsNorm(const float* x, int64_t ldx, const PreparedVector& w, int m, int n, float eps,
               float* y, int64_t ldy) override {
    inner_.RmsNorm(x, ldx, w, m, n, eps, y, ldy);
  }
  void Linear(const PreparedMatrix& w, const float* x, int m, int64_t ldx, float* y, int64_t ldy,
              bool accumulate) override {
    inner_.Linear(w, x, m, ldx, y, ldy, accumulate);
  }
  void AddBias(float* x, int64_t ldx, const PreparedVector& b, int m, int n) override {
    inner_.AddBias(x, ldx, b, m, n);
  }
  void AddScaled(const float* x, int64_t ldx, float alpha, int m, int n, float* y,
                 int64_t ldy) override {
    inner_.AddScaled(x, ldx, alpha, m, n, y, ldy);
  }
  void Rope(float* x, int64_t ldx, int m, int n_heads, int head_dim,
            const RopeAngles& angles) override {
    inner_.Rope(x, ldx, m, n_heads, head_dim, angles);
  }
  void SwiGlu(const float* gu, int64_t ldgu, int m, int n, float* out, int64_t ldo) override {
    inner_.SwiGlu(gu, ldgu, m, n, out, ldo);
  }
  void GatherRows(const float* src, int64_t lds, std::span<const int32_t> src_rows, int n,
                  float* dst, int64_t ldd) override {
    inner_.GatherRows(src, lds, src_rows, n, dst, ldd);
  }
  void WriteKv(const float* k, const float* v, int m, int64_t ld, int n_kv_heads, int head_dim,
               const KvLayerRef& kv, int64_t slot_begin) override {
    inner_.WriteKv(k, v, m, ld, n_kv_heads, head_dim, kv, slot_begin);
  }
  void Attention(std::span<const AttentionArgs> seqs) override { inner_.Attention(seqs); }
  void AttentionScores(std::span<const AttentionScoreArgs> seqs) override {
    inner_.AttentionScores(seqs);
  }
  void ToHost(const float* src, size_t n, float* host_dst) override {
    inner_.ToHost(src, n, host_dst);
  }
  void FromHost(const float* host_src, size_t n, float* dst) override {
    inner_.FromHost(host_src, n, dst);
  }
  void Synchronize() override { inner_.Synchronize(); }
  void BeginGraphStep() override { inner_.BeginGraphStep(); }
  std::optional<KvMemory> DeviceKvMemory() override { return inner_.DeviceKvMemory(); }
  absl::Status Supports(const ModelConfig& config, KvDtype kv) const override {
    return inner_.Supports(config, kv);
  }

 protected:
  Backend& inner_;
};

}  // namespace tripod
