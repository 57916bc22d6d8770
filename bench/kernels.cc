// Benchmark of the CPU kernels: QuantGemm GB/s (in cache and over the decode working set),
// fork/join cost, DnnlLinear GFLOP/s and attention (prefill GFLOP/s, decode time per token).
// Prints markdown tables.
// Usage: build/<dir>/bench/kernels [--threads=2] [--what=gemv,fork,gemm,attn] [--gemv_m=1,2,4]
//        [--seconds=0.4] [--cpu_time]
//        build/<dir>/bench/kernels --what=modelpass --model qwen2.5-coder-1.5b-instruct
#include <immintrin.h>
#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/compute/cpu/attention.h"
#include "common/compute/cpu/cpu_features.h"
#include "common/compute/cpu/gemm_onednn.h"
#include "common/compute/cpu/quant_gemv.h"
#include "common/model/gguf.h"
#include "common/model/model_config.h"
#include "common/model/model_resolver.h"
#include "common/model/quant_types.h"
#include "common/model/weights.h"
#include "common/util/huge_pages.h"
#include "common/util/thread_pool.h"

ABSL_FLAG(int, threads, 2, "compute threads");
ABSL_FLAG(std::string, model, "",
          "modelpass: the GGUF (path or catalogue name) whose decode pass is measured");
ABSL_FLAG(std::string, what, "gemv,fork,gemm,attn", "which benchmarks (also: modelpass, cached)");
ABSL_FLAG(std::string, gemv_m, "1,2,4", "activation rows (batch) for the QuantGemm benchmarks");
ABSL_FLAG(double, seconds, 0.4, "minimum time per measurement");
ABSL_FLAG(std::string, attn_isa, "", "cap the ISA of the attention benchmarks (avx2, scalar)");
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

// Per-call times of f: {best, median} seconds. On a shared machine the best call is the one the
// scheduler left alone, so it is the kernel's own speed; the median shows what interference costs.
struct CallTimes {
  double best, median;
};
template <class F>
CallTimes TimeCalls(F&& f) {
  const double budget = absl::GetFlag(FLAGS_seconds);
  f();  // warm-up
  std::vector<double> t;
  const double start = Now();
  while (t.size() < 5 || (Now() - start < budget && t.size() < 200000)) {
    const double t0 = Now();
    f();
    t.push_back(Now() - t0);
  }
  std::sort(t.begin(), t.end());
  return {t[0], t[t.size() / 2]};
}

std::vector<uint8_t> RandomMatrix(GgmlType type, int64_t n, int64_t k, std::mt19937_64& rng) {
  const int64_t rb = RowBytes(type, k).value();
  std::vector<uint8_t> b(n * rb);
  for (size_t i = 0; i + 8 <= b.size(); i += 8) {
    const uint64_t r = rng();
    std::memcpy(b.data() + i, &r, 8);
  }
  const int bb = TypeInfo(type).block_bytes;
  const uint16_t d = Fp32ToFp16(0.01f);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t blk = 0; blk < k / 32; ++blk) {
      std::memcpy(b.data() + j * rb + blk * bb, &d, 2);
      if (type == GgmlType::kQ4_1) std::memcpy(b.data() + j * rb + blk * bb + 2, &d, 2);
    }
  return b;
}

struct BenchMatrix {
  const char* name;
  std::vector<uint8_t> bytes;
  QuantMatrix q;
};

BenchMatrix MakeBenchMatrix(const char* name, GgmlType type, int64_t n, int64_t k,
                            std::mt19937_64& rng) {
  BenchMatrix m{name, RandomMatrix(type, n, k, rng), {}};
  m.q = QuantMatrix{type, m.bytes.data(), n, k, static_cast<int64_t>(RowBytes(type, k).value())};
  return m;
}

int64_t Bytes(const QuantMatrix& q) { return q.n * q.row_bytes; }

std::vector<int> ParseInts(const std::string& s) {
  std::vector<int> out;
  for (absl::string_view p : absl::StrSplit(s, ',')) {
    int v;
    if (absl::SimpleAtoi(p, &v) && v > 0) out.push_back(v);
  }
  return out;
}

// The sum of n 8-byte words at p; compiled per ISA so that the loop is vectorised (one 8-byte
// load per word was bound by instructions, not by DRAM: docs/cpu-kernels.md, "The plain-read
// reference of bench/kernels").
__attribute__((target_clones("avx512f", "avx2", "default"))) uint64_t SumWords(const uint8_t* p,
                                                                               int64_t n) {
  uint64_t s = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint64_t v;
    std::memcpy(&v, p + 8 * i, 8);
    s += v;
  }
  return s;
}

// Read-only bandwidth of the same bytes the decode pass reads, one parallel region per matrix
// as there (the ceiling for the GEMVs).
double ReadBandwidth(const std::vector<BenchMatrix>& mats) {
  int64_t total = 0;
  for (const BenchMatrix& m : mats) total += Bytes(m.q);
  std::atomic<uint64_t> sink{0};
  const CallTimes t = TimeCalls([&] {
    for (const BenchMatrix& m : mats) {
      const int64_t words = Bytes(m.q) / 8;
      const uint8_t* p = m.bytes.data();
      ParallelFor(
          words,
          [&](int64_t b, int64_t e) {
            sink.fetch_add(SumWords(p + 8 * b, e - b), std::memory_order_relaxed);
          },
          4096);
    }
  });
  return total / t.best / 1e9;
}

// (a) one matrix called repeatedly (it stays in L2/L3), (b) the decode pass: every matrix of
// SmolLM2-135M (30 layers x q,k,v,o,gate,up,down in Q4_1 + the Q8_0 head, 96.6 MB) in the order
// decode calls them, so the weights stream from DRAM as in a real step.
void BenchGemv() {
  const std::vector<int> ms = ParseInts(absl::GetFlag(FLAGS_gemv_m));
  const int max_threads = absl::GetFlag(FLAGS_threads);
  std::mt19937_64 rng(1);
  std::vector<BenchMatrix> model;
  for (int l = 0; l < 30; ++l) {
    model.push_back(MakeBenchMatrix("q", GgmlType::kQ4_1, 576, 576, rng));
    model.push_back(MakeBenchMatrix("k", GgmlType::kQ4_1, 192, 576, rng));
    model.push_back(MakeBenchMatrix("v", GgmlType::kQ4_1, 192, 576, rng));
    model.push_back(MakeBenchMatrix("o", GgmlType::kQ4_1, 576, 576, rng));
    model.push_back(MakeBenchMatrix("gate", GgmlType::kQ4_1, 1536, 576, rng));
    model.push_back(MakeBenchMatrix("up", GgmlType::kQ4_1, 1536, 576, rng));
    model.push_back(MakeBenchMatrix("down", GgmlType::kQ4_1, 576, 1536, rng));
  }
  model.push_back(MakeBenchMatrix("head", GgmlType::kQ8_0, 49152, 576, rng));
  int64_t model_bytes = 0;
  for (const BenchMatrix& m : model) model_bytes += Bytes(m.q);
  // The same matrices with rows interleaved, as the CPU backend prepares them.
  std::vector<BenchMatrix> model_il;
  for (const BenchMatrix& m : model) {
    BenchMatrix c{m.name, std::vector<uint8_t>(m.bytes.size()), m.q};
    InterleaveRows(m.q, c.bytes.data());
    c.q.data = c.bytes.data();
    c.q.interleave = kInterleaveRows;
    model_il.push_back(std::move(c));
  }

  std::vector<BenchMatrix> single;
  single.push_back(MakeBenchMatrix("Q4_1 576x576 (q, o)", GgmlType::kQ4_1, 576, 576, rng));
  single.push_back(MakeBenchMatrix("Q4_1 1536x576 (gate, up)", GgmlType::kQ4_1, 1536, 576, rng));
  single.push_back(MakeBenchMatrix("Q4_1 576x1536 (down)", GgmlType::kQ4_1, 576, 1536, rng));
  single.push_back(MakeBenchMatrix("Q8_0 4096x576 (head slice)", GgmlType::kQ8_0, 4096, 576, rng));

  const int max_m = *std::max_element(ms.begin(), ms.end());
  std::vector<float> x(static_cast<size_t>(max_m) * 1536), y(static_cast<size_t>(max_m) * 49152);
  for (auto& v : x) v = std::normal_distribution<float>()(rng);

  std::printf("\n## Read bandwidth of the %.1f MB decode working set (vectorised sum)\n\n",
              model_bytes / 1e6);
  std::printf("| threads | GB/s |\n|---:|---:|\n");
  for (int th = 1; th <= max_threads; th *= 2) {
    SetComputeThreads(th);
    std::printf("| %d | %.1f |\n", th, ReadBandwidth(model));
    std::fflush(stdout);
  }

  std::vector<IsaLevel> isas;
  for (IsaLevel isa : {IsaLevel::kAvx2, IsaLevel::kAvx512}) {
    SetIsaCap(IsaLevel::kAmx);
    if (ActiveIsa() >= isa) isas.push_back(isa);
  }

  std::printf("\n## QuantGemm, one matrix repeated (in cache)\n\n");
  std::printf("| matrix | mode | isa | m | threads | us best | us median | GB/s (best) |\n");
  std::printf("|---|---|---|---:|---:|---:|---:|---:|\n");
  for (const BenchMatrix& s : single) {
    for (GemvMode mode :
         {GemvMode::kF32, GemvMode::kInt8, GemvMode::kInt16, GemvMode::kBf16, GemvMode::kF32Tile}) {
      for (IsaLevel isa : isas) {
        SetIsaCap(isa);
        for (int m : ms) {
          for (int th = 1; th <= max_threads; th *= 2) {
            SetComputeThreads(th);
            const CallTimes t =
                TimeCalls([&] { QuantGemm(s.q, x.data(), m, s.q.k, y.data(), s.q.n, mode); });
            std::printf("| %s | %s | %s | %d | %d | %.1f | %.1f | %.1f |\n", s.name,
                        GemvModeName(mode), IsaName(isa), m, th, t.best * 1e6, t.median * 1e6,
                        Bytes(s.q) / t.best / 1e9);
            std::fflush(stdout);
          }
        }
      }
    }
  }

  std::printf("\n## QuantGemm, decode pass over all %zu matrices (%.1f MB, from DRAM)\n\n",
              model.size(), model_bytes / 1e6);
  std::printf(
      "| mode | isa | m | threads | layout | ms best | ms median | GB/s (best) | passes/s (best) "
      "|\n");
  std::printf("|---|---|---:|---:|---|---:|---:|---:|---:|\n");
  for (GemvMode mode :
       {GemvMode::kF32, GemvMode::kInt8, GemvMode::kInt16, GemvMode::kBf16, GemvMode::kF32Tile}) {
    for (IsaLevel isa : isas) {
      SetIsaCap(isa);
      for (int m : ms) {
        for (int th = 1; th <= max_threads; th *= 2) {
          SetComputeThreads(th);
          for (const std::vector<BenchMatrix>* mats : {&model, &model_il}) {
            const CallTimes t = TimeCalls([&] {
              for (const BenchMatrix& w : *mats) {
                QuantGemm(w.q, x.data(), m, w.q.k, y.data(), w.q.n, mode);
              }
            });
            std::printf("| %s | %s | %d | %d | %s | %.2f | %.2f | %.1f | %.0f |\n",
                        GemvModeName(mode), IsaName(isa), m, th,
                        mats == &model ? "gguf" : "interleaved", t.best * 1e3, t.median * 1e3,
                        model_bytes / t.best / 1e9, 1.0 / t.best);
            std::fflush(stdout);
          }
        }
      }
    }
  }
  SetIsaCap(IsaLevel::kAmx);
  SetComputeThreads(max_threads);

  // The same interleaved pass against a plain read of its bytes, taking turns within each round,
  // so that the machine's drift cancels in the ratio (docs/benchmarks.md, "Benchmark harnesses").
  std::printf(
      "\n## Decode pass against a plain read of the same bytes, alternated (%d threads, 12 "
      "rounds)\n\n",
      max_threads);
  std::printf("| mode | m | share of the read (median) | q1 | q3 |\n|---|---:|---:|---:|---:|\n");
  std::atomic<uint64_t> sink{0};
  // One contiguous range per thread, as the kernels split a matrix.
  auto read_pass = [&] {
    for (const BenchMatrix& w : model_il) {
      const int64_t words = Bytes(w.q) / 8;
      const uint8_t* p = w.bytes.data();
      const int threads = ComputeThreads();
      ParallelFor(
          threads,
          [&](int64_t t0, int64_t t1) {
            const int64_t b = words * t0 / threads, e = words * t1 / threads;
            sink.fetch_add(SumWords(p + 8 * b, e - b), std::memory_order_relaxed);
          },
          1);
    }
  };
  for (const auto& [mode, m] :
       {std::pair{GemvMode::kInt16, 1}, std::pair{GemvMode::kBf16, 4},
        std::pair{GemvMode::kInt16, 16}, std::pair{GemvMode::kF32Tile, 16}}) {
    if (m > max_m) continue;
    std::vector<double> share;
    for (int round = 0; round < 12; ++round) {
      double t_read = 1e30, t_pass = 1e30;
      for (int i = 0; i < 3; ++i) {
        double t0 = Now();
        read_pass();
        t_read = std::min(t_read, Now() - t0);
        t0 = Now();
        for (const BenchMatrix& w : model_il) {
          QuantGemm(w.q, x.data(), m, w.q.k, y.data(), w.q.n, mode);
        }
        t_pass = std::min(t_pass, Now() - t0);
      }
      share.push_back(t_read / t_pass);
    }
    std::sort(share.begin(), share.end());
    std::printf("| %s | %d | %.3f | %.3f | %.3f |\n", GemvModeName(mode), m, share[6], share[3],
                share[9]);
    std::fflush(stdout);
  }
}

// Medians of 12 rounds, each the best of 2 reads and 2 passes taken in turn, so that the machine's
// drift cancels in the ratio.
struct Alternated {
  double read_s, pass_s, share, share_q1, share_q3;
};
template <class Read, class Pass>
Alternated Alternate(Read read, Pass pass) {
  std::vector<double> share, reads, passes;
  for (int round = 0; round < 12; ++round) {
    double t_read = 1e30, t_pass = 1e30;
    for (int i = 0; i < 2; ++i) {
      double t0 = Now();
      read();
      t_read = std::min(t_read, Now() - t0);
      t0 = Now();
      pass();
      t_pass = std::min(t_pass, Now() - t0);
    }
    share.push_back(t_read / t_pass);
    reads.push_back(t_read);
    passes.push_back(t_pass);
  }
  std::sort(share.begin(), share.end());
  std::sort(reads.begin(), reads.end());
  std::sort(passes.begin(), passes.end());
  return {reads[6], passes[6], share[6], share[3], share[9]};
}

// --model's file, mapped, and its weights bound (the GGUF kept open: the weights point into it);
// any error ends the benchmark with its message.
struct LoadedModel {
  std::string path;
  std::unique_ptr<GgufFile> gguf;
  ModelWeights weights;
};
LoadedModel LoadModelOrExit() {
  absl::StatusOr<std::string> path = ResolveModel(absl::GetFlag(FLAGS_model));
  auto gguf = path.ok() ? GgufFile::Open(*path) : path.status();
  auto config = gguf.ok() ? ReadModelConfig(**gguf) : gguf.status();
  auto weights = config.ok() ? BindWeights(**gguf, *config) : config.status();
  if (!weights.ok()) {
    std::fprintf(stderr, "kernels: %s\n", weights.status().ToString().c_str());
    std::exit(2);
  }
  return {*path, std::move(*gguf), std::move(*weights)};
}

// A real model's decode pass (--what=modelpass --model M): its matrices as the CPU backend reads
// them (in place from the mapping, Q|K|V and gate|up stacked; Q4_0/Q4_1/Q8_0 interleaved copies
// as the backend makes), each layer in decode order, then the head; against a plain read of the
// same bytes, taking turns within each of 12 rounds so that the machine's drift cancels in the
// ratio. The read is the floor the decode goal names: tokens/s <= read GB/s / bytes.
void BenchModelPass() {
  const LoadedModel model = LoadModelOrExit();
  const std::string* path = &model.path;
  const ModelWeights* weights = &model.weights;
  std::vector<std::vector<uint8_t>> copies;
  auto part = [&](const WeightRef& r, int64_t col) {
    const GgufTensorInfo& t = *r.tensor;
    QuantMatrix q{t.type, t.data, t.rows(), t.cols(),
                  static_cast<int64_t>(RowBytes(t.type, t.cols()).value())};
    if (CanInterleave(q)) {
      copies.emplace_back(q.n * q.row_bytes);
      InterleaveRows(q, copies.back().data());
      q.data = copies.back().data();
      q.interleave = kInterleaveRows;
    }
    return QuantPart{q, col};
  };
  std::vector<std::vector<QuantPart>> calls;
  for (const LayerWeights& l : weights->layers) {
    calls.push_back(
        {part(l.wq, 0), part(l.wk, l.wq.rows()), part(l.wv, l.wq.rows() + l.wk.rows())});
    calls.push_back({part(l.wo, 0)});
    calls.push_back({part(l.w_gate, 0), part(l.w_up, l.w_gate.rows())});
    calls.push_back({part(l.w_down, 0)});
  }
  calls.push_back({part(weights->output, 0)});
  int64_t bytes = 0, max_n = 0, max_k = 0;
  for (const auto& c : calls) {
    int64_t n = 0;
    for (const QuantPart& p : c) {
      bytes += p.q.n * p.q.row_bytes;
      n += p.q.n;
      max_k = std::max(max_k, p.q.k);
    }
    max_n = std::max(max_n, n);
  }
  std::mt19937_64 rng(1);
  std::vector<float> x(16 * max_k), y(16 * max_n);
  for (auto& v : x) v = std::normal_distribution<float>()(rng);
  std::atomic<uint64_t> sink{0};
  auto read_calls = [&](const std::vector<std::vector<QuantPart>>& cs) {
    for (const auto& c : cs) {
      for (const QuantPart& p : c) {
        const int64_t words = p.q.n * p.q.row_bytes / 8;
        const auto* b0 = static_cast<const uint8_t*>(p.q.data);
        const int threads = ComputeThreads();
        ParallelFor(
            threads,
            [&](int64_t t0, int64_t t1) {
              const int64_t b = words * t0 / threads, e = words * t1 / threads;
              sink.fetch_add(SumWords(b0 + 8 * b, e - b), std::memory_order_relaxed);
            },
            1);
      }
    }
  };
  auto read_pass = [&] { read_calls(calls); };
  // Per weight type: that type's matrices alone (each its own call), int16 and int8 at m = 1,
  // against a read of the same bytes: which type keeps the pass from the floor.
  std::map<GgmlType, std::vector<std::vector<QuantPart>>> by_type;
  for (const auto& c : calls) {
    for (const QuantPart& p : c) by_type[p.q.type].push_back({QuantPart{p.q, 0}});
  }
  if (by_type.size() > 1) {
    std::printf("\n## Decode pass by weight type (m = 1), alternated with a read\n\n");
    std::printf("| type | mode | MB | read GB/s | pass GB/s | share (median) |\n");
    std::printf("|---|---|---:|---:|---:|---:|\n");
    for (const auto& [type, tcalls] : by_type) {
      for (GemvMode tmode : {GemvMode::kInt16, GemvMode::kInt8}) {
        int64_t tbytes = 0;
        for (const auto& c : tcalls) tbytes += c[0].q.n * c[0].q.row_bytes;
        const Alternated a =
            Alternate([&] { read_calls(tcalls); },
                      [&] {
                        for (const auto& c : tcalls) {
                          QuantGemm(c, x.data(), 1, max_k, y.data(), max_n, tmode, false);
                        }
                      });
        std::printf("| %s | %s | %.1f | %.1f | %.1f | %.3f |\n",
                    std::string(TypeInfo(type).name).c_str(), GemvModeName(tmode), tbytes / 1e6,
                    tbytes / a.read_s / 1e9, tbytes / a.pass_s / 1e9, a.share);
        std::printf(
            "{\"bench\":\"kernels_modelpass_type\",\"model\":\"%s\",\"type\":\"%s\",\"mode\":\"%"
            "s\","
            "\"threads\":%d,\"bytes\":%lld,\"read_gbs\":%.2f,\"pass_gbs\":%.2f,"
            "\"share_median\":%.3f}\n",
            path->c_str(), std::string(TypeInfo(type).name).c_str(), GemvModeName(tmode),
            ComputeThreads(), static_cast<long long>(tbytes), tbytes / a.read_s / 1e9,
            tbytes / a.pass_s / 1e9, a.share);
        std::fflush(stdout);
      }
    }
  }
  std::printf("\n## Decode pass of %s (%.1f MB a token) against a plain read, alternated\n\n",
              path->c_str(), bytes / 1e6);
  std::printf("| mode | m | read GB/s | pass GB/s | floor tok/s | pass tok/s | share (median) |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|\n");
  // Batched decode's candidates too (bf16, int16, the fp32 tile): which one a CPU should take
  // for 4 and 16 rows is this table's question (cpu_backend.cc, CpuOptionsForPrecision).
  for (const auto& [mode, m] : {std::pair{GemvMode::kInt16, 1}, std::pair{GemvMode::kInt8, 1},
                                std::pair{GemvMode::kBf16, 4}, std::pair{GemvMode::kInt16, 4},
                                std::pair{GemvMode::kBf16, 16}, std::pair{GemvMode::kInt16, 16},
                                std::pair{GemvMode::kF32Tile, 16}}) {
    const Alternated a = Alternate(read_pass, [&] {
      for (const auto& c : calls) QuantGemm(c, x.data(), m, max_k, y.data(), max_n, mode, false);
    });
    const double tr = a.read_s, tp = a.pass_s;
    std::printf("| %s | %d | %.1f | %.1f | %.1f | %.1f | %.3f |\n", GemvModeName(mode), m,
                bytes / tr / 1e9, bytes / tp / 1e9, 1 / tr, 1 / tp, a.share);
    std::printf(
        "{\"bench\":\"kernels_modelpass\",\"model\":\"%s\",\"mode\":\"%s\",\"m\":%d,"
        "\"threads\":%d,\"bytes\":%lld,\"read_gbs\":%.2f,\"pass_gbs\":%.2f,\"floor_tok_s\":%.2f,"
        "\"pass_tok_s\":%.2f,\"share_median\":%.3f,\"share_q1\":%.3f,\"share_q3\":%.3f}\n",
        path->c_str(), GemvModeName(mode), m, ComputeThreads(), static_cast<long long>(bytes),
        bytes / tr / 1e9, bytes / tp / 1e9, 1 / tr, 1 / tp, a.share, a.share_q1, a.share_q3);
    std::fflush(stdout);
  }
}

// One real matrix's rows held in L2 (--what=cached --model M), one thread: the decode kernels'
// multiply-accumulate rate per weight type and row count, without DRAM, beside a loop of
// independent vdpbf16ps, vpdpwssd and fp32 FMAs (the core's peak for each). Says whether a kernel
// that runs below its share of the DRAM read in the model pass is bound by its instructions or by
// memory, and whether bf16 products pay on this core at all (cpu_features.h, bf16_dot_fast).
enum class PeakOp { kBf16, kInt16, kF32 };

__attribute__((target("avx512f,avx512bf16,avx512vnni"))) double PeakMacsPerSecond(PeakOp op) {
  __m512 a[16];
  __m512i b[16];
  for (int i = 0; i < 16; ++i) {
    a[i] = _mm512_setzero_ps();
    b[i] = _mm512_setzero_si512();
  }
  __m512i w = _mm512_set1_epi16(0x3f80), x = _mm512_set1_epi16(0x3f80);
  __m512 wf = _mm512_set1_ps(1e-9f), xf = _mm512_set1_ps(1e-9f);
  const int64_t n = 20000000;
  const double t0 = Now();
  for (int64_t k = 0; k < n; ++k) {
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) {
      if (op == PeakOp::kBf16) {
        a[i] = _mm512_dpbf16_ps(a[i], (__m512bh)w, (__m512bh)x);
      } else if (op == PeakOp::kInt16) {
        b[i] = _mm512_dpwssd_epi32(b[i], w, x);
      } else {
        a[i] = _mm512_fmadd_ps(wf, xf, a[i]);
      }
    }
    asm volatile("" : "+v"(w), "+v"(x), "+v"(wf), "+v"(xf));
  }
  const double t = Now() - t0;
  alignas(64) float fa[16];
  alignas(64) int32_t ib[16];
  float sum = 0;
  for (int i = 0; i < 16; ++i) {
    _mm512_store_ps(fa, a[i]);
    _mm512_store_si512(ib, b[i]);
    sum += fa[i] + static_cast<float>(ib[i]);
  }
  asm volatile("" : : "m"(sum));
  // Multiply-adds per instruction: 32 pairs for the dot products, 16 lanes for the FMA.
  return n * 16 * (op == PeakOp::kF32 ? 16 : 32) / t;
}

void BenchCached() {
  const LoadedModel model = LoadModelOrExit();
  const ModelWeights* weights = &model.weights;
  SetComputeThreads(1);
  const bool vnni = GetCpuFeatures().avx512bf16 && ActiveIsa() >= IsaLevel::kAvx512;
  const double peak_bf16 = vnni ? PeakMacsPerSecond(PeakOp::kBf16) : 0;
  const double peak_i16 = vnni ? PeakMacsPerSecond(PeakOp::kInt16) : 0;
  const double peak_f32 = vnni ? PeakMacsPerSecond(PeakOp::kF32) : 0;
  std::printf(
      "\n## One matrix in L2, one thread (peak: vdpbf16ps %.1f, vpdpwssd %.1f, fp32 FMA %.1f "
      "GMAC/s)\n\n",
      peak_bf16 / 1e9, peak_i16 / 1e9, peak_f32 / 1e9);
  std::printf("| matrix | type | rows x k | KB | mode | m | us | GMAC/s | of peak |\n");
  std::printf("|---|---|---|---:|---|---:|---:|---:|---:|\n");
  const LayerWeights& l = weights->layers[0];
  std::map<GgmlType, bool> seen;
  for (const WeightRef* r : std::initializer_list<const WeightRef*>{
           &l.w_gate, &l.w_down, &l.wq, &l.wo, &weights->output, &l.w_up}) {
    const GgufTensorInfo& t = *r->tensor;
    if (seen[t.type]) continue;
    seen[t.type] = true;
    const int64_t rb = static_cast<int64_t>(RowBytes(t.type, t.cols()).value());
    // About 512 KB of rows: in the 1 MiB L2 of the CPUs measured, with x beside them.
    const int64_t n = std::clamp<int64_t>((512 << 10) / rb / 16 * 16, 16, t.rows());
    QuantMatrix q{t.type, t.data, n, t.cols(), rb};
    std::vector<float> x(16 * q.k), y(16 * n);
    std::mt19937_64 rng(1);
    for (auto& v : x) v = std::normal_distribution<float>()(rng);
    for (const auto& [mode, m] : {std::pair{GemvMode::kInt16, 1}, std::pair{GemvMode::kInt16, 4},
                                  std::pair{GemvMode::kInt8, 1}, std::pair{GemvMode::kBf16, 4},
                                  std::pair{GemvMode::kBf16, 8}, std::pair{GemvMode::kBf16, 16}}) {
      const CallTimes c = TimeCalls([&] { QuantGemm(q, x.data(), m, q.k, y.data(), n, mode); });
      const double macs = static_cast<double>(n) * q.k * m / c.best;
      const double peak = mode == GemvMode::kBf16 ? peak_bf16 : peak_i16;
      std::printf("| %s | %s | %lld x %lld | %lld | %s | %d | %.1f | %.1f | %.2f |\n",
                  t.name.c_str(), std::string(TypeInfo(t.type).name).c_str(),
                  static_cast<long long>(n), static_cast<long long>(q.k),
                  static_cast<long long>(n * rb / 1024), GemvModeName(mode), m, c.best * 1e6,
                  macs / 1e9, peak > 0 ? macs / peak : 0.0);
      std::printf(
          "{\"bench\":\"kernels_cached\",\"model\":\"%s\",\"matrix\":\"%s\",\"type\":\"%s\","
          "\"rows\":%lld,\"k\":%lld,\"mode\":\"%s\",\"m\":%d,\"threads\":1,\"us\":%.2f,"
          "\"gmacs\":%.2f,\"peak_gmacs\":%.2f,\"share_of_peak\":%.3f}\n",
          model.path.c_str(), t.name.c_str(), std::string(TypeInfo(t.type).name).c_str(),
          static_cast<long long>(n), static_cast<long long>(q.k), GemvModeName(mode), m,
          c.best * 1e6, macs / 1e9, peak / 1e9, peak > 0 ? macs / peak : 0.0);
      std::fflush(stdout);
    }
  }
}

// Fork/join cost: the parallel regions decode opens ~10 times per layer.
void BenchFork() {
  std::printf("\n## Fork/join, us per call\n\n");
  std::printf("| call | threads | us best | us median |\n|---|---:|---:|---:|\n");
  const int max_threads = absl::GetFlag(FLAGS_threads);
  std::vector<int64_t> sink(64);
  for (int th = 1; th <= max_threads; th *= 2) {
    SetComputeThreads(th);
    struct Case {
      const char* name;
      int64_t n, grain;
    };
    for (const Case& c : {Case{"ParallelFor n=2 grain=1 (one chunk each)", 2, 1},
                          Case{"ParallelFor n=1536 grain=96 (16 chunks)", 1536, 96},
                          Case{"ParallelFor n=1536 grain=0", 1536, 0}}) {
      const CallTimes t = TimeCalls([&] {
        ParallelFor(
            c.n, [&](int64_t b, int64_t e) { sink[(b & 7) * 8] += e - b; }, c.grain);
      });
      std::printf("| %s | %d | %.2f | %.2f |\n", c.name, th, t.best * 1e6, t.median * 1e6);
    }
    const CallTimes t =
        TimeCalls([&] { ParallelRun([&](int i, int) { sink[(i & 7) * 8] += 1; }); });
    std::printf("| ParallelRun | %d | %.2f | %.2f |\n", th, t.best * 1e6, t.median * 1e6);
    std::fflush(stdout);
  }
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
  const size_t bytes = size_t(n_kv) * slots * KvRowBytes(dt, d);
  kv.k.assign(bytes, 0);
  kv.v.assign(bytes, 0);
  kv.ref = KvLayerRef{kv.k.data(), kv.v.data(), kv.ids.data(), 1, slots, bytes, dt};
  std::mt19937 rng(3);
  std::vector<float> rows(size_t(slots) * n_kv * d);
  for (auto& x : rows) x = std::normal_distribution<float>()(rng);
  WriteKvCpu(rows.data(), rows.data(), slots, n_kv * d, n_kv, d, kv.ref, 0);
  return kv;
}

// The paged KV pool's memory (huge pages), or 4 KiB pages when TRIPOD_NO_HUGEPAGES is set (to
// measure the difference).
HugePageBuffer KvMemory(size_t bytes) {
  HugePageBuffer b = HugePageBuffer::Allocate(bytes).value();
  if (std::getenv("TRIPOD_NO_HUGEPAGES") != nullptr) madvise(b.data(), b.size(), MADV_NOHUGEPAGE);
  return b;
}

// A continuous-batching decode step's attention: kSeqs sequences at context kCtx in 16-slot
// blocks of one pool, 30 layers cycled, one call. Each sequence's blocks are consecutive in
// memory (as a fresh pool hands them out) or scattered over the pool (as after much churn).
void BenchBatchedDecode(KvDtype dt, int kSeqs, int kCtx, bool scattered) {
  const int H = 9, KVH = 3, D = 64, kBt = 16, kLayers = 30;
  const int blocks_per_seq = kCtx / kBt, n_blocks = kSeqs * blocks_per_seq;
  const size_t block_bytes = size_t(KVH) * kBt * KvRowBytes(dt, D);
  std::mt19937 rng(5);
  std::vector<HugePageBuffer> k, v;
  std::vector<int32_t> ids(n_blocks);
  for (int i = 0; i < n_blocks; ++i) ids[i] = i;
  if (scattered) std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<float> rows(size_t(kBt) * KVH * D);
  for (auto& x : rows) x = std::normal_distribution<float>()(rng);
  for (int l = 0; l < kLayers; ++l) {
    k.push_back(KvMemory(n_blocks * block_bytes));
    v.push_back(KvMemory(n_blocks * block_bytes));
    for (int b = 0; b < n_blocks; ++b) {
      const int32_t one = b;
      KvLayerRef r{k[l].data(), v[l].data(), &one, 1, kBt, block_bytes, dt};
      WriteKvCpu(rows.data(), rows.data(), kBt, KVH * D, KVH, D, r, 0);
    }
  }
  std::vector<float> q(size_t(kSeqs) * H * D), out(q.size());
  for (auto& x : q) x = std::normal_distribution<float>()(rng);
  int l = 0;
  std::vector<AttentionArgs> args(kSeqs);
  const double t = TimeIt([&] {
    for (int s = 0; s < kSeqs; ++s) {
      KvLayerRef r{k[l].data(), v[l].data(), ids.data() + s * blocks_per_seq, blocks_per_seq, kBt,
                   block_bytes, dt};
      args[s] = AttentionArgs{q.data() + s * H * D,   H * D, 1, kCtx - 1, H, KVH, D, 0.125f, r,
                              out.data() + s * H * D, H * D};
    }
    AttentionCpu(args);
    l = (l + 1) % kLayers;
  });
  const double bytes = 2.0 * kSeqs * kCtx * KVH * KvRowBytes(dt, D);
  std::printf("| decode %d seqs x ctx %d, paged %d %s | %s | %.3f | %.1f GB/s | %.2f |\n", kSeqs,
              kCtx, kBt, scattered ? "scattered" : "sequential", KvDtypeName(dt), t * 1e3,
              bytes / t / 1e9, t * 30e3);
}

void BenchAttention() {
  const int H = 9, KVH = 3, D = 64;
  std::printf(
      "\n## Attention (9 heads, 3 kv heads, head_dim 64, one layer), %d threads, isa %s\n\n",
      ComputeThreads(), IsaName(ActiveIsa()));
  std::printf("| case | kv | ms (1 layer) | GFLOP/s | x30 layers ms |\n|---|---|---:|---:|---:|\n");
  std::mt19937 rng(4);
  for (KvDtype dt : {KvDtype::kF32, KvDtype::kF16, KvDtype::kBF16, KvDtype::kQ8_0}) {
    for (int n : {512, 2048, 4096}) {
      Kv kv = MakeKv(dt, KVH, D, n);
      std::vector<float> q(size_t(n) * H * D), out(q.size());
      for (auto& x : q) x = std::normal_distribution<float>()(rng);
      AttentionArgs a{q.data(), H * D, n, 0, H, KVH, D, 0.125f, kv.ref, out.data(), H * D};
      const double t = TimeIt([&] { AttentionCpu(std::span<const AttentionArgs>(&a, 1)); });
      const double flop = 4.0 * D * H * n * (n + 1) / 2.0;
      std::printf("| prefill %d | %s | %.2f | %.1f | %.0f |\n", n, KvDtypeName(dt), t * 1e3,
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
      std::printf("| decode ctx %d | %s | %.3f | %.1f | %.2f |\n", ctx, KvDtypeName(dt), t * 1e3,
                  flop / t / 1e9, t * 30e3);
    }
    for (bool scattered : {false, true}) {
      BenchBatchedDecode(dt, 16, 512, scattered);
      BenchBatchedDecode(dt, 1, 2048, scattered);
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
  if (absl::StrContains(what, "modelpass")) {
    tripod::BenchModelPass();
  } else if (absl::StrContains(what, "cached")) {
    tripod::BenchCached();
  } else if (absl::StrContains(what, "gemv")) {
    tripod::BenchGemv();
  }
  if (absl::StrContains(what, "fork")) tripod::BenchFork();
  if (absl::StrContains(what, "gemm")) tripod::BenchGemm();
  if (absl::StrContains(what, "attn")) {
    const std::string isa = absl::GetFlag(FLAGS_attn_isa);
    if (isa == "avx2") tripod::SetIsaCap(tripod::IsaLevel::kAvx2);
    if (isa == "scalar") tripod::SetIsaCap(tripod::IsaLevel::kScalar);
    tripod::BenchAttention();
    tripod::SetIsaCap(tripod::IsaLevel::kAmx);
  }
  return 0;
}
