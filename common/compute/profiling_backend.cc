// ProfilingBackend; see profiling_backend.h.
#include "common/compute/profiling_backend.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"

namespace tripod {
namespace {

using Clock = std::chrono::steady_clock;

struct OpTotals {
  int64_t calls = 0;
  int64_t rows = 0;
  double seconds = 0;
};

// The time between one op's end and the next op's start, in three classes: under 1 ms is the
// host's own work inside a step (sampling, batch assembly, the KV manager), up to 1 s mostly
// waiting on another process or thread within a burst (a transfer, a core lent away), beyond
// that idle. A served process's busy share over a burst is its op time over op time plus the
// first two classes.
struct GapTotals {
  static constexpr double kStepGap = 1e-3, kIdleGap = 1.0;
  int64_t count[3] = {0, 0, 0};
  double seconds[3] = {0, 0, 0};
  void Add(double s) {
    const int c = s < kStepGap ? 0 : s < kIdleGap ? 1 : 2;
    ++count[c];
    seconds[c] += s;
  }
};

class ProfilingBackend final : public Backend {
 public:
  ProfilingBackend(std::unique_ptr<Backend> inner, std::FILE* out, bool synchronize)
      : owned_(std::move(inner)), inner_(owned_.get()), out_(out), synchronize_(synchronize) {}
  ProfilingBackend(Backend& inner, std::FILE* out, bool synchronize)
      : inner_(&inner), out_(out), synchronize_(synchronize) {}

  ~ProfilingBackend() override { Print(); }

  std::string name() const override { return inner_->name() + " (profiled)"; }
  float* Alloc(size_t floats) override { return inner_->Alloc(floats); }
  void Free(float* p) override { inner_->Free(p); }

  absl::StatusOr<std::unique_ptr<PreparedMatrix>> PrepareMatrix(
      std::span<const GgufTensorInfo* const> parts) override {
    return inner_->PrepareMatrix(parts);
  }
  bool CopiesWeights() const override { return inner_->CopiesWeights(); }
  bool CopiesTensor(const GgufTensorInfo& t) const override { return inner_->CopiesTensor(t); }
  absl::StatusOr<std::unique_ptr<PreparedVector>> PrepareVector(
      const GgufTensorInfo& tensor) override {
    return inner_->PrepareVector(tensor);
  }
  absl::StatusOr<std::unique_ptr<PreparedMatrix>> PrepareScaledMatrix(
      std::span<const GgufTensorInfo* const> parts,
      std::span<const float* const> col_scales) override {
    return inner_->PrepareScaledMatrix(parts, col_scales);
  }

  void Embed(const GgufTensorInfo& table, std::span<const int32_t> ids, float* out,
             int64_t ld_out) override {
    Timed("embed", static_cast<int64_t>(ids.size()),
          [&] { inner_->Embed(table, ids, out, ld_out); });
  }
  void RmsNorm(const float* x, int64_t ldx, const PreparedVector& w, int m, int n, float eps,
               float* y, int64_t ldy) override {
    Timed("rms_norm", m, [&] { inner_->RmsNorm(x, ldx, w, m, n, eps, y, ldy); });
  }
  void Linear(const PreparedMatrix& w, const float* x, int m, int64_t ldx, float* y, int64_t ldy,
              bool accumulate) override {
    // Decode-sized and prefill-sized calls apart: they run different kernels.
    const std::string key =
        absl::StrCat("linear ", w.n(), "x", w.k(), m <= 16 ? " m<=16" : " m>16");
    Timed(key, m, [&] { inner_->Linear(w, x, m, ldx, y, ldy, accumulate); });
  }
  void AddBias(float* x, int64_t ldx, const PreparedVector& b, int m, int n) override {
    Timed("add_bias", m, [&] { inner_->AddBias(x, ldx, b, m, n); });
  }
  void AddScaled(const float* x, int64_t ldx, float alpha, int m, int n, float* y,
                 int64_t ldy) override {
    Timed("add_scaled", m, [&] { inner_->AddScaled(x, ldx, alpha, m, n, y, ldy); });
  }
  void Rope(float* x, int64_t ldx, int m, int n_heads, int head_dim,
            const RopeAngles& angles) override {
    Timed("rope", m, [&] { inner_->Rope(x, ldx, m, n_heads, head_dim, angles); });
  }
  void SwiGlu(const float* gu, int64_t ldgu, int m, int n, float* out, int64_t ldo) override {
    Timed("swiglu", m, [&] { inner_->SwiGlu(gu, ldgu, m, n, out, ldo); });
  }
  void GatherRows(const float* src, int64_t lds, std::span<const int32_t> src_rows, int n,
                  float* dst, int64_t ldd) override {
    Timed("gather_rows", static_cast<int64_t>(src_rows.size()),
          [&] { inner_->GatherRows(src, lds, src_rows, n, dst, ldd); });
  }
  void WriteKv(const float* k, const float* v, int m, int64_t ld, int n_kv_heads, int head_dim,
               const KvLayerRef& kv, int64_t slot_begin) override {
    Timed("write_kv", m,
          [&] { inner_->WriteKv(k, v, m, ld, n_kv_heads, head_dim, kv, slot_begin); });
  }
  void Attention(std::span<const AttentionArgs> seqs) override {
    int64_t rows = 0;
    for (const AttentionArgs& a : seqs) rows += a.n_q;
    // Batches of single-token queries (decode steps) apart from the rest.
    const bool decode = rows == static_cast<int64_t>(seqs.size());
    Timed(decode ? "attention decode" : "attention prefill", rows,
          [&] { inner_->Attention(seqs); });
  }
  void AttentionScores(std::span<const AttentionScoreArgs> seqs) override {
    int64_t rows = 0;
    for (const AttentionScoreArgs& a : seqs) rows += a.n_q;
    Timed("attention scores", rows, [&] { inner_->AttentionScores(seqs); });
  }
  void ToHost(const float* src, size_t n, float* host_dst) override {
    Timed("to_host", 1, [&] { inner_->ToHost(src, n, host_dst); });
  }
  void FromHost(const float* host_src, size_t n, float* dst) override {
    Timed("from_host", 1, [&] { inner_->FromHost(host_src, n, dst); });
  }
  std::optional<KvMemory> DeviceKvMemory() override { return inner_->DeviceKvMemory(); }
  void Synchronize() override { inner_->Synchronize(); }
  // BeginGraphStep is not passed on: every op runs, and is timed, as it is called.
  absl::Status Supports(const ModelConfig& config, KvDtype kv) const override {
    return inner_->Supports(config, kv);
  }

 private:
  template <class F>
  void Timed(const std::string& op, int64_t rows, F&& f) {
    if (synchronize_) inner_->Synchronize();
    const Clock::time_point t0 = Clock::now();
    if (any_op_) gaps_.Add(std::chrono::duration<double>(t0 - last_end_).count());
    f();
    if (synchronize_) inner_->Synchronize();
    last_end_ = Clock::now();
    any_op_ = true;
    OpTotals& t = totals_[op];
    t.seconds += std::chrono::duration<double>(last_end_ - t0).count();
    ++t.calls;
    t.rows += rows;
  }

  void Print() const {
    std::vector<std::pair<std::string, OpTotals>> rows(totals_.begin(), totals_.end());
    std::sort(rows.begin(), rows.end(),
              [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
    double total = 0;
    for (const auto& [op, t] : rows) total += t.seconds;
    // The process is named by its logger (tripod-prefill, tripod-decode, ...) and pid, so that
    // the tables of `tripod serve`'s workers, which share one stderr, can be told apart; the table
    // goes out in one write so that they do not interleave.
    std::string text = absl::StrFormat(
        "TRIPOD_PROFILE %s: %.3f s in backend ops [%s pid %d]\n"
        "  between ops: %.3f s in %lld gaps under 1 ms, %.3f s in %lld of 1 ms to 1 s, %.3f s in "
        "%lld over 1 s\n",
        inner_->name(), total, spdlog::default_logger()->name(), static_cast<int>(getpid()),
        gaps_.seconds[0], static_cast<long long>(gaps_.count[0]), gaps_.seconds[1],
        static_cast<long long>(gaps_.count[1]), gaps_.seconds[2],
        static_cast<long long>(gaps_.count[2]));
    absl::StrAppendFormat(&text, "  %-34s %10s %12s %11s %6s\n", "op", "calls", "rows", "total ms",
                          "share");
    for (const auto& [op, t] : rows) {
      absl::StrAppendFormat(&text, "  %-34s %10d %12d %11.1f %5.1f%%\n", op, t.calls, t.rows,
                            1e3 * t.seconds, total > 0 ? 100.0 * t.seconds / total : 0.0);
    }
    std::fwrite(text.data(), 1, text.size(), out_);
    std::fflush(out_);
  }

  std::unique_ptr<Backend> owned_;  // null for a view of a backend owned elsewhere
  Backend* inner_;
  std::FILE* out_;
  bool synchronize_;
  std::map<std::string, OpTotals> totals_;
  GapTotals gaps_;
  bool any_op_ = false;
  Clock::time_point last_end_;
};

}  // namespace

std::unique_ptr<Backend> MakeProfilingBackend(std::unique_ptr<Backend> inner, std::FILE* out) {
  return std::make_unique<ProfilingBackend>(std::move(inner), out, /*synchronize=*/false);
}

std::unique_ptr<Backend> MakeSynchronizedProfile(Backend& inner, std::FILE* out) {
  return std::make_unique<ProfilingBackend>(inner, out, /*synchronize=*/true);
}

std::unique_ptr<Backend> MaybeProfile(std::unique_ptr<Backend> inner) {
  const char* env = std::getenv("TRIPOD_PROFILE");
  if (env == nullptr || env[0] == 0 || std::strcmp(env, "0") == 0) return inner;
  return MakeProfilingBackend(std::move(inner));
}

}  // namespace tripod
