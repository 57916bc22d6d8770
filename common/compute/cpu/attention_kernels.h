// The attention block kernel, written once over a vector-traits class `Vec` and compiled into each
// ISA file (attention_avx2.cc, attention_avx512.cc) with that file's flags. Include only from
// those files after defining Vec; everything here has internal linkage.
//
// Per 64-slot tile: convert K and V to fp32, S = Q K^T (scaled Q), online softmax, O += P V.
// Many rows (prefill): K is transposed into [d][slot] so a 4-row x (kCV vectors of slots)
// register tile does 4 * kCV FMAs per 4 + kCV loads (a stored K tile, kv_layout.h, unzips into
// it directly). Few rows (decode, DecodeRows): straight from the cache, 16 slots at a time; a
// tiled K gives the scores with the slots across the lanes, K rows give dot products along d per
// slot, reduced W slots at a time.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "common/compute/cpu/attention_internal.h"

namespace tripod::attn {
namespace {

constexpr int kWideRows = 16;  // from this many rows on, the transposed-K path pays off
constexpr float kNegInf = -__builtin_inff();

inline int Imin(int64_t a, int64_t b) { return static_cast<int>(a < b ? a : b); }

// Elements [e, e + W) of a q8_0 row as fp32 (W divides 32, e a multiple of W: one block).
template <class V>
inline typename V::T LoadQ8Elements(const uint8_t* row, int e) {
  const uint8_t* blk = row + (e / kKvQ8Block) * kKvQ8BlockBytes;
  uint16_t h;
  __builtin_memcpy(&h, blk, 2);
  const int8_t* q = reinterpret_cast<const int8_t*>(blk + 2) + e % kKvQ8Block;
  return V::Mul(V::LoadQ8(q), V::Set1(_cvtsh_ss(h)));
}

// dst[0..head_dim) = slot's K (or V) row as fp32.
template <class V>
inline void LoadRow(const uint8_t* src, KvDtype dt, int head_dim, float* dst) {
  constexpr int W = V::W;
  if (dt == KvDtype::kQ8_0) {
    for (int d = 0; d < head_dim; d += W) V::Store(dst + d, LoadQ8Elements<V>(src, d));
  } else if (dt == KvDtype::kF32) {
    const float* s = reinterpret_cast<const float*>(src);
    for (int d = 0; d < head_dim; d += W) V::Store(dst + d, V::Load(s + d));
  } else if (dt == KvDtype::kF16) {
    const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
    for (int d = 0; d < head_dim; d += W) V::Store(dst + d, V::LoadF16(s + d));
  } else {
    const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
    for (int d = 0; d < head_dim; d += W) V::Store(dst + d, V::LoadBf16(s + d));
  }
}

// S[r][c0 .. c0 + kCV*W) for RB rows from the transposed K tile kt[d][kKeyTile].
template <class V, int RB>
inline void WideS(const float* q, int head_dim, const float* kt, int c0, float* s) {
  constexpr int CV = V::kCV;
  typename V::T acc[RB][CV];
  for (int r = 0; r < RB; ++r)
    for (int c = 0; c < CV; ++c) acc[r][c] = V::Zero();
  for (int d = 0; d < head_dim; ++d) {
    typename V::T kv[CV];
    for (int c = 0; c < CV; ++c) kv[c] = V::Load(kt + d * kKeyTile + c0 + c * V::W);
    for (int r = 0; r < RB; ++r) {
      const typename V::T qb = V::Set1(q[r * head_dim + d]);
      for (int c = 0; c < CV; ++c) acc[r][c] = V::Fma(qb, kv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int c = 0; c < CV; ++c) V::Store(s + r * kKeyTile + c0 + c * V::W, acc[r][c]);
}

// O[r][dc .. dc + kDCV*W) += sum_j P[r][j] V[j][...] for RB rows over n slots.
template <class V, int RB>
inline void WidePV(const float* p, const float* vt, int n, int head_dim, int dc, float* o) {
  constexpr int CV = V::kDCV;
  typename V::T acc[RB][CV];
  for (int r = 0; r < RB; ++r)
    for (int c = 0; c < CV; ++c) acc[r][c] = V::Load(o + r * head_dim + dc + c * V::W);
  for (int j = 0; j < n; ++j) {
    typename V::T vv[CV];
    for (int c = 0; c < CV; ++c) vv[c] = V::Load(vt + j * head_dim + dc + c * V::W);
    for (int r = 0; r < RB; ++r) {
      const typename V::T pb = V::Set1(p[r * kKeyTile + j]);
      for (int c = 0; c < CV; ++c) acc[r][c] = V::Fma(pb, vv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int c = 0; c < CV; ++c) V::Store(o + r * head_dim + dc + c * V::W, acc[r][c]);
}

template <class V, int RB>
inline void PVRows(const float* p, const float* vt, int n, int head_dim, float* o) {
  constexpr int step = V::kDCV * V::W;
  int dc = 0;
  for (; dc + step <= head_dim; dc += step) WidePV<V, RB>(p, vt, n, head_dim, dc, o);
  // head_dim is a multiple of W; finish a remainder narrower than kDCV vectors one at a time.
  for (; dc < head_dim; dc += V::W) {
    for (int r = 0; r < RB; ++r) {
      typename V::T acc = V::Load(o + r * head_dim + dc);
      for (int j = 0; j < n; ++j) {
        acc = V::Fma(V::Set1(p[r * kKeyTile + j]), V::Load(vt + j * head_dim + dc), acc);
      }
      V::Store(o + r * head_dim + dc, acc);
    }
  }
}

// A stored K tile (kv_layout.h) into the transposed staging tile: kt[d * kKeyTile + j] for its
// 16 slots j. Each element pair of W / 2 slots loads as W floats, and V::Unzip splits them by
// element.
template <class V>
inline void StageKTile(const uint8_t* tile, KvDtype dt, int head_dim, float* kt) {
  constexpr int W = V::W;
  for (int p = 0; p < head_dim / 2; ++p) {
    const uint16_t* src = reinterpret_cast<const uint16_t*>(tile + p * kKvKTile * 4);
    for (int j = 0; j < kKvKTile; j += W) {  // slots j .. j + W
      const typename V::T a =
          dt == KvDtype::kF16 ? V::LoadF16(src + 2 * j) : V::LoadBf16(src + 2 * j);
      const typename V::T b =
          dt == KvDtype::kF16 ? V::LoadF16(src + 2 * j + W) : V::LoadBf16(src + 2 * j + W);
      typename V::T even, odd;
      V::Unzip(a, b, &even, &odd);
      V::Store(kt + (2 * p) * kKeyTile + j, even);
      V::Store(kt + (2 * p + 1) * kKeyTile + j, odd);
    }
  }
}

template <class V>
void BlockImpl(const AttentionArgs& a, int kvh, int q0, int q1, int64_t k0, int64_t k1,
               float* scratch, float* o, float* m, float* l) {
  constexpr int W = V::W;
  const int D = a.head_dim;
  const int g = a.n_heads / a.n_kv_heads;
  const int rows = (q1 - q0) * g;
  const int rows_pad = (rows + 3) & ~3;
  float* q = scratch;                   // [rows_pad][D], pre-scaled
  float* s = q + rows_pad * D;          // [rows_pad][kKeyTile]
  float* kt = s + rows_pad * kKeyTile;  // [D][kKeyTile] or [kKeyTile][D]
  float* vt = kt + kKeyTile * D;        // [kKeyTile][D]
  const bool wide = rows >= kWideRows && !a.batch_invariant;

  const typename V::T vscale = V::Set1(a.scale);
  for (int r = 0; r < rows_pad; ++r) {
    float* qr = q + r * D;
    if (r < rows) {
      const int qi = q0 + r / g, h = kvh * g + r % g;
      const float* src = a.q + qi * a.q_stride + h * D;
      for (int d = 0; d < D; d += W) V::Store(qr + d, V::Mul(V::Load(src + d), vscale));
    } else {
      for (int d = 0; d < D; d += W) V::Store(qr + d, V::Zero());
    }
  }
  for (int r = 0; r < rows; ++r) {
    m[r] = kNegInf;
    l[r] = 0.0f;
    for (int d = 0; d < D; d += W) V::Store(o + r * D + d, V::Zero());
  }
  // The last query sees slots up to n_past + q1 - 1.
  const int64_t kend = k1 < a.n_past + q1 ? k1 : a.n_past + q1;
  alignas(64) float row_buf[512];  // one K row when transposing (head_dim <= 512)
  // A stored K row: in place, or gathered out of its tile (kv_layout.h) into krow.
  const bool k_tiled = a.kv.k_tiled(D);
  alignas(64) uint8_t krow[1024];  // tiled K is 2-byte: head_dim <= 512
  auto KRow = [&](int64_t t) -> const uint8_t* {
    if (!k_tiled) return a.kv.k_at(t, kvh, D);
    a.kv.ReadK(t, kvh, D, krow);
    return krow;
  };

  for (int64_t t0 = k0; t0 < kend; t0 += kKeyTile) {
    const int n = Imin(kKeyTile, kend - t0);
    // K tile.
    if (wide) {
      for (int j = 0; j < n;) {
        const int64_t t = t0 + j;
        if (k_tiled && t % kKvKTile == 0 && j + kKvKTile <= n) {  // a whole stored K tile
          StageKTile<V>(a.kv.k_at(t, kvh, D), a.kv.dtype, D, kt + j);
          j += kKvKTile;
          continue;
        }
        LoadRow<V>(KRow(t), a.kv.dtype, D, row_buf);
        for (int d = 0; d < D; ++d) kt[d * kKeyTile + j] = row_buf[d];
        ++j;
      }
      for (int d = 0; d < D; ++d)
        for (int j = n; j < kKeyTile; ++j) kt[d * kKeyTile + j] = 0.0f;
    } else {
      for (int j = 0; j < n; ++j) LoadRow<V>(KRow(t0 + j), a.kv.dtype, D, kt + j * D);
      // Zero rows past the tile end, so the W-slot loop below has a constant trip count (its
      // accumulators then stay in registers).
      for (int j = n; j < ((n + W - 1) / W) * W; ++j)
        for (int d = 0; d < D; ++d) kt[j * D + d] = 0.0f;
    }
    // S = Q K^T.
    if (wide) {
      int r = 0;
      for (; r + 4 <= rows_pad; r += 4) {
        for (int c0 = 0; c0 < kKeyTile; c0 += V::kCV * W) {
          WideS<V, 4>(q + r * D, D, kt, c0, s + r * kKeyTile);
        }
      }
    } else {
      for (int r = 0; r < rows; ++r) {
        const float* qr = q + r * D;
        for (int j0 = 0; j0 < n; j0 += W) {
          typename V::T acc[W];
          for (int jj = 0; jj < W; ++jj) acc[jj] = V::Zero();
          const float* kr = kt + j0 * D;
          for (int d = 0; d < D; d += W) {
            const typename V::T qv = V::Load(qr + d);
            for (int jj = 0; jj < W; ++jj) acc[jj] = V::Fma(qv, V::Load(kr + jj * D + d), acc[jj]);
          }
          V::ReduceW(acc, s + r * kKeyTile + j0);
        }
      }
    }
    // Online softmax; slots past a row's causal limit are a suffix of the tile.
    int max_valid = 0;
    for (int r = 0; r < rows; ++r) {
      float* sr = s + r * kKeyTile;
      const int64_t limit = a.n_past + q0 + r / g;  // last slot this row sees
      const int valid = limit < t0 ? 0 : Imin(n, limit - t0 + 1);
      if (valid > max_valid) max_valid = valid;
      if (valid == 0) {  // the whole tile is in this row's future: P = 0
        for (int j = 0; j < kKeyTile; ++j) sr[j] = 0.0f;
        continue;
      }
      for (int j = valid; j < kKeyTile; ++j) sr[j] = kNegInf;
      typename V::T mx = V::Set1(kNegInf);
      for (int j = 0; j < kKeyTile; j += W) mx = V::Max(mx, V::Load(sr + j));
      const float tile_max = V::ReduceMax(mx);
      const float m_new = tile_max > m[r] ? tile_max : m[r];
      const typename V::T vm = V::Set1(m_new);
      typename V::T sum = V::Zero();
      for (int j = 0; j < kKeyTile; j += W) {
        const typename V::T pj = V::Exp(V::Sub(V::Load(sr + j), vm));
        V::Store(sr + j, pj);
        sum = V::Add(sum, pj);
      }
      if (m[r] != kNegInf && m_new != m[r]) {
        const float corr = __builtin_expf(m[r] - m_new);
        l[r] *= corr;
        const typename V::T vc = V::Set1(corr);
        for (int d = 0; d < D; d += W) V::Store(o + r * D + d, V::Mul(V::Load(o + r * D + d), vc));
      }
      l[r] += V::ReduceAdd(sum);
      m[r] = m_new;
    }
    for (int r = rows; r < rows_pad; ++r)
      for (int j = 0; j < kKeyTile; ++j) s[r * kKeyTile + j] = 0.0f;
    if (max_valid == 0) continue;
    // V tile, then O += P V over the slots some row still sees.
    for (int j = 0; j < max_valid; ++j)
      LoadRow<V>(a.kv.v_at(t0 + j, kvh, D), a.kv.dtype, D, vt + j * D);
    int r = 0;
    for (; r + 4 <= rows; r += 4) PVRows<V, 4>(s + r * kKeyTile, vt, max_valid, D, o + r * D);
    switch (rows - r) {
      case 3:
        PVRows<V, 3>(s + r * kKeyTile, vt, max_valid, D, o + r * D);
        break;
      case 2:
        PVRows<V, 2>(s + r * kKeyTile, vt, max_valid, D, o + r * D);
        break;
      case 1:
        PVRows<V, 1>(s + r * kKeyTile, vt, max_valid, D, o + r * D);
        break;
      default:
        break;
    }
  }
}

// Decode: few query rows (the grouped heads of one or a few queries) against a long run of slots,
// the case that reads the whole KV cache per token and so decides decode speed at long context
// and under batching. Unlike BlockImpl it stages nothing: each K and V row is loaded from its
// cache block and converted in registers, and slots are walked tile by tile. One call may serve
// several KV heads, all of them per tile, so that it reads a block's K (and V) front to back.
// Tiles are kDecodeTile slots aligned to absolute slot numbers, and a row's arithmetic is the
// same whatever the other rows or heads of its task or its first slot: results are
// batch-invariant.
//
// bf16 KV where the ISA has bf16 dot products (V::kBf16Dot: vdpbf16ps, 32 products an
// instruction against 16 for an fp32 FMA): q is rounded to bf16 once per call and each tile's
// probabilities P once per tile, and QK and PV take half the instructions with no conversion of
// K or V. PV multiplies two slots at a time: their V rows are interleaved in registers
// (V::PairLo/PairHi), which permutes the output dims within each 32-dim group; the accumulators
// stay permuted and are put back in order once, at the end (V::UnpairBf16). It nearly halves the
// cycles a slot (docs/cpu-kernels.md, "Decode attention: bf16 dot products").
constexpr int kDecodeTile = 16;
// Prefetch distance in slots, into L2: L1 cannot hold that many slots ahead (docs/cpu-kernels.md,
// "Decode attention: prefetch distance").
constexpr int kDecodePrefetch = 128;
// Software prefetch only where a head's run of rows is shorter than kDecodeLongRun: longer runs
// are streams the hardware prefetcher follows, and there the prefetch instructions only cost
// issue slots; 16-slot paged blocks need it (docs/cpu-kernels.md, "Decode attention: software
// prefetch only for short runs").

template <class V, KvDtype DT>
inline typename V::T LoadKv(const uint8_t* p, int c) {
  if constexpr (DT == KvDtype::kF32) {
    return V::Load(reinterpret_cast<const float*>(p) + c * V::W);
  } else if constexpr (DT == KvDtype::kQ8_0) {
    return LoadQ8Elements<V>(p, c * V::W);
  } else if constexpr (DT == KvDtype::kF16) {
    return V::LoadF16(reinterpret_cast<const uint16_t*>(p) + c * V::W);
  } else {
    return V::LoadBf16(reinterpret_cast<const uint16_t*>(p) + c * V::W);
  }
}

constexpr int VecRegisters(int w) { return w == 16 ? 32 : 16; }

// Output rows per pass for DV vectors per head row. With 32 registers the accumulators of a pass
// fill half of them. With 16 (AVX2), rows sharing a KV head go in one pass, up to 4, and the
// scores and P V work through the accumulators in chunks (DecodeChunk): one row per pass
// converted each f16 K and V row once per query head (3 times per KV head on SmolLM2), which
// made decode attention after 2048 tokens compute-bound at ~half of DRAM speed.
template <class V, int DV>
constexpr int DecodeRowsPerPass() {
  if constexpr (VecRegisters(V::W) == 16) return 4;
  constexpr int rb = VecRegisters(V::W) / 2 / DV;
  return rb < 1 ? 1 : (rb > 4 ? 4 : rb);
}

// The most of a row's `total` accumulator registers (halving from total, a power of two) that
// rb rows can hold at once, besides a broadcast per row and the loaded K / V operands: one per
// accumulator of a row (operands = 1) or a single one (operands = 0, used as soon as loaded).
template <class V>
constexpr int DecodeChunk(int total, int rb, int operands) {
  int c = total;
  while (c > 1 && rb * c + (operands ? c : 1) + rb > VecRegisters(V::W)) c /= 2;
  return c;
}

// Whether DecodeRows<V, DT, DV> takes the bf16 dot path (see above): bf16 KV, an ISA with bf16
// dot products, and rows of whole 2W-element registers.
template <class V, KvDtype DT, int DV>
constexpr bool UsesBf16Dots() {
  if constexpr (DT == KvDtype::kBF16 && DV % 2 == 0) {
    return V::kBf16Dot;
  } else {
    return false;
  }
}

// Scores of RB rows against one K tile (kv_layout.h: [head_dim / 2][16 slots][2] elements):
// s[r][j] for the tile's 16 slots. q: the rows, D floats apart (scaled fp32, or for the bf16 dot
// path its bf16 pairs). Slots run across the lanes, so no horizontal sums: fp32 FMAs take each
// element pair of W / 2 slots against q's pair, and V::PairSums adds the pairs' halves; bf16 dots
// take the pairs as they lie. Meanwhile the tile's V rows (v_rows: kT rows in order, one 64-byte
// line per element pair, as both are 2-byte) are asked into L1, for the P V that follows.
template <class V, KvDtype DT, int DV, int RB>
inline void ScoreKTile(const uint8_t* tile, const float* q, float (*s)[kDecodeTile],
                       const uint8_t* v_rows) {
  using T = typename V::T;
  constexpr int W = V::W, D = DV * W, kT = kDecodeTile, kPairBytes = kT * 4;
  static_assert(kT == kKvKTile);
  if constexpr (UsesBf16Dots<V, DT, DV>()) {
    static_assert(kT == W);
    T acc[RB];
#pragma GCC unroll 16
    for (int r = 0; r < RB; ++r) acc[r] = V::Zero();
#pragma GCC unroll 8
    for (int p = 0; p < D / 2; ++p) {
      _mm_prefetch(reinterpret_cast<const char*>(v_rows + p * 64), _MM_HINT_T0);
      const T k = V::LoadRaw(tile + p * kPairBytes);
#pragma GCC unroll 16
      for (int r = 0; r < RB; ++r) {
        const T qp = V::Bcast32(reinterpret_cast<const uint16_t*>(q + r * D) + 2 * p);
        acc[r] = V::DotBf16(acc[r], qp, k);
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < RB; ++r) V::Store(s[r], acc[r]);
  } else {
    constexpr int kNG = 2 * kT / W;  // registers per element pair: W / 2 slots each
    // Registers g0 .. g0 + kGC of each pair at a time, so that RB rows' accumulators fit.
    constexpr int kGC = DecodeChunk<V>(kNG, RB, 1);
    static_assert(kGC == kNG || kGC == 2);
    for (int g0 = 0; g0 < kNG; g0 += kGC) {
      T acc[RB][kGC];
#pragma GCC unroll 16
      for (int r = 0; r < RB; ++r)
#pragma GCC unroll 16
        for (int g = 0; g < kGC; ++g) acc[r][g] = V::Zero();
#pragma GCC unroll 8
      for (int p = 0; p < D / 2; ++p) {
        if (g0 == 0) _mm_prefetch(reinterpret_cast<const char*>(v_rows + p * 64), _MM_HINT_T0);
        T k[kGC];
#pragma GCC unroll 16
        for (int g = 0; g < kGC; ++g) k[g] = LoadKv<V, DT>(tile + p * kPairBytes, g0 + g);
#pragma GCC unroll 16
        for (int r = 0; r < RB; ++r) {
          const T qp = V::Bcast64(q + r * D + 2 * p);
#pragma GCC unroll 16
          for (int g = 0; g < kGC; ++g) acc[r][g] = V::Fma(qp, k[g], acc[r][g]);
        }
      }
#pragma GCC unroll 16
      for (int r = 0; r < RB; ++r) {
        if constexpr (kGC == kNG) {
          V::PairSums(acc[r], s[r]);
        } else {
          V::PairSums2(acc[r], s[r] + g0 * W / 2);
        }
      }
    }
  }
}

// Where a decode call's rows are: for head hh of the call (kv head kvh0 + hh) and row r < RB,
// q / o at (hh * head_rows + r) * head_dim, m / l at hh * head_rows + r.
struct DecodeRowsAt {
  int kvh0, nh, head_rows;
};

// RB rows of each of the call's heads: q scaled, limit[r] = the last slot row r sees; slots
// [k0, k1). Each head's accumulators stay in registers over a tile and wait in L1 in between.
template <class V, KvDtype DT, int DV, int RB>
void DecodeRows(const AttentionArgs& a, DecodeRowsAt at, const float* q, const int64_t* limit,
                int64_t k0, int64_t k1, float* o, float* m, float* l) {
  using T = typename V::T;
  constexpr int W = V::W, D = DV * W, kT = kDecodeTile, kTV = kT / W;
  static_assert(kT % W == 0);
  constexpr size_t kRowBytes = KvRowBytes(DT, D);
  constexpr bool kDot16 = UsesBf16Dots<V, DT, DV>();
  const int nh = at.nh;
  alignas(64) float acc_state[kDecodeMaxHeads][RB][D];
  float mr[kDecodeMaxHeads][RB];
  alignas(64) float lr[kDecodeMaxHeads][RB][W];  // sums of p, lane-wise (reduced at the end)
  int64_t last = limit[0];
  for (int hh = 0; hh < nh; ++hh) {
#pragma GCC unroll 16
    for (int r = 0; r < RB; ++r) {
#pragma GCC unroll 16
      for (int c = 0; c < DV; ++c) V::Store(acc_state[hh][r] + c * W, V::Zero());
      mr[hh][r] = kNegInf;
      V::Store(lr[hh][r], V::Zero());
    }
  }
#pragma GCC unroll 16
  for (int r = 1; r < RB; ++r) last = limit[r] > last ? limit[r] : last;
  const KvLayerRef& kv = a.kv;
  const int64_t kend = k1 < last + 1 ? k1 : last + 1;
  const int64_t bt = kv.block_tokens;
  const size_t head_bytes = static_cast<size_t>(bt) * kRowBytes;  // one head's run in a block
  // Byte offset of slot s's row of the call's first head from k_base / v_base.
  auto row_offset = [&](int64_t s) {
    return static_cast<size_t>(kv.block_ids[s / bt]) * kv.block_bytes + at.kvh0 * head_bytes +
           static_cast<size_t>(s % bt) * kRowBytes;
  };
  // Software prefetch into L2 (not L1, which kDecodePrefetch slots would overrun), a tile
  // kDecodePrefetch slots ahead: a sequence's blocks are scattered over the pool. The prefetches
  // are spread over the slot loop, a row at a time: issued a tile at once, most were dropped
  // (as slow as none).
  const bool prefetching = head_bytes < kDecodeLongRun;
  // K in 16-slot tiles (kv_layout.h): a decode tile is one of them, as both align to slot 0.
  const bool tiled = kv.k_tiled(D);
  // A block right after its predecessor in memory, read whole (every head), continues a stream
  // that the hardware prefetcher follows; software prefetches there only get in its way, while
  // scattered blocks still need them (docs/cpu-kernels.md, "Decode attention: software prefetch
  // only for short runs").
  const bool whole_blocks = nh == a.n_kv_heads;
  auto streamed = [&](int64_t b) {
    return whole_blocks && b > 0 && kv.block_ids[b] == kv.block_ids[b - 1] + 1;
  };
  auto prefetch_row = [&](size_t off) {
    for (size_t line = 0; line < kRowBytes; line += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(kv.k_base + off + line), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(kv.v_base + off + line), _MM_HINT_T1);
    }
  };
  // The task's first kDecodePrefetch slots are asked for up front rather than left to demand
  // misses (a task is often only a few hundred slots).
  if (prefetching) {
    for (int64_t t = k0; t < std::min<int64_t>(kend, k0 + kDecodePrefetch); ++t) {
      if (t / bt != k0 / bt && streamed(t / bt)) continue;
      for (int hh = 0; hh < nh; ++hh) prefetch_row(row_offset(t) + hh * head_bytes);
    }
  }
  // Row offsets (first head) of slots [s0, s0 + count): one add each within a block.
  auto fill_offsets = [&](int64_t s0, int count, size_t* dst) {
    if (count <= 0) return;       // s0 may lie past the sequence's last block
    if (s0 % bt + count <= bt) {  // always, for a tile, when kT divides bt
      const size_t o0 = row_offset(s0);
      for (int j = 0; j < count; ++j) dst[j] = o0 + j * kRowBytes;
    } else {
      for (int j = 0; j < count; ++j) dst[j] = row_offset(s0 + j);
    }
  };
  alignas(64) typename V::Part parts[RB][kT];
  alignas(64) float s[RB][kT];
  size_t off[kT];  // row offsets of the tile's slots (first head)
  size_t pf[kT];   // the same kDecodePrefetch slots ahead, for the first pn slots
  for (int64_t t0 = k0; t0 < kend;) {
    const int64_t tile_end = std::min<int64_t>(kend, (t0 / kT + 1) * kT);
    const int n = static_cast<int>(tile_end - t0);
    fill_offsets(t0, n, off);
    const int64_t p0 = t0 + kDecodePrefetch;
    int pn = prefetching && p0 < kend ? static_cast<int>(std::min<int64_t>(n, kend - p0)) : 0;
    if (pn > 0 && p0 % bt + pn <= bt && streamed(p0 / bt)) pn = 0;
    fill_offsets(p0, pn, pf);
    for (int hh = 0; hh < nh; ++hh) {
      const float* qh = q + static_cast<size_t>(hh) * at.head_rows * D;
      const uint8_t* kb = kv.k_base + hh * head_bytes;
      const uint8_t* vb = kv.v_base + hh * head_bytes;
      // Scores: per slot and row, DV products summed lane-wise (and folded to V::Part), then W
      // slots reduced at once.
      auto score = [&](int j) {
        if (j < pn) prefetch_row(pf[j] + hh * head_bytes);
        if constexpr (kDot16) {
          // 2W bf16 per register: DV / 2 of them hold a row, q's pairs in the same order.
          T kr[DV / 2];
#pragma GCC unroll 16
          for (int c = 0; c < DV / 2; ++c) kr[c] = V::LoadRaw(kb + off[j] + c * 4 * W);
#pragma GCC unroll 16
          for (int r = 0; r < RB; ++r) {
            T d = V::DotBf16(V::Zero(), V::Load(qh + r * D), kr[0]);
#pragma GCC unroll 16
            for (int c = 1; c < DV / 2; ++c) d = V::DotBf16(d, V::Load(qh + r * D + c * W), kr[c]);
            parts[r][j] = V::Fold(d);
          }
        } else {
          T kr[DV];
#pragma GCC unroll 16
          for (int c = 0; c < DV; ++c) kr[c] = LoadKv<V, DT>(kb + off[j], c);
#pragma GCC unroll 16
          for (int r = 0; r < RB; ++r) {
            T d = V::Mul(V::Load(qh + r * D), kr[0]);
#pragma GCC unroll 16
            for (int c = 1; c < DV; ++c) d = V::Fma(V::Load(qh + r * D + c * W), kr[c], d);
            parts[r][j] = V::Fold(d);
          }
        }
      };
      // A tiled K: the offset of the tile holding t0 (its first slot is t0 - t0 % kT).
      const size_t tile_off = off[0] - (t0 % kT) * kRowBytes;
      if (tiled) {
        if constexpr (DT == KvDtype::kF16 || DT == KvDtype::kBF16) {  // the only tiled types
          // The whole K tile (slots from t0 - t0 % kT; those past n are masked below), then
          // the scores moved down to start at t0 where the task starts mid-tile.
          const int shift = static_cast<int>(t0 % kT);
          ScoreKTile<V, DT, DV, RB>(kb + tile_off, qh, s, vb + tile_off);
          if (shift > 0) {
            for (int r = 0; r < RB; ++r) __builtin_memmove(s[r], s[r] + shift, sizeof(float) * n);
          }
        }
      } else {
        if (n == kT) {  // a whole tile: a constant trip count, unrolled
#pragma GCC unroll 16
          for (int j = 0; j < kT; ++j) score(j);
        } else {
          for (int j = 0; j < n; ++j) score(j);
        }
#pragma GCC unroll 16
        for (int r = 0; r < RB; ++r) {
          for (int j = n; j < kT; ++j) parts[r][j] = V::Fold(V::Zero());
#pragma GCC unroll 16
          for (int tv = 0; tv < kTV; ++tv) V::ReduceParts(parts[r] + tv * W, s[r] + tv * W);
        }
      }
// Online softmax per row over the tile.
#pragma GCC unroll 16
      for (int r = 0; r < RB; ++r) {
        const int64_t lim = limit[r] - t0;  // last tile index this row sees
        const int valid = lim < 0 ? 0 : (lim + 1 < n ? static_cast<int>(lim + 1) : n);
        if (valid == 0) {  // p = 0 for the whole tile
          for (int j = 0; j < kT; ++j) s[r][j] = 0.0f;
          continue;
        }
        for (int j = valid; j < kT; ++j) s[r][j] = kNegInf;  // Exp gives 0 for these
        T mx = V::Load(s[r]);
#pragma GCC unroll 16
        for (int tv = 1; tv < kTV; ++tv) mx = V::Max(mx, V::Load(s[r] + tv * W));
        const float tile_max = V::ReduceMax(mx);
        const float m_old = mr[hh][r];
        const float m_new = tile_max > m_old ? tile_max : m_old;
        const T vm = V::Set1(m_new);
        T sum = V::Zero();
#pragma GCC unroll 16
        for (int tv = 0; tv < kTV; ++tv) {
          const T p = V::Exp(V::Sub(V::Load(s[r] + tv * W), vm));
          V::Store(s[r] + tv * W, p);
          sum = V::Add(sum, p);
        }
        T lsum = V::Load(lr[hh][r]);
        if (m_old != kNegInf && m_new != m_old) {
          const T vc = V::Set1(__builtin_expf(m_old - m_new));
          lsum = V::Mul(lsum, vc);
          float* ar = acc_state[hh][r];
#pragma GCC unroll 16
          for (int c = 0; c < DV; ++c) V::Store(ar + c * W, V::Mul(V::Load(ar + c * W), vc));
        }
        V::Store(lr[hh][r], V::Add(lsum, sum));
        mr[hh][r] = m_new;
      }
      // With a tiled K, P V asks the next K tile (the next head's, or the next tile's first head's)
      // into L1, a row's worth a slot, as the scores asked for this V: each phase's loads are
      // then in flight during the other's arithmetic. The L2 stream prefetcher alone left them to
      // demand misses, the V loads the kernel's largest stall (docs/cpu-kernels.md, "Decode
      // attention: the next K tile asked for during P V").
      const uint8_t* next_k = nullptr;
      if (tiled) {
        if (hh + 1 < nh) {
          next_k = kb + head_bytes + tile_off;
        } else if (tile_end < kend) {
          next_k = kv.k_base + row_offset(tile_end);
        }
      }
      auto prefetch_next_k = [&](int j) {
        if (next_k == nullptr) return;
        for (size_t b = 0; b < kRowBytes; b += 64)
          _mm_prefetch(reinterpret_cast<const char*>(next_k + j * kRowBytes + b), _MM_HINT_T0);
      };
      // O += P V, kC of each row's DV accumulator registers at a time (all of them where they
      // fit): each chunk walks the tile's slots again, from L1.
      constexpr int kC = DecodeChunk<V>(DV, RB, 0);
      static_assert(!kDot16 || kC == DV);
      for (int c0 = 0; c0 < DV; c0 += kC) {
        T acc[RB][kC];
#pragma GCC unroll 16
        for (int r = 0; r < RB; ++r)
#pragma GCC unroll 16
          for (int c = 0; c < kC; ++c) acc[r][c] = V::Load(acc_state[hh][r] + (c0 + c) * W);
        if constexpr (kDot16) {
          // P as bf16 pairs (slots j, j + 1 in one 32-bit word); p = 0 past n (see above).
          alignas(64) uint16_t pb[RB][kT];
#pragma GCC unroll 16
          for (int r = 0; r < RB; ++r) {
#pragma GCC unroll 16
            for (int tv = 0; tv < kTV; ++tv)
              V::StoreRoundBf16(pb[r] + tv * W, V::Load(s[r] + tv * W));
          }
          for (int j = 0; j < n; j += 2) {
            if (tiled && j < pn) prefetch_row(pf[j] + hh * head_bytes);
            if (tiled && j + 1 < pn) prefetch_row(pf[j + 1] + hh * head_bytes);
            prefetch_next_k(j);
            prefetch_next_k(j + 1);
            T va[DV / 2], vb2[DV / 2];
#pragma GCC unroll 16
            for (int c = 0; c < DV / 2; ++c) {
              va[c] = V::LoadRaw(vb + off[j] + c * 4 * W);
              // An odd tile end pairs the last slot with zeros (never a row past the range).
              vb2[c] = j + 1 < n ? V::LoadRaw(vb + off[j + 1] + c * 4 * W) : V::Zero();
            }
            T u[DV];
#pragma GCC unroll 16
            for (int c = 0; c < DV / 2; ++c) {
              u[2 * c] = V::PairLo(va[c], vb2[c]);
              u[2 * c + 1] = V::PairHi(va[c], vb2[c]);
            }
#pragma GCC unroll 16
            for (int r = 0; r < RB; ++r) {
              const T p = V::Bcast32(pb[r] + j);
#pragma GCC unroll 16
              for (int c = 0; c < DV; ++c) acc[r][c] = V::DotBf16(acc[r][c], p, u[c]);
            }
          }
        }
        for (int j = 0; !kDot16 && j < n; ++j) {
          // A tiled K's scores took no per-slot loop: its tile's prefetches go here, spread the
          // same way (issued at once, most were dropped).
          if (c0 == 0) {
            if (tiled && j < pn) prefetch_row(pf[j] + hh * head_bytes);
            prefetch_next_k(j);
          }
#pragma GCC unroll 16
          for (int c = 0; c < kC; ++c) {
            const T vr = LoadKv<V, DT>(vb + off[j], c0 + c);
#pragma GCC unroll 16
            for (int r = 0; r < RB; ++r) acc[r][c] = V::Fma(V::Set1(s[r][j]), vr, acc[r][c]);
          }
        }
#pragma GCC unroll 16
        for (int r = 0; r < RB; ++r)
#pragma GCC unroll 16
          for (int c = 0; c < kC; ++c) V::Store(acc_state[hh][r] + (c0 + c) * W, acc[r][c]);
      }
    }
    t0 = tile_end;
  }
  for (int hh = 0; hh < nh; ++hh) {
    float* oh = o + static_cast<size_t>(hh) * at.head_rows * D;
#pragma GCC unroll 16
    for (int r = 0; r < RB; ++r) {
      if constexpr (kDot16) {
#pragma GCC unroll 16
        for (int c = 0; c < DV; c += 2) {
          V::UnpairBf16(V::Load(acc_state[hh][r] + c * W), V::Load(acc_state[hh][r] + (c + 1) * W),
                        oh + r * D + c * W);
        }
      } else {
#pragma GCC unroll 16
        for (int c = 0; c < DV; ++c)
          V::Store(oh + r * D + c * W, V::Load(acc_state[hh][r] + c * W));
      }
      m[hh * at.head_rows + r] = mr[hh][r];
      l[hh * at.head_rows + r] = V::ReduceAdd(V::Load(lr[hh][r]));
    }
  }
}

template <class V, KvDtype DT, int DV>
void DecodeAll(const AttentionArgs& a, int kvh0, int nh, int q0, int q1, int64_t k0, int64_t k1,
               float* scratch, float* o, float* m, float* l) {
  constexpr int W = V::W, D = DV * W, kRB = DecodeRowsPerPass<V, DV>();
  const int g = a.n_heads / a.n_kv_heads;
  const int rows = (q1 - q0) * g;
  float* q = scratch;  // [nh][rows][D], pre-scaled
  int64_t limit[kRB];
  const typename V::T vscale = V::Set1(a.scale);
  for (int hh = 0; hh < nh; ++hh) {
    for (int r = 0; r < rows; ++r) {
      const int qi = q0 + r / g, h = (kvh0 + hh) * g + r % g;
      const float* src = a.q + qi * a.q_stride + h * D;
      float* dst = q + (static_cast<size_t>(hh) * rows + r) * D;
      if constexpr (UsesBf16Dots<V, DT, DV>()) {  // bf16, in the first half of the row's room
        uint16_t* d16 = reinterpret_cast<uint16_t*>(dst);
        for (int d = 0; d < D; d += W) V::StoreRoundBf16(d16 + d, V::Mul(V::Load(src + d), vscale));
      } else {
        for (int d = 0; d < D; d += W) V::Store(dst + d, V::Mul(V::Load(src + d), vscale));
      }
    }
  }
  const DecodeRowsAt at{kvh0, nh, rows};
  for (int r0 = 0; r0 < rows; r0 += kRB) {
    const int rb = rows - r0 < kRB ? rows - r0 : kRB;
    for (int r = 0; r < rb; ++r) limit[r] = int64_t{a.n_past} + q0 + (r0 + r) / g;
    const float* qg = q + r0 * D;
    float* og = o + r0 * D;
    switch (rb) {
      case 1:
        DecodeRows<V, DT, DV, 1>(a, at, qg, limit, k0, k1, og, m + r0, l + r0);
        break;
      case 2:
        if constexpr (kRB >= 2)
          DecodeRows<V, DT, DV, 2>(a, at, qg, limit, k0, k1, og, m + r0, l + r0);
        break;
      case 3:
        if constexpr (kRB >= 3)
          DecodeRows<V, DT, DV, 3>(a, at, qg, limit, k0, k1, og, m + r0, l + r0);
        break;
      default:
        if constexpr (kRB >= 4)
          DecodeRows<V, DT, DV, 4>(a, at, qg, limit, k0, k1, og, m + r0, l + r0);
        break;
    }
  }
}

// The decode kernel for this head_dim, or false where it has none (BlockImpl serves those).
template <class V, KvDtype DT>
bool DecodeDt(const AttentionArgs& a, int kvh0, int nh, int q0, int q1, int64_t k0, int64_t k1,
              float* scratch, float* o, float* m, float* l) {
  switch (a.head_dim / V::W) {
    case 2:
      DecodeAll<V, DT, 2>(a, kvh0, nh, q0, q1, k0, k1, scratch, o, m, l);
      return true;
    case 4:
      DecodeAll<V, DT, 4>(a, kvh0, nh, q0, q1, k0, k1, scratch, o, m, l);
      return true;
    case 8:
      DecodeAll<V, DT, 8>(a, kvh0, nh, q0, q1, k0, k1, scratch, o, m, l);
      return true;
    case 16:
      DecodeAll<V, DT, 16>(a, kvh0, nh, q0, q1, k0, k1, scratch, o, m, l);
      return true;
    default:
      return false;
  }
}

template <class V>
bool DecodeImpl(const AttentionArgs& a, int kvh0, int nh, int q0, int q1, int64_t k0, int64_t k1,
                float* scratch, float* o, float* m, float* l) {
  if (a.head_dim % V::W != 0 || a.kv.block_tokens <= 0 || nh < 1 || nh > kDecodeMaxHeads) {
    return false;
  }
  switch (a.kv.dtype) {
    case KvDtype::kF32:
      return DecodeDt<V, KvDtype::kF32>(a, kvh0, nh, q0, q1, k0, k1, scratch, o, m, l);
    case KvDtype::kF16:
      return DecodeDt<V, KvDtype::kF16>(a, kvh0, nh, q0, q1, k0, k1, scratch, o, m, l);
    case KvDtype::kQ8_0:
      if (a.head_dim % kKvQ8Block != 0) return false;
      return DecodeDt<V, KvDtype::kQ8_0>(a, kvh0, nh, q0, q1, k0, k1, scratch, o, m, l);
    default:
      return DecodeDt<V, KvDtype::kBF16>(a, kvh0, nh, q0, q1, k0, k1, scratch, o, m, l);
  }
}

template <class V>
void ConvertRowImpl(const float* src, int n, KvDtype dtype, uint8_t* dst) {
  constexpr int W = V::W;
  int i = 0;
  if (dtype == KvDtype::kF32) {
    __builtin_memcpy(dst, src, static_cast<size_t>(n) * 4);
    return;
  }
  if (dtype == KvDtype::kQ8_0) return scalar::ConvertRow(src, n, dtype, dst);
  uint16_t* d16 = reinterpret_cast<uint16_t*>(dst);
  if (dtype == KvDtype::kF16) {
    for (; i + W <= n; i += W) V::StoreF16(d16 + i, V::Load(src + i));
  } else {
    for (; i + W <= n; i += W) V::StoreBf16(d16 + i, V::Load(src + i));
  }
  if (i < n) scalar::ConvertRow(src + i, n - i, dtype, reinterpret_cast<uint8_t*>(d16 + i));
}

}  // namespace
}  // namespace tripod::attn
