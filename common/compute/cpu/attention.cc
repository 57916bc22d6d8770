// AttentionCpu: splits every sequence's attention into tasks (kv head x query tile, or for
// decode kv heads x slot range merged afterwards), runs them on the ISA kernel; also the scalar
// kernel (reference and fallback) and WriteKvCpu.
#include "common/compute/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/compute/cpu/attention_internal.h"
#include "common/compute/cpu/cpu_features.h"
#include "common/kv/kv_dtype.h"
#include "common/util/thread_pool.h"

namespace tripod {
namespace attn {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t man = h & 0x3ff;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else {
    const float v = static_cast<float>(man) * 5.9604644775390625e-8f;  // man * 2^-24
    std::memcpy(&bits, &v, 4);
    bits |= sign;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToHalf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000);
  u &= 0x7fffffff;
  if (u >= 0x7f800000) return sign | 0x7c00 | (u > 0x7f800000 ? 0x200 : 0);  // inf, NaN
  if (u >= 0x477ff000) return sign | 0x7c00;  // >= 65520 rounds to inf
  if (u < 0x38800000) {
    // Below 2^-14: a subnormal half, man = round(|f| * 2^24) (exact scaling, RNE rounding).
    float a;
    std::memcpy(&a, &u, 4);
    return sign | static_cast<uint16_t>(std::nearbyint(a * 16777216.0f));
  }
  const uint32_t r = u + 0xfff + ((u >> 13) & 1) - 0x38000000;  // rebias 127 -> 15, RNE
  return sign | static_cast<uint16_t>(r >> 13);
}

float Bf16ToFloat(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((u >> 16) | 0x40);
  return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

void LoadRowScalar(const uint8_t* src, KvDtype dt, int n, float* dst) {
  if (dt == KvDtype::kF32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * 4);
    return;
  }
  if (dt == KvDtype::kQ8_0) return DequantizeKvQ8Row(src, n, dst);
  for (int i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    dst[i] = dt == KvDtype::kF16 ? HalfToFloat(h) : Bf16ToFloat(h);
  }
}

}  // namespace

namespace scalar {

void ConvertRow(const float* src, int n, KvDtype dtype, uint8_t* dst) {
  if (dtype == KvDtype::kF32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * 4);
    return;
  }
  if (dtype == KvDtype::kQ8_0) return QuantizeKvQ8Row(src, n, dst);
  for (int i = 0; i < n; ++i) {
    const uint16_t h = dtype == KvDtype::kF16 ? FloatToHalf(src[i]) : FloatToBf16(src[i]);
    std::memcpy(dst + 2 * i, &h, 2);
  }
}

void Block(const AttentionArgs& a, int kvh, int q0, int q1, int64_t k0, int64_t k1, float* scratch,
           float* o, float* m, float* l) {
  const int D = a.head_dim;
  const int g = a.n_heads / a.n_kv_heads;
  const int rows = (q1 - q0) * g;
  float* qs = scratch;
  float* kr = qs + D;
  float* vr = kr + D;
  uint8_t* krow = reinterpret_cast<uint8_t*>(vr + D);  // a stored K row, in row order
  for (int r = 0; r < rows; ++r) {
    const int qi = q0 + r / g, h = kvh * g + r % g;
    const float* src = a.q + qi * a.q_stride + h * D;
    for (int d = 0; d < D; ++d) qs[d] = src[d] * a.scale;
    float* orow = o + r * D;
    std::fill(orow, orow + D, 0.0f);
    float mr = kNegInf, lr = 0.0f;
    const int64_t end = std::min<int64_t>(k1, a.n_past + qi + 1);
    for (int64_t s = k0; s < end; ++s) {
      a.kv.ReadK(s, kvh, D, krow);
      LoadRowScalar(krow, a.kv.dtype, D, kr);
      float sc = 0.0f;
      for (int d = 0; d < D; ++d) sc += qs[d] * kr[d];
      if (sc > mr) {
        const float corr = std::exp(mr - sc);  // 0 when mr = -inf
        lr *= corr;
        for (int d = 0; d < D; ++d) orow[d] *= corr;
        mr = sc;
      }
      const float p = std::exp(sc - mr);
      lr += p;
      LoadRowScalar(a.kv.v_at(s, kvh, D), a.kv.dtype, D, vr);
      for (int d = 0; d < D; ++d) orow[d] += p * vr[d];
    }
    m[r] = mr;
    l[r] = lr;
  }
}

}  // namespace scalar
}  // namespace attn

namespace {

bool Valid(const AttentionArgs& a) {
  return a.q != nullptr && a.out != nullptr && a.n_q > 0 && a.n_past >= 0 && a.n_heads > 0 &&
         a.n_kv_heads > 0 && a.n_heads % a.n_kv_heads == 0 && a.head_dim > 0 &&
         a.kv.k_base != nullptr && a.kv.v_base != nullptr && a.kv.block_ids != nullptr &&
         a.kv.block_tokens > 0 && a.kv.first_visible_slot >= 0 &&
         static_cast<int64_t>(a.kv.n_blocks) * a.kv.block_tokens >= int64_t{a.n_past} + a.n_q;
}

// Queries [q0, q1) of sequence `seq` for KV heads [kvh, kvh + nh) over slots [k0, k1). Its rows
// are head-major: row hh * (q1 - q0) * g + r is query q0 + r / g, head (kvh + hh) * g + r % g.
struct Task {
  int seq, kvh, nh, q0, q1;
  int64_t k0, k1;
  int64_t part;  // offset of this task's (o, m, l) in the partial buffer; -1 = write out directly
  double cost;
};

// Rows of one prefill tile: ~96 rows keep Q, S and O tiles in L2 and amortise the K/V
// conversion over many rows.
constexpr int kTileRows = 96;
// Up to this many rows (queries x grouped heads) a sequence counts as decode: its slots are
// split over tasks (flash-decoding) so one sequence still uses every thread.
constexpr int kDecodeRows = 16;
constexpr int64_t kMinSplitSlots = 256;
// Few sequences: split slots until there are about this many tasks per thread. Few long tasks
// stream better than many short ones (docs/cpu-kernels.md, "Decode attention: tasks per thread
// and heads per task").
constexpr int kDecodeTasksPerThread = 2;

using BlockFn = void (*)(const AttentionArgs&, int, int, int, int64_t, int64_t, float*, float*,
                         float*, float*);
using DecodeFn = bool (*)(const AttentionArgs&, int, int, int, int, int64_t, int64_t, float*,
                          float*, float*, float*);

// The register-resident decode kernel for tasks of few rows, and for every task in
// batch-invariant mode (so a row is computed alike in a decode step and in a prefill chunk);
// null where the ISA or head_dim has none.
DecodeFn PickDecode(const AttentionArgs& a, int rows) {
  if (rows > kDecodeRows && !a.batch_invariant) return nullptr;
  const IsaLevel isa = ActiveIsa();
  if (isa >= IsaLevel::kAvx512) return attn::avx512::Decode;
  if (isa >= IsaLevel::kAvx2) return attn::avx2::Decode;
  return nullptr;
}

BlockFn PickBlock(const AttentionArgs& a) {
  const IsaLevel isa = ActiveIsa();
  const bool vec_ok = a.head_dim % 16 == 0 && a.head_dim <= 512;
  if (vec_ok && isa >= IsaLevel::kAvx512) return attn::avx512::Block;
  if (vec_ok && isa >= IsaLevel::kAvx2) return attn::avx2::Block;
  return attn::scalar::Block;
}

// KV heads per decode task: all of them (up to kDecodeMaxHeads) where a head's run of rows in a
// block is short, so that a task reads whole blocks; one where the runs are long streams already
// (a contiguous cache), which the hardware prefetcher follows best one at a time
// (docs/cpu-kernels.md, "Decode attention: tasks per thread and heads per task").
int HeadsPerDecodeTask(const AttentionArgs& a) {
  const size_t run = static_cast<size_t>(a.kv.block_tokens) * KvRowBytes(a.kv.dtype, a.head_dim);
  return run < attn::kDecodeLongRun ? attn::kDecodeMaxHeads : 1;
}

// Destination of row `row` of task t (see Task) in the output.
float* OutRow(const AttentionArgs& a, const Task& t, int row) {
  const int g = a.n_heads / a.n_kv_heads, head_rows = (t.q1 - t.q0) * g;
  const int hh = row / head_rows, r = row % head_rows;
  const int qi = t.q0 + r / g, h = (t.kvh + hh) * g + r % g;
  return a.out + qi * a.out_stride + h * a.head_dim;
}

}  // namespace

void AttentionCpu(std::span<const AttentionArgs> seqs) {
  std::vector<Task> tasks;
  int64_t part_floats = 0;
  // The most threads, not those of this moment (a core share lends more or fewer): how a decode
  // row's KV is split changes its sums' rounding, and a row's result must not depend on timing.
  const int threads = MaxComputeThreads();
  int decode_seqs = 0;
  for (const AttentionArgs& a : seqs) {
    if (Valid(a) && a.n_q * (a.n_heads / a.n_kv_heads) <= kDecodeRows) ++decode_seqs;
  }
  for (int si = 0; si < static_cast<int>(seqs.size()); ++si) {
    const AttentionArgs& a = seqs[si];
    if (!Valid(a)) continue;
    const int g = a.n_heads / a.n_kv_heads;
    if (a.n_q * g <= kDecodeRows) {
      // All KV heads of a slot range in one task (up to kDecodeMaxHeads), so that it reads whole
      // blocks. Visible slots [first, end); a query whose window is empty gets a zero output.
      const int64_t end = int64_t{a.n_past} + a.n_q;
      const int64_t first = std::min<int64_t>(a.kv.first_visible_slot, end);
      const int64_t slots = end - first;
      const int group = HeadsPerDecodeTask(a);
      const int units = decode_seqs * ((a.n_kv_heads + group - 1) / group);
      int64_t splits = 1;
      if (units < kDecodeTasksPerThread * threads && !a.batch_invariant) {
        const int64_t want = (kDecodeTasksPerThread * threads + units - 1) / units;
        splits = std::clamp<int64_t>(slots / kMinSplitSlots, 1, want);
      }
      for (int h0 = 0; h0 < a.n_kv_heads; h0 += group) {
        const int nh = std::min(group, a.n_kv_heads - h0);
        for (int64_t sp = 0; sp < splits; ++sp) {
          const int64_t k0 = first + slots * sp / splits, k1 = first + slots * (sp + 1) / splits;
          int64_t part = -1;
          if (splits > 1) {
            part = part_floats;
            part_floats += int64_t{nh} * a.n_q * g * (a.head_dim + 2);
          }
          tasks.push_back({si, h0, nh, 0, a.n_q, k0, k1, part, double(nh) * a.n_q * g * (k1 - k0)});
        }
      }
    } else {
      const int tile_q = std::max(1, kTileRows / g);
      for (int h = 0; h < a.n_kv_heads; ++h) {
        for (int q0 = 0; q0 < a.n_q; q0 += tile_q) {
          const int q1 = std::min(a.n_q, q0 + tile_q);
          const int64_t k1 = int64_t{a.n_past} + q1;
          const int64_t k0 = std::min<int64_t>(a.kv.first_visible_slot, k1);
          tasks.push_back({si, h, 1, q0, q1, k0, k1, -1, double(q1 - q0) * g * (k1 - k0)});
        }
      }
    }
  }
  if (tasks.empty()) return;
  // Largest first, so the dynamic schedule ends with small tasks (causal tiles differ ~n-fold).
  std::stable_sort(tasks.begin(), tasks.end(),
                   [](const Task& x, const Task& y) { return x.cost > y.cost; });
  std::vector<float> parts(static_cast<size_t>(part_floats));

  auto run = [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> buf;
    for (int64_t ti = begin; ti < end; ++ti) {
      const Task& t = tasks[ti];
      const AttentionArgs& a = seqs[t.seq];
      const int D = a.head_dim, g = a.n_heads / a.n_kv_heads;
      const int head_rows = (t.q1 - t.q0) * g, rows = t.nh * head_rows;
      const size_t scratch =
          std::max(attn::BlockScratchFloats(head_rows, D), static_cast<size_t>(rows) * D);
      buf.resize(scratch + static_cast<size_t>(rows) * (D + 2));
      float* o = buf.data() + scratch;
      float* m = o + static_cast<size_t>(rows) * D;
      float* l = m + rows;
      const DecodeFn decode = PickDecode(a, head_rows);
      if (decode == nullptr ||
          !decode(a, t.kvh, t.nh, t.q0, t.q1, t.k0, t.k1, buf.data(), o, m, l)) {
        const BlockFn block = PickBlock(a);
        for (int hh = 0; hh < t.nh; ++hh) {
          const int r0 = hh * head_rows;
          block(a, t.kvh + hh, t.q0, t.q1, t.k0, t.k1, buf.data(), o + r0 * D, m + r0, l + r0);
        }
      }
      if (t.part >= 0) {
        std::memcpy(parts.data() + t.part, o, sizeof(float) * rows * (D + 2));
        continue;
      }
      for (int r = 0; r < rows; ++r) {
        float* dst = OutRow(a, t, r);
        const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
        for (int d = 0; d < D; ++d) dst[d] = o[r * D + d] * inv;
      }
    }
  };
  ParallelFor(static_cast<int64_t>(tasks.size()), run, 1);

  if (part_floats == 0) return;
  // Merge the slot-range partials of split sequences: rescale each to the common max.
  for (size_t i = 0; i < tasks.size();) {
    if (tasks[i].part < 0) {
      ++i;
      continue;
    }
    // Gather the tasks of the same (seq, kv heads).
    std::vector<Task*> group;
    for (Task& t : tasks) {
      if (t.part >= 0 && t.seq == tasks[i].seq && t.kvh == tasks[i].kvh) group.push_back(&t);
    }
    const AttentionArgs& a = seqs[tasks[i].seq];
    const int D = a.head_dim, g = a.n_heads / a.n_kv_heads, rows = tasks[i].nh * a.n_q * g;
    for (int r = 0; r < rows; ++r) {
      float mx = attn::kNegInf;
      for (const Task* t : group) mx = std::max(mx, parts[t->part + rows * D + r]);
      float* dst = OutRow(a, tasks[i], r);
      std::fill(dst, dst + D, 0.0f);
      float lsum = 0.0f;
      for (const Task* t : group) {
        const float mt = parts[t->part + rows * D + r];
        if (mt == attn::kNegInf) continue;
        const float w = std::exp(mt - mx);
        lsum += w * parts[t->part + rows * D + rows + r];
        const float* ot = parts.data() + t->part + r * D;
        for (int d = 0; d < D; ++d) dst[d] += w * ot[d];
      }
      const float inv = lsum > 0.0f ? 1.0f / lsum : 0.0f;
      for (int d = 0; d < D; ++d) dst[d] *= inv;
    }
    // Mark the group merged.
    for (Task* t : group) t->part = -1;
  }
}

namespace {

using ConvertFn = void (*)(const float* src, int n, KvDtype dtype, uint8_t* dst);

ConvertFn PickConvert() {
  // Every ISA's ConvertRow quantises q8_0 rows with the one quantiser of kv_dtype.h.
  const IsaLevel isa = ActiveIsa();
  return isa >= IsaLevel::kAvx512 ? attn::avx512::ConvertRow
         : isa >= IsaLevel::kAvx2 ? attn::avx2::ConvertRow
                                  : attn::scalar::ConvertRow;
}

// Values below which a conversion stays on the calling thread (a decode step's few rows).
constexpr int64_t kParallelConvertValues = 1 << 15;

}  // namespace

void WriteKvCpu(const float* k, const float* v, int n, int64_t stride, int n_kv_heads, int head_dim,
                const KvLayerRef& kv, int64_t slot_begin) {
  if (k == nullptr || v == nullptr || n <= 0 || kv.block_tokens <= 0 || slot_begin < 0 ||
      slot_begin + n > static_cast<int64_t>(kv.n_blocks) * kv.block_tokens) {
    return;
  }
  const ConvertFn convert = PickConvert();
  const bool tiled = kv.k_tiled(head_dim);
  auto write = [&](int64_t t0, int64_t t1) {
    // A tiled K row on its way in; reused, as a decode step writes here for every layer.
    thread_local std::vector<uint8_t> row;
    row.resize(tiled ? KvRowBytes(kv.dtype, head_dim) : 0);
    for (int64_t t = t0; t < t1; ++t) {
      for (int h = 0; h < n_kv_heads; ++h) {
        const int64_t off = t * stride + static_cast<int64_t>(h) * head_dim;
        if (tiled) {  // converted as a row, then put in its tile
          convert(k + off, head_dim, kv.dtype, row.data());
          kv.WriteK(slot_begin + t, h, head_dim, row.data());
        } else {
          convert(k + off, head_dim, kv.dtype, kv.k_at(slot_begin + t, h, head_dim));
        }
        convert(v + off, head_dim, kv.dtype, kv.v_at(slot_begin + t, h, head_dim));
      }
    }
  };
  // A prefill's rows in parallel: slots are distinct, and so are the bytes they write (a tiled
  // K's slots share tiles but not words).
  if (int64_t{n} * n_kv_heads * head_dim * 2 < kParallelConvertValues) {
    write(0, n);
  } else {
    ParallelFor(n, write);
  }
}

void ConvertRowsCpu(const float* src, int64_t rows, int64_t src_ld, int n, KvDtype dtype,
                    uint8_t* dst, int64_t dst_ld) {
  if (rows <= 0 || n <= 0) return;
  const ConvertFn convert = PickConvert();
  auto run = [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) convert(src + r * src_ld, n, dtype, dst + r * dst_ld);
  };
  if (rows * n < kParallelConvertValues) {
    run(0, rows);
  } else {
    ParallelFor(rows, run);
  }
}

}  // namespace tripod
