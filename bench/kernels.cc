// Benchmark of the CPU kernels: QuantGemm GB/s (DRAM-sized working set), DnnlLinear GFLOP/s and
// attention (prefill GFLOP/s, decode time per token). Prints markdown tables.
// Usage: build/<dir>/bench/kernels [--threads=2] [--what=gemv,gemm,attn] [--seconds=0.4]
//        [--cpu_time]
#include <time.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "common/compute/cpu/attention.h"
#include "common/compute/cpu/cpu_features.h"
#include "common/compute/cpu/gemm_onednn.h"
#include "common/compute/cpu/quant_gemv.h"
#include "common/model/quant_types.h"
#include "common/util/thread_pool.h"

ABSL_FLAG(int, threads, 2, "compute threads");
ABSL_FLAG(std::string, what, "gemv,gemm,attn", "which benchmarks");
ABSL_FLAG(double, seconds, 0.4, "minimum time per measurement");
ABSL_FLAG(bool, cpu_time, false,
          "time with process CPU time / threads (for a machine shared with other jobs: leaves "
          "out time the scheduler gave to others; meaningful with --threads=1)");

namespace tripod {
namespace {

double Now() {
  if (absl::GetFlag(FLAGS_cpu_time)) {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (ts.tv_sec + ts.tv_nsec * 1e-9) / ComputeThreads();
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Seconds per call: the best of several batches, each at least `seconds` / 4 long.
template <class F>
double TimeIt(F&& f) {
  const double budget = absl::GetFlag(FLAGS_seconds);
  f();  // warm-up
  double best = 1e30;
  const double start = Now();
  while (Now() - start < budget) {
    const double t0 = Now();
    int reps = 0;
    do {
      f();
      ++reps;
    } while (Now() - t0 < budget / 8);
    best = std::min(best, (Now() - t0) / reps);
  }
  return best;
}

std::vector<uint8_t> RandomMatrix(GgmlType type, int64_t n, int64_t k, std::mt19937& rng) {
  const int64_t rb = RowBytes(type, k).value();
  std::vector<uint8_t> b(n * rb);
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  const int bb = TypeInfo(type).block_bytes;
  const uint16_t d = Fp32ToFp16(0.01f);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t blk = 0; blk < k / 32; ++blk) {
      std::memcpy(b.data() + j * rb + blk * bb, &d, 2);
      if (type == GgmlType::kQ4_1) std::memcpy(b.data() + j * rb + blk * bb + 2, &d, 2);
    }
  return b;
}

void BenchGemv() {
  std::printf("\n## QuantGemm (decode GEMV), working set ~100 MB (DRAM)\n\n");
  std::printf("| matrix | mode | isa | m | threads | us/call | GB/s (weights) |\n");
  std::printf("|---|---|---|---:|---:|---:|---:|\n");
  std::mt19937 rng(1);
  struct Shape {
    const char* name;
    GgmlType type;
    int64_t n, k;
    int copies;
  };
  const Shape shapes[] = {{"Q8_0 49152x576 (head)", GgmlType::kQ8_0, 49152, 576, 4},
                          {"Q4_1 1536x576 (gate/up)", GgmlType::kQ4_1, 1536, 576, 180},
                          {"Q4_1 576x1536 (down)", GgmlType::kQ4_1, 576, 1536, 180}};
  const int max_threads = absl::GetFlag(FLAGS_threads);
  for (const Shape& s : shapes) {
    std::vector<std::vector<uint8_t>> mats;
    for (int c = 0; c < s.copies; ++c) mats.push_back(RandomMatrix(s.type, s.n, s.k, rng));
    const int64_t rb = RowBytes(s.type, s.k).value();
    std::vector<float> x(16 * s.k), y(16 * s.n);
    for (auto& v : x) v = std::normal_distribution<float>()(rng);
    for (GemvMode mode : {GemvMode::kF32, GemvMode::kInt8}) {
      for (IsaLevel isa : {IsaLevel::kAvx2, IsaLevel::kAvx512}) {
        SetIsaCap(IsaLevel::kAmx);
        if (ActiveIsa() < isa) continue;
        SetIsaCap(isa);
        for (int m : {1, 4, 16}) {
          for (int th = 1; th <= max_threads; th *= 2) {
            SetComputeThreads(th);
            size_t c = 0;
            const double t = TimeIt([&] {
              QuantMatrix w{s.type, mats[c].data(), s.n, s.k, rb};
              QuantGemm(w, x.data(), m, s.k, y.data(), s.n, mode);
              c = (c + 1) % mats.size();
            });
            std::printf("| %s | %s | %s | %d | %d | %.1f | %.1f |\n", s.name,
                        mode == GemvMode::kF32 ? "f32" : "int8", IsaName(isa), m, th, t * 1e6,
                        s.n * rb / t / 1e9);
          }
        }
      }
    }
  }
  SetIsaCap(IsaLevel::kAmx);
  SetComputeThreads(max_threads);
}

void BenchGemm() {
  std::printf("\n## DnnlLinear (prefill GEMM), %d threads\n\n", ComputeThreads());
  std::printf("| M x N x K | precision | ms | GFLOP/s |\n|---|---|---:|---:|\n");
  std::mt19937 rng(2);
  struct Shape {
    int64_t m, n, k;
  };
  const Shape shapes[] = {{2048, 576, 576}, {2048, 1536, 576}, {2048, 576, 1536}, {512, 576, 576},
                          {512, 1536, 576}, {512, 576, 1536},  {128, 576, 576},   {128, 1536, 576},
                          {128, 576, 1536}, {16, 1536, 576},   {32, 1536, 576},   {64, 1536, 576}};
  for (GemmPrecision prec : {GemmPrecision::kF32, GemmPrecision::kBF16}) {
    for (const Shape& s : shapes) {
      std::vector<float> w(s.n * s.k), x(s.m * s.k), y(s.m * s.n);
      for (auto& v : w) v = std::normal_distribution<float>()(rng);
      for (auto& v : x) v = std::normal_distribution<float>()(rng);
      auto lin = DnnlLinear::Create(w.data(), s.n, s.k, prec);
      const char* pname = prec == GemmPrecision::kF32 ? "f32" : "bf16";
      if (!lin.ok()) {
        std::printf("| %lldx%lldx%lld | %s | - | %s |\n", (long long)s.m, (long long)s.n,
                    (long long)s.k, pname, std::string(lin.status().message()).c_str());
        break;
      }
      const double t = TimeIt([&] { (*lin)->Run(x.data(), s.m, s.k, y.data(), s.n); });
      std::printf("| %lldx%lldx%lld | %s | %.3f | %.1f |\n", (long long)s.m, (long long)s.n,
                  (long long)s.k, pname, t * 1e3, 2.0 * s.m * s.n * s.k / t / 1e9);
    }
  }
}

struct Kv {
  std::vector<uint8_t> k, v;
  std::vector<int32_t> ids{0};
  KvLayerRef ref;
};

Kv MakeKv(KvDtype dt, int n_kv, int d, int slots) {
  Kv kv;
  const size_t bytes = size_t(n_kv) * slots * d * KvDtypeBytes(dt);
  kv.k.assign(bytes, 0);
  kv.v.assign(bytes, 0);
  kv.ref = KvLayerRef{kv.k.data(), kv.v.data(), kv.ids.data(), 1, slots, bytes, dt};
  std::mt19937 rng(3);
  std::vector<float> rows(size_t(slots) * n_kv * d);
  for (auto& x : rows) x = std::normal_distribution<float>()(rng);
  WriteKvCpu(rows.data(), rows.data(), slots, n_kv * d, n_kv, d, kv.ref, 0);
  return kv;
}

const char* DtName(KvDtype dt) {
  return dt == KvDtype::kF32 ? "f32" : dt == KvDtype::kF16 ? "f16" : "bf16";
}

void BenchAttention() {
  const int H = 9, KVH = 3, D = 64;
  std::printf(
      "\n## Attention (9 heads, 3 kv heads, head_dim 64, one layer), %d threads, isa %s\n\n",
      ComputeThreads(), IsaName(ActiveIsa()));
  std::printf("| case | kv | ms (1 layer) | GFLOP/s | x30 layers ms |\n|---|---|---:|---:|---:|\n");
  std::mt19937 rng(4);
  for (KvDtype dt : {KvDtype::kF32, KvDtype::kF16, KvDtype::kBF16}) {
    for (int n : {512, 2048, 4096}) {
      Kv kv = MakeKv(dt, KVH, D, n);
      std::vector<float> q(size_t(n) * H * D), out(q.size());
      for (auto& x : q) x = std::normal_distribution<float>()(rng);
      AttentionArgs a{q.data(), H * D, n, 0, H, KVH, D, 0.125f, kv.ref, out.data(), H * D};
      const double t = TimeIt([&] { AttentionCpu(std::span<const AttentionArgs>(&a, 1)); });
      const double flop = 4.0 * D * H * n * (n + 1) / 2.0;
      std::printf("| prefill %d | %s | %.2f | %.1f | %.0f |\n", n, DtName(dt), t * 1e3,
                  flop / t / 1e9, t * 30e3);
    }
    for (int ctx : {2048, 8192}) {
      // Cycle over 30 layers' KV so decode reads from DRAM as in a real step.
      std::vector<Kv> layers;
      for (int l = 0; l < 30; ++l) layers.push_back(MakeKv(dt, KVH, D, ctx));
      std::vector<float> q(H * D), out(H * D);
      for (auto& x : q) x = std::normal_distribution<float>()(rng);
      size_t l = 0;
      const double t = TimeIt([&] {
        AttentionArgs a{q.data(), H * D,         1,          ctx - 1, H, KVH, D,
                        0.125f,   layers[l].ref, out.data(), H * D};
        AttentionCpu(std::span<const AttentionArgs>(&a, 1));
        l = (l + 1) % layers.size();
      });
      const double flop = 4.0 * D * H * ctx;
      std::printf("| decode ctx %d | %s | %.3f | %.1f | %.2f |\n", ctx, DtName(dt), t * 1e3,
                  flop / t / 1e9, t * 30e3);
    }
  }
}

}  // namespace
}  // namespace tripod

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  tripod::SetComputeThreads(absl::GetFlag(FLAGS_threads));
  const std::string what = absl::GetFlag(FLAGS_what);
  std::printf("# kernels: isa %s, %d threads\n", tripod::IsaName(tripod::ActiveIsa()),
              tripod::ComputeThreads());
  if (absl::StrContains(what, "gemv")) tripod::BenchGemv();
  if (absl::StrContains(what, "gemm")) tripod::BenchGemm();
  if (absl::StrContains(what, "attn")) tripod::BenchAttention();
  return 0;
}
