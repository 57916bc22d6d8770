// The CUDA backend's K/V write and attention kernels, over the cache's own layout (blocks, K's
// 16-slot tiles for the 2-byte types; common/kv/kv_layout.h) so that a cache written here is the
// same bytes as one written on the CPU.
//
// Attention is tiled with an online softmax (never the n x n matrix), fp32 arithmetic on the CUDA
// cores: one block per (sequence, KV head, tile of queries), one warp per (query, query head of
// the group), so that each 32-slot K/V tile, converted to fp32 in shared memory, serves every
// query head of the group and every query of the tile. In a warp, lane j scores slot j of the
// tile (the whole dot product, q broadcast from shared memory), then each lane accumulates its
// head_dim / 32 output columns over the tile's 32 probabilities.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "common/compute/cuda/cuda_kernels.h"
#include "common/compute/cuda/kv_address.cuh"

namespace tripod::cuda {
namespace {

constexpr int kTile = 32;  // slots per K/V tile
constexpr int kMaxWarps = 16;

__device__ inline float LoadElem(const uint8_t* p, int dtype) {
  if (dtype == 0) return *reinterpret_cast<const float*>(p);
  if (dtype == 1) return __half2float(*reinterpret_cast<const __half*>(p));
  return __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(p));
}

__device__ inline void StoreElem(uint8_t* p, int dtype, float v) {
  if (dtype == 0) {
    *reinterpret_cast<float*>(p) = v;
  } else if (dtype == 1) {
    *reinterpret_cast<__half*>(p) = __float2half_rn(v);
  } else {
    *reinterpret_cast<__nv_bfloat16*>(p) = __float2bfloat16_rn(v);
  }
}

// One sequence per grid.z; its rows over grid.y, each row's n_kv_heads * head_dim columns over x.
// The batch is the kernel's parameter (WriteKvKernel) or, in a step replayed as a graph, device
// memory rewritten before each replay (WriteKvKernelAt); both run this body.
__device__ __forceinline__ void WriteKvBody(const KvWriteBatch& b) {
  const KvWrite& w = b.w[blockIdx.z];
  const int cols = b.n_kv_heads * b.head_dim;
  for (int t = blockIdx.y; t < w.n; t += gridDim.y) {
    for (int col = blockIdx.x * blockDim.x + threadIdx.x; col < cols;
         col += gridDim.x * blockDim.x) {
      const int h = col / b.head_dim, d = col - h * b.head_dim;
      StoreElem(KvElem(w.kv, true, w.slot_begin + t, h, d, b.head_dim), w.kv.dtype,
                w.k[t * w.ld + col]);
      StoreElem(KvElem(w.kv, false, w.slot_begin + t, h, d, b.head_dim), w.kv.dtype,
                w.v[t * w.ld + col]);
    }
  }
}
__global__ void WriteKvKernel(const __grid_constant__ KvWriteBatch b) { WriteKvBody(b); }
__global__ void WriteKvKernelAt(const KvWriteBatch* __restrict__ b) { WriteKvBody(*b); }

// Copies slots [t0, t0 + kTile) of KV head h into shared memory as fp32 (ks padded rows of
// HD + 1, vs rows of HD), zeros for slots outside [fv, last] (their bytes may be anything, and
// 0 * NaN would poison the sums). Each thread moves 16-byte pieces, several in flight: with one
// element per load the tile's loads ran one latency after another.
__device__ inline uint32_t Word(const uint4& p, int i) {
  return i == 0 ? p.x : (i == 1 ? p.y : (i == 2 ? p.z : p.w));
}

// Element k of a 16-byte piece of EB-byte elements.
template <int EB>
__device__ inline float PieceElem(const uint4& p, int k, int dtype) {
  if constexpr (EB == 4) {
    return __uint_as_float(Word(p, k));
  } else {
    const uint32_t bits = (Word(p, k / 2) >> (16 * (k & 1))) & 0xffffu;
    return dtype == 1 ? __half2float(__ushort_as_half(static_cast<unsigned short>(bits)))
                      : __uint_as_float(bits << 16);
  }
}

template <int HD, int EB>
__device__ inline void LoadTile(const KvView& kv, int h, int t0, int fv, int last, float* ks,
                                float* vs) {
  constexpr int per = 16 / EB;  // elements per 16-byte piece
  const int n_vec = kTile * HD / per;
  constexpr int kInFlight = 4;
  for (int base = threadIdx.x; base < 2 * n_vec; base += blockDim.x * kInFlight) {
    uint4 piece[kInFlight];
    int first[kInFlight];  // first element of the piece, -1: none
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int vi = base + u * blockDim.x;
      first[u] = -1;
      piece[u] = make_uint4(0, 0, 0, 0);
      if (vi >= 2 * n_vec) continue;
      const bool is_k = vi < n_vec;
      const int e0 = (is_k ? vi : vi - n_vec) * per;
      const uint8_t* addr;
      int lo, hi;  // the piece's slots
      if (is_k && kv.k_tiled) {
        const int group = e0 / (kKvTileSlots * HD), e = e0 % (kKvTileSlots * HD);
        const int slot0 = t0 + group * kKvTileSlots;
        lo = slot0 + (e % 32) / 2;
        hi = lo + per / 2 - 1;
        if (slot0 > last || slot0 + kKvTileSlots - 1 < fv) continue;
        addr = KvElem(kv, true, slot0, h, 0, HD) + e * 2;
      } else {
        lo = hi = t0 + e0 / HD;
        if (lo > last || lo < fv) continue;
        addr = KvElem(kv, is_k, lo, h, e0 % HD, HD);
      }
      if (hi < fv || lo > last) continue;
      piece[u] = *reinterpret_cast<const uint4*>(addr);
      first[u] = e0;
    }
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int vi = base + u * blockDim.x;
      if (vi >= 2 * n_vec) continue;
      const bool is_k = vi < n_vec;
      const int e0 = (is_k ? vi : vi - n_vec) * per;
#pragma unroll
      for (int k = 0; k < per; ++k) {
        const int e = e0 + k;
        int j, d;
        if (is_k && kv.k_tiled) {
          const int group = e / (kKvTileSlots * HD), ee = e % (kKvTileSlots * HD);
          j = group * kKvTileSlots + (ee % 32) / 2;
          d = (ee / 32) * 2 + (ee & 1);
        } else {
          j = e / HD;
          d = e % HD;
        }
        const int slot = t0 + j;
        const float x = first[u] >= 0 && slot >= fv && slot <= last
                            ? PieceElem<EB>(piece[u], k, kv.dtype)
                            : 0.0f;
        if (is_k) {
          ks[j * (HD + 1) + d] = x;
        } else {
          vs[j * HD + d] = x;
        }
      }
    }
  }
}

template <int HD>
__device__ __forceinline__ void AttentionBody(const AttnBatch& b, int qt) {
  const AttnSeq& s = b.seqs[blockIdx.y];
  const int group = b.n_heads / b.n_kv_heads;
  const int kvh = blockIdx.z;
  // Decode (splits > 1): blockIdx.x is the share of the slots this block takes (flash-decoding),
  // else the tile of queries.
  const int split = b.splits > 1 ? blockIdx.x : 0;
  const int q0 = b.splits > 1 ? 0 : blockIdx.x * qt;
  if (q0 >= s.n_q) return;  // the whole block
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int qi = q0 + warp / group;
  const int head = kvh * group + warp % group;
  const bool active = qi < s.n_q;

  extern __shared__ float sm[];
  float* ks = sm;                     // [kTile][HD + 1] (padded: lane j reads row j)
  float* vs = ks + kTile * (HD + 1);  // [kTile][HD]
  float* qs = vs + kTile * HD + warp * HD;
  if (active) {
    for (int d = lane; d < HD; d += 32) qs[d] = s.q[qi * s.q_stride + head * HD + d] * b.scale;
  }
  __syncwarp();

  const KvView& kv = s.kv;
  const int q_last = min(q0 + qt, s.n_q) - 1;
  const int block_last = s.n_past + q_last;  // the last slot any query of the block sees
  const int my_last = s.n_past + qi;
  const int fv = kv.first_visible;
  float m = -INFINITY, l = 0;
  float o[HD / 32];
#pragma unroll
  for (int t = 0; t < HD / 32; ++t) o[t] = 0;

  int t_begin = (fv / kTile) * kTile, t_end = block_last + 1;
  if (b.splits > 1) {
    const int tiles = (block_last - t_begin) / kTile + 1;
    const int per = (tiles + b.splits - 1) / b.splits;
    t_end = min(t_end, t_begin + (split + 1) * per * kTile);
    t_begin += split * per * kTile;
  }
  for (int t0 = t_begin; t0 < t_end; t0 += kTile) {
    __syncthreads();
    if (kv.dtype == 0) {
      LoadTile<HD, 4>(kv, kvh, t0, fv, block_last, ks, vs);
    } else {
      LoadTile<HD, 2>(kv, kvh, t0, fv, block_last, ks, vs);
    }
    __syncthreads();
    if (!active) continue;
    const int slot = t0 + lane;
    float sc = -INFINITY;
    if (slot >= fv && slot <= my_last) {
      const float* kr = ks + lane * (HD + 1);
      float acc = 0;
#pragma unroll 16
      for (int d = 0; d < HD; ++d) acc += qs[d] * kr[d];
      sc = acc;
    }
    float tmax = sc;
    for (int off = 16; off > 0; off >>= 1)
      tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, off));
    const float m_new = fmaxf(m, tmax);
    if (m_new == -INFINITY) continue;  // nothing visible to this query yet
    const float p = sc == -INFINITY ? 0.0f : __expf(sc - m_new);
    const float corr = m == -INFINITY ? 0.0f : __expf(m - m_new);
    float psum = p;
    for (int off = 16; off > 0; off >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, off);
    l = l * corr + psum;
#pragma unroll
    for (int t = 0; t < HD / 32; ++t) o[t] *= corr;
    for (int j = 0; j < kTile; ++j) {
      const float pj = __shfl_sync(0xffffffffu, p, j);
      const float* vr = vs + j * HD;
#pragma unroll
      for (int t = 0; t < HD / 32; ++t) o[t] += pj * vr[lane + 32 * t];
    }
    m = m_new;
  }
  if (!active) return;
  if (b.splits > 1) {  // this share's unnormalised output, max and sum, for CombineSplits
    float* part =
        b.partial +
        ((static_cast<int64_t>(blockIdx.y) * b.n_heads + head) * b.splits + split) * (HD + 2);
#pragma unroll
    for (int t = 0; t < HD / 32; ++t) part[lane + 32 * t] = o[t];
    if (lane == 0) {
      part[HD] = m;
      part[HD + 1] = l;
    }
    return;
  }
  float* out = s.out + qi * s.out_stride + head * HD;
  const float inv = l > 0 ? 1.0f / l : 0.0f;
#pragma unroll
  for (int t = 0; t < HD / 32; ++t) out[lane + 32 * t] = o[t] * inv;
}
template <int HD>
__global__ void __launch_bounds__(kMaxWarps * 32)
    AttentionKernel(const __grid_constant__ AttnBatch b, int qt) {
  AttentionBody<HD>(b, qt);
}
template <int HD>
__global__ void __launch_bounds__(kMaxWarps * 32)
    AttentionKernelAt(const AttnBatch* __restrict__ b, int qt) {
  AttentionBody<HD>(*b, qt);
}

// Merges a decode query's shares: weights e^(m_s - max m), output sum o_s weighted over sum l_s
// weighted. One block per (sequence, query head), one thread per column.
__device__ __forceinline__ void CombineSplitsBody(const AttnBatch& b) {
  const AttnSeq& s = b.seqs[blockIdx.x];
  const int head = blockIdx.y, d = threadIdx.x;
  const int hd = b.head_dim;
  const float* part =
      b.partial + (static_cast<int64_t>(blockIdx.x) * b.n_heads + head) * b.splits * (hd + 2);
  float m = -INFINITY;
  for (int i = 0; i < b.splits; ++i) m = fmaxf(m, part[i * (hd + 2) + hd]);
  float l = 0, o = 0;
  if (m != -INFINITY) {
    for (int i = 0; i < b.splits; ++i) {
      const float mi = part[i * (hd + 2) + hd];
      if (mi == -INFINITY) continue;
      const float w = __expf(mi - m);
      l += w * part[i * (hd + 2) + hd + 1];
      o += w * part[i * (hd + 2) + d];
    }
  }
  s.out[head * hd + d] = l > 0 ? o / l : 0.0f;
}
__global__ void CombineSplitsKernel(const __grid_constant__ AttnBatch b) { CombineSplitsBody(b); }
__global__ void CombineSplitsKernelAt(const AttnBatch* __restrict__ b) { CombineSplitsBody(*b); }

// The grid comes from the shape; the batch travels by value, or sits at `at` in device memory.
template <int HD>
bool LaunchAttention(const AttnShape& sh, const AttnBatch* b, const AttnBatch* at,
                     cudaStream_t stream) {
  const int group = sh.n_heads / sh.n_kv_heads;
  if (group < 1 || group > kMaxWarps) return false;
  const int qt = sh.max_n_q <= 1 ? 1 : kMaxWarps / group;
  const int warps = group * qt;
  const size_t smem = sizeof(float) * (kTile * (HD + 1) + kTile * HD + warps * HD);
  const int x = sh.splits > 1 ? sh.splits : (sh.max_n_q + qt - 1) / qt;
  const dim3 grid(x, sh.n_seqs, sh.n_kv_heads);
  if (at != nullptr) {
    AttentionKernelAt<HD><<<grid, warps * 32, smem, stream>>>(at, qt);
  } else {
    AttentionKernel<HD><<<grid, warps * 32, smem, stream>>>(*b, qt);
  }
  if (sh.splits > 1) {
    const dim3 cgrid(sh.n_seqs, sh.n_heads);
    if (at != nullptr) {
      CombineSplitsKernelAt<<<cgrid, HD, 0, stream>>>(at);
    } else {
      CombineSplitsKernel<<<cgrid, HD, 0, stream>>>(*b);
    }
  }
  return true;
}

bool LaunchAttention(const AttnShape& sh, const AttnBatch* b, const AttnBatch* at, cudaStream_t s) {
  if (sh.n_seqs == 0 || sh.max_n_q == 0) return true;
  switch (sh.head_dim) {
    case 64:
      return LaunchAttention<64>(sh, b, at, s);
    case 128:
      return LaunchAttention<128>(sh, b, at, s);
    default:
      return false;
  }
}

// Scoring, pass 1: per (query, query head), the softmax's max and normaliser over the slots the
// query sees. One warp each.
__global__ void ScoreStatsKernel(const ScoreArgs a, float* stats) {
  const int i = blockIdx.x, hq = blockIdx.y, lane = threadIdx.x;
  const int group = a.n_heads / a.n_kv_heads, h = hq / group;
  const float* q = a.q + i * a.q_stride + int64_t{hq} * a.head_dim;
  const int last = a.q_slot0 + i;
  float m = -INFINITY, l = 0;
  for (int base = a.kv.first_visible; base <= last; base += 32) {
    const int slot = base + lane;
    float sc = -INFINITY;
    if (slot <= last) {
      float acc = 0;
      for (int d = 0; d < a.head_dim; ++d) {
        acc += q[d] * LoadElem(KvElem(a.kv, true, slot, h, d, a.head_dim), a.kv.dtype);
      }
      sc = acc * a.scale;
    }
    float tmax = sc;
    for (int off = 16; off > 0; off >>= 1)
      tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, off));
    const float m_new = fmaxf(m, tmax);
    float p = sc == -INFINITY ? 0.0f : __expf(sc - m_new);
    for (int off = 16; off > 0; off >>= 1) p += __shfl_xor_sync(0xffffffffu, p, off);
    l = (m == -INFINITY ? 0.0f : l * __expf(m - m_new)) + p;
    m = m_new;
  }
  if (lane == 0) {
    stats[(int64_t{i} * a.n_heads + hq) * 2] = m;
    stats[(int64_t{i} * a.n_heads + hq) * 2 + 1] = l;
  }
}

// Pass 2: per (KV head, key), the max over the group's heads and the queries of the (weighted)
// probability, and their sum. One thread each.
__global__ void ScoreReduceKernel(const ScoreArgs a, const float* stats, float* max_out,
                                  float* sum_out) {
  const int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (idx >= int64_t{a.n_kv_heads} * a.n_keys) return;
  const int h = static_cast<int>(idx / a.n_keys), j = static_cast<int>(idx % a.n_keys);
  const int group = a.n_heads / a.n_kv_heads;
  float mx = 0, sum = 0;
  if (j >= a.kv.first_visible) {
    for (int g = 0; g < group; ++g) {
      const int hq = h * group + g;
      for (int i = 0; i < a.n_q; ++i) {
        if (j > a.q_slot0 + i) continue;
        const float* q = a.q + i * a.q_stride + int64_t{hq} * a.head_dim;
        float acc = 0;
        for (int d = 0; d < a.head_dim; ++d) {
          acc += q[d] * LoadElem(KvElem(a.kv, true, j, h, d, a.head_dim), a.kv.dtype);
        }
        const float mi = stats[(int64_t{i} * a.n_heads + hq) * 2];
        const float li = stats[(int64_t{i} * a.n_heads + hq) * 2 + 1];
        const float p = li > 0 ? __expf(acc * a.scale - mi) / li : 0.0f;
        const float w = !a.ramp || a.n_q == 1 ? 1.0f : static_cast<float>(i) / (a.n_q - 1);
        mx = fmaxf(mx, w * p);
        sum += p;
      }
    }
  }
  max_out[idx] = mx;
  sum_out[idx] = sum;
}

}  // namespace

namespace {
dim3 WriteKvGrid(const KvWriteShape& sh) {
  const int cols = sh.n_kv_heads * sh.head_dim;
  return dim3((cols + 255) / 256, sh.max_n < 65535 ? sh.max_n : 65535, sh.count);
}
bool WriteKvEmpty(const KvWriteShape& sh) {
  return sh.count == 0 || sh.max_n == 0 || sh.n_kv_heads * sh.head_dim == 0;
}
}  // namespace

KvWriteShape ShapeOf(const KvWriteBatch& b) {
  return KvWriteShape{b.count, b.n_kv_heads, b.head_dim, b.max_n};
}
AttnShape ShapeOf(const AttnBatch& b) {
  return AttnShape{b.n_seqs, b.n_heads, b.n_kv_heads, b.head_dim, b.max_n_q, b.splits};
}

void WriteKv(const KvWriteBatch& b, cudaStream_t s) {
  const KvWriteShape sh = ShapeOf(b);
  if (WriteKvEmpty(sh)) return;
  WriteKvKernel<<<WriteKvGrid(sh), 256, 0, s>>>(b);
}
void WriteKvAt(const KvWriteShape& sh, const KvWriteBatch* at, cudaStream_t s) {
  if (WriteKvEmpty(sh)) return;
  WriteKvKernelAt<<<WriteKvGrid(sh), 256, 0, s>>>(at);
}

bool Attention(const AttnBatch& b, cudaStream_t s) {
  return LaunchAttention(ShapeOf(b), &b, nullptr, s);
}
bool AttentionAt(const AttnShape& sh, const AttnBatch* at, cudaStream_t s) {
  return LaunchAttention(sh, nullptr, at, s);
}

void AttentionScores(const ScoreArgs& a, float* stats, float* max_out, float* sum_out,
                     cudaStream_t s) {
  if (a.n_q == 0 || a.n_keys == 0) return;
  ScoreStatsKernel<<<dim3(a.n_q, a.n_heads), 32, 0, s>>>(a, stats);
  const int64_t total = int64_t{a.n_kv_heads} * a.n_keys;
  ScoreReduceKernel<<<static_cast<int>((total + 127) / 128), 128, 0, s>>>(a, stats, max_out,
                                                                          sum_out);
}

}  // namespace tripod::cuda
