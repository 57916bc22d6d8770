// Prefill attention on the tensor cores (mma.sync m16n8k16, f16 operands, fp32 accumulation), in
// the manner of FlashAttention-2: a block takes 64 query rows of one head (16 per warp), walks the
// visible K/V in tiles of 64 slots staged in shared memory, and keeps scores, probabilities and the
// output in registers: the scores' accumulator layout is the probabilities' operand layout, so P
// never leaves the warp. The online softmax works in base 2 (q pre-scaled by log2 e). A bf16
// cache's K/V are converted to f16 as they are staged (saturated to f16's range): with bf16
// operands q and the probabilities keep 8 bits, and the bundled model's logits moved 1.1% from the
// CPU's, against 0.4% with f16. The fp32 CUDA-core kernel of attention.cu remains for decode, f32
// caches and other head sizes: on the 8B shape it made attention most of a long prefill
// (docs/cuda.md, "Figures behind the kernels' choices").
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "common/compute/cuda/cuda_kernels.h"
#include "common/compute/cuda/kv_address.cuh"

namespace tripod::cuda {
namespace {

constexpr int kRows = 64;   // query rows per block, 16 per warp
constexpr int kSlots = 64;  // K/V slots per tile
constexpr int kThreads = 128;

template <bool kHalf>
__device__ inline uint32_t Pack(float a, float b) {  // a in the low half (the lower column)
  if constexpr (kHalf) {
    __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&h);
  } else {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&h);
  }
}

// d += a (16x16, row-major) * b (16x8, column-major); fragments as PTX lays them out.
template <bool kHalf>
__device__ inline void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (kHalf) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

__device__ inline uint32_t Bf16ToF16(uint32_t x) {  // the low 16 bits
  const float f = fminf(fmaxf(__uint_as_float(x << 16), -65504.0f), 65504.0f);
  return __half_as_ushort(__float2half_rn(f));
}
__device__ inline uint32_t Bf16PairToF16(uint32_t w) {
  return Bf16ToF16(w & 0xffffu) | (Bf16ToF16(w >> 16) << 16);
}

// Slots [t0, t0 + kSlots) of KV head h into shared memory: K as rows [slot][KS], V transposed
// [d][VS] (the second operand of P V is V^T's rows). Slots outside [fv, last] are zeros.
template <int HD, int KS, int VS, bool kFromBf16>
__device__ inline void LoadTile(const KvView& kv, int h, int t0, int fv, int last, uint16_t* ksm,
                                uint16_t* vtsm) {
  constexpr int kPieces = kSlots * HD / 8;  // 16-byte pieces of K, then as many of V
  constexpr int kInFlight = 8;
  for (int base = threadIdx.x; base < 2 * kPieces; base += kThreads * kInFlight) {
    uint4 piece[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int pi = base + u * kThreads;
      piece[u] = make_uint4(0, 0, 0, 0);
      if (pi >= 2 * kPieces) continue;
      const bool is_k = pi < kPieces;
      const int e0 = (is_k ? pi : pi - kPieces) * 8;
      if (is_k && kv.k_tiled) {
        const int slot0 = t0 + (e0 / (kKvTileSlots * HD)) * kKvTileSlots;
        if (slot0 > last || slot0 + kKvTileSlots - 1 < fv) continue;
        piece[u] = *reinterpret_cast<const uint4*>(KvElem(kv, true, slot0, h, 0, HD) +
                                                   (e0 % (kKvTileSlots * HD)) * 2);
      } else {
        const int slot = t0 + e0 / HD;
        if (slot > last || slot < fv) continue;
        piece[u] = *reinterpret_cast<const uint4*>(KvElem(kv, is_k, slot, h, e0 % HD, HD));
      }
    }
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int pi = base + u * kThreads;
      if (pi >= 2 * kPieces) continue;
      const bool is_k = pi < kPieces;
      const int e0 = (is_k ? pi : pi - kPieces) * 8;
      uint32_t w[4] = {piece[u].x, piece[u].y, piece[u].z, piece[u].w};
      if constexpr (kFromBf16) {
#pragma unroll
        for (int i = 0; i < 4; ++i) w[i] = Bf16PairToF16(w[i]);
      }
      if (is_k && kv.k_tiled) {
        // Element e of a 16-slot group is slot (e % 32) / 2, column (e / 32) * 2 + e % 2: the
        // piece's words are columns d0, d0 + 1 of four consecutive slots.
        const int group = e0 / (kKvTileSlots * HD), e = e0 % (kKvTileSlots * HD);
        const int j0 = group * kKvTileSlots + (e % 32) / 2, d0 = (e / 32) * 2;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int slot = t0 + j0 + i;
          *reinterpret_cast<uint32_t*>(&ksm[(j0 + i) * KS + d0]) =
              slot >= fv && slot <= last ? w[i] : 0u;
        }
      } else if (is_k) {
        *reinterpret_cast<uint4*>(&ksm[(e0 / HD) * KS + e0 % HD]) =
            make_uint4(w[0], w[1], w[2], w[3]);
      } else {
        const int j = e0 / HD, d0 = e0 % HD;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          vtsm[(d0 + i) * VS + j] = static_cast<uint16_t>(w[i / 2] >> (16 * (i & 1)));
        }
      }
    }
  }
}

template <int HD, bool kFromBf16>
__global__ void __launch_bounds__(kThreads)
    AttentionMmaKernel(const __grid_constant__ AttnBatch b) {
  constexpr int KS = HD + 8;  // padded rows: the fragment loads hit 32 different banks
  constexpr int VS = kSlots + 8;
  __shared__ alignas(16) uint16_t ksm[kSlots * KS];  // also stages Q (kRows == kSlots)
  __shared__ alignas(16) uint16_t vtsm[HD * VS];
  const AttnSeq& s = b.seqs[blockIdx.y];
  const int head = blockIdx.z;
  const int kvh = head / (b.n_heads / b.n_kv_heads);
  const int q0 = blockIdx.x * kRows;
  if (q0 >= s.n_q) return;  // the whole block
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wr = warp * 16;

  // Q, scaled by scale * log2(e) and converted, through shared memory into fragments.
  const float qscale = b.scale * 1.4426950408889634f;
  for (int idx = threadIdx.x; idx < kRows * HD / 2; idx += kThreads) {
    const int r = idx / (HD / 2), c = (idx % (HD / 2)) * 2;
    float x0 = 0, x1 = 0;
    if (q0 + r < s.n_q) {
      const float* qr = s.q + static_cast<int64_t>(q0 + r) * s.q_stride + head * HD + c;
      x0 = qr[0] * qscale;
      x1 = qr[1] * qscale;
    }
    *reinterpret_cast<uint32_t*>(&ksm[r * KS + c]) = Pack<true>(x0, x1);
  }
  __syncthreads();
  uint32_t qf[HD / 16][4];
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) {
    qf[kk][0] = *reinterpret_cast<const uint32_t*>(&ksm[(wr + g) * KS + kk * 16 + 2 * t]);
    qf[kk][1] = *reinterpret_cast<const uint32_t*>(&ksm[(wr + g + 8) * KS + kk * 16 + 2 * t]);
    qf[kk][2] = *reinterpret_cast<const uint32_t*>(&ksm[(wr + g) * KS + kk * 16 + 8 + 2 * t]);
    qf[kk][3] = *reinterpret_cast<const uint32_t*>(&ksm[(wr + g + 8) * KS + kk * 16 + 8 + 2 * t]);
  }

  float o[HD / 8][4];
#pragma unroll
  for (int nt = 0; nt < HD / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0, 0};
  const int fv = s.kv.first_visible;
  const int block_last = s.n_past + min(q0 + kRows, s.n_q) - 1;
  const int row_last[2] = {s.n_past + q0 + wr + g, s.n_past + q0 + wr + g + 8};
  const int warp_last = s.n_past + q0 + wr + 15;  // the last slot any row of the warp sees
  const bool warp_active = q0 + wr < s.n_q;

  for (int t0 = (fv / kSlots) * kSlots; t0 <= block_last; t0 += kSlots) {
    __syncthreads();  // Q's staging and the last tile are done with
    LoadTile<HD, KS, VS, kFromBf16>(s.kv, kvh, t0, fv, block_last, ksm, vtsm);
    __syncthreads();
    if (!warp_active || t0 > warp_last) continue;

    float sc[kSlots / 8][4];
#pragma unroll
    for (int nt = 0; nt < kSlots / 8; ++nt) {
      sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0;
#pragma unroll
      for (int kk = 0; kk < HD / 16; ++kk) {
        const uint16_t* kr = &ksm[(nt * 8 + g) * KS + kk * 16 + 2 * t];
        Mma<true>(sc[nt], qf[kk], *reinterpret_cast<const uint32_t*>(kr),
                  *reinterpret_cast<const uint32_t*>(kr + 8));
      }
    }
    // Mask, then the rows' running max (a row's 64 scores lie with the 4 lanes of its group).
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int nt = 0; nt < kSlots / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int slot = t0 + nt * 8 + 2 * t + (e & 1);
        if (slot < fv || slot > row_last[e >> 1]) sc[nt][e] = -INFINITY;
        mx[e >> 1] = fmaxf(mx[e >> 1], sc[nt][e]);
      }
    }
    float corr[2], mu[2], psum[2] = {0, 0};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      mu[r] = mx[r] == -INFINITY ? 0.0f : mx[r];
      corr[r] = exp2f(m[r] - mu[r]);  // 0 while nothing was visible
      m[r] = mx[r];
    }
#pragma unroll
    for (int nt = 0; nt < kSlots / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        sc[nt][e] = exp2f(sc[nt][e] - mu[e >> 1]);  // masked: exp2(-inf) = 0
        psum[e >> 1] += sc[nt][e];
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = l[r] * corr[r] + psum[r];
#pragma unroll
    for (int nt = 0; nt < HD / 8; ++nt) {
      o[nt][0] *= corr[0];
      o[nt][1] *= corr[0];
      o[nt][2] *= corr[1];
      o[nt][3] *= corr[1];
    }
    // O += P V: the score accumulators of slot tiles 2ks and 2ks + 1 are P's fragment for
    // slots [16 ks, 16 ks + 16).
#pragma unroll
    for (int ks = 0; ks < kSlots / 16; ++ks) {
      const uint32_t a[4] = {Pack<true>(sc[2 * ks][0], sc[2 * ks][1]),
                             Pack<true>(sc[2 * ks][2], sc[2 * ks][3]),
                             Pack<true>(sc[2 * ks + 1][0], sc[2 * ks + 1][1]),
                             Pack<true>(sc[2 * ks + 1][2], sc[2 * ks + 1][3])};
#pragma unroll
      for (int nt = 0; nt < HD / 8; ++nt) {
        const uint16_t* vr = &vtsm[(nt * 8 + g) * VS + ks * 16 + 2 * t];
        Mma<true>(o[nt], a, *reinterpret_cast<const uint32_t*>(vr),
                  *reinterpret_cast<const uint32_t*>(vr + 8));
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int qi = q0 + wr + g + 8 * r;
    if (qi >= s.n_q) continue;
    float* out = s.out + static_cast<int64_t>(qi) * s.out_stride + head * HD + 2 * t;
    const float inv = l[r] > 0 ? 1.0f / l[r] : 0.0f;
#pragma unroll
    for (int nt = 0; nt < HD / 8; ++nt) {
      out[nt * 8] = o[nt][2 * r] * inv;
      out[nt * 8 + 1] = o[nt][2 * r + 1] * inv;
    }
  }
}

template <int HD>
void Launch(const AttnBatch& b, cudaStream_t stream, bool from_bf16) {
  const dim3 grid((b.max_n_q + kRows - 1) / kRows, b.n_seqs, b.n_heads);
  if (from_bf16) {
    AttentionMmaKernel<HD, true><<<grid, kThreads, 0, stream>>>(b);
  } else {
    AttentionMmaKernel<HD, false><<<grid, kThreads, 0, stream>>>(b);
  }
}

}  // namespace

bool AttentionMma(const AttnBatch& b, cudaStream_t s) {
  if (b.n_seqs == 0 || b.max_n_q < kMmaMinQueries) return false;
  const int dtype = b.seqs[0].kv.dtype;
  if (dtype != 1 && dtype != 2) return false;  // f32 caches: the CUDA-core kernel
  for (int i = 1; i < b.n_seqs; ++i) {
    if (b.seqs[i].kv.dtype != dtype) return false;
  }
  if (b.n_heads % b.n_kv_heads != 0) return false;
  switch (b.head_dim) {
    case 64:
      Launch<64>(b, s, dtype == 2);
      return true;
    case 128:
      Launch<128>(b, s, dtype == 2);
      return true;
    default:
      return false;
  }
}

}  // namespace tripod::cuda
