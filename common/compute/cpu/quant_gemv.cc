// QuantGemm: picks the ISA kernel, quantises x for the int8 mode, threads over output rows; also
// the scalar kernels (the reference the vector paths are tested against).
#include "common/compute/cpu/quant_gemv.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/compute/cpu/cpu_features.h"
#include "common/compute/cpu/quant_gemv_internal.h"
#include "common/util/thread_pool.h"

namespace tripod {
namespace qgemv {
namespace {

// Software fp16 -> fp32 (no F16C in the scalar file); exact for every input.
inline float HalfBits(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t man = h & 0x3ff;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {
    // Subnormal half: value = man * 2^-24.
    const float v = static_cast<float>(man) * 5.9604644775390625e-8f;
    std::memcpy(&bits, &v, 4);
    bits |= sign;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline float Bf16Bits(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Dequantises one row of the types the vector kernels handle (the scalar F32 reference).
void DequantRowScalar(GgmlType type, const uint8_t* row, int64_t k, float* out) {
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(out, row, k * sizeof(float));
      return;
    case GgmlType::kF16:
      for (int64_t t = 0; t < k; ++t) out[t] = HalfBits(row + 2 * t);
      return;
    case GgmlType::kBF16:
      for (int64_t t = 0; t < k; ++t) out[t] = Bf16Bits(row + 2 * t);
      return;
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1: {
      const int bytes = type == GgmlType::kQ4_0 ? 18 : 20;
      for (int64_t b = 0; b < k / 32; ++b) {
        const uint8_t* blk = row + b * bytes;
        const float d = HalfBits(blk);
        const float mn = type == GgmlType::kQ4_1 ? HalfBits(blk + 2) : 0.0f;
        const uint8_t* qs = blk + bytes - 16;
        for (int j = 0; j < 16; ++j) {
          const int lo = qs[j] & 0x0f, hi = qs[j] >> 4;
          if (type == GgmlType::kQ4_0) {
            out[b * 32 + j] = static_cast<float>(lo - 8) * d;
            out[b * 32 + j + 16] = static_cast<float>(hi - 8) * d;
          } else {
            out[b * 32 + j] = static_cast<float>(lo) * d + mn;
            out[b * 32 + j + 16] = static_cast<float>(hi) * d + mn;
          }
        }
      }
      return;
    }
    case GgmlType::kQ8_0:
      for (int64_t b = 0; b < k / 32; ++b) {
        const uint8_t* blk = row + b * 34;
        const float d = HalfBits(blk);
        for (int j = 0; j < 32; ++j) {
          out[b * 32 + j] = static_cast<float>(static_cast<int8_t>(blk[2 + j])) * d;
        }
      }
      return;
    default:
      // K-quants and anything else: the model library's reference dequantiser.
      DequantizeRow(type, row, out, k);
      return;
  }
}

// p rounded half to even and clamped to [-lim, lim]; out-of-range and NaN values give -lim, as
// the vector conversions (cvtps2dq's 0x80000000, then the clamp) do.
int RoundClamp(float p, int lim) {
  const int v = p >= -2147483648.0f && p < 2147483648.0f ? static_cast<int>(std::nearbyint(p))
                                                         : std::numeric_limits<int>::min();
  return std::clamp(v, -lim, lim);
}

}  // namespace

namespace scalar {

void QuantizeActInt8(const float* x, int m, int64_t ldx, int64_t k, int8_t* q, float* scale,
                     float* sum) {
  const int64_t nb = k / 32;
  for (int i = 0; i < m; ++i) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + i * ldx + b * 32;
      float amax = 0.0f;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xb[j]));
      const float d = amax / 127.0f;
      const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      int8_t* qb = q + i * k + b * 32;
      int s = 0;
      for (int j = 0; j < 32; ++j) {
        qb[j] = static_cast<int8_t>(RoundClamp(xb[j] * inv, 127));
        s += qb[j];
      }
      scale[i * nb + b] = d;
      sum[i * nb + b] = d * static_cast<float>(s);
    }
  }
}

void QuantizeActInt16(const float* x, int m, int64_t ldx, int64_t k, int16_t* q, float* scale) {
  const int64_t nb = k / 32;
  for (int i = 0; i < m; ++i) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + i * ldx + b * 32;
      float amax = 0.0f;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xb[j]));
      const float inv = amax > 0.0f ? 32767.0f / amax : 0.0f;
      int16_t* qb = q + i * k + b * 32;
      for (int j = 0; j < 32; ++j) {
        qb[j] = static_cast<int16_t>(RoundClamp(xb[j] * inv, 32767));
      }
      scale[i * nb + b] = amax / 32767.0f;
    }
  }
}

void BlockSums(const float* x, int m, int64_t ldx, int64_t k, float* sums) {
  const int64_t nb = k / 32;
  for (int i = 0; i < m; ++i) {
    for (int64_t b = 0; b < nb; ++b) {
      float s = 0.0f;
      for (int j = 0; j < 32; ++j) s += x[i * ldx + b * 32 + j];
      sums[i * nb + b] = s;
    }
  }
}

bool RowsF32(const QuantMatrix& w, const F32Act& xa, float* y, int64_t ldy, int64_t j0,
             int64_t j1) {
  thread_local std::vector<float> buf;
  thread_local std::vector<uint8_t> row;
  buf.resize(w.k);
  row.resize(w.row_bytes);
  for (int64_t j = j0; j < j1; ++j) {
    DequantRowScalar(w.type, GgufRow(w, j, row.data()), w.k, buf.data());
    for (int i = 0; i < xa.m; ++i) {
      const float* xi = xa.x + i * xa.ldx;
      float s = 0.0f;
      for (int64_t t = 0; t < w.k; ++t) s += buf[t] * xi[t];
      y[i * ldy + j] = s;
    }
  }
  return true;
}

namespace {

// The int8 and int16 reference: per block, the integer dot of the weights' values with x's
// quantised values, times d_w * d_x; Q4_1's minimum (Q4_0's -8 d) times side_sum, the x block sums
// the mode pairs it with (int8: d_x * sum(q_x); int16: the exact fp32 sums).
template <class Q>
bool RowsIntRef(const QuantMatrix& w, const Q* q, const float* scale, const float* side_sum, int m,
                int64_t k, int64_t nb, float* y, int64_t ldy, int64_t j0, int64_t j1) {
  if (w.type != GgmlType::kQ4_0 && w.type != GgmlType::kQ4_1 && w.type != GgmlType::kQ8_0) {
    return false;
  }
  const int bytes = w.type == GgmlType::kQ4_0 ? 18 : w.type == GgmlType::kQ4_1 ? 20 : 34;
  thread_local std::vector<uint8_t> row_buf;
  row_buf.resize(w.row_bytes);
  for (int64_t j = j0; j < j1; ++j) {
    const uint8_t* row = GgufRow(w, j, row_buf.data());
    for (int i = 0; i < m; ++i) {
      float s = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = row + b * bytes;
        const Q* xb = q + i * k + b * 32;
        const float dw = HalfBits(blk);
        int64_t dot = 0;
        if (w.type == GgmlType::kQ8_0) {
          for (int t = 0; t < 32; ++t) dot += static_cast<int8_t>(blk[2 + t]) * xb[t];
          s += dw * scale[i * nb + b] * static_cast<float>(dot);
        } else {
          const uint8_t* qs = blk + bytes - 16;
          for (int t = 0; t < 16; ++t) dot += (qs[t] & 0x0f) * xb[t] + (qs[t] >> 4) * xb[t + 16];
          s += dw * scale[i * nb + b] * static_cast<float>(dot);
          const float side = w.type == GgmlType::kQ4_1 ? HalfBits(blk + 2) : -8.0f * dw;
          s += side * side_sum[i * nb + b];
        }
      }
      y[i * ldy + j] = s;
    }
  }
  return true;
}

// x block s (32 elements; s counts from the row's start) of a K-quant, Q5_0 or Q5_1 row as
// integers: element l is d * w[l] + mn (Q6_K: w = (q - 32) * the 16-element scale). The vector
// kernels' decomposition, written out from the GGML layouts (quant_types.h).
void IntBlockOf(GgmlType t, const uint8_t* row, int64_t s, int32_t* w, float* d, float* mn) {
  const int j = static_cast<int>(s % 8);
  switch (t) {
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K: {
      const bool five = t == GgmlType::kQ5_K;
      const uint8_t* blk = row + (s / 8) * (five ? 176 : 144);
      const uint8_t* sc12 = blk + 4;
      int sc, m;
      if (j < 4) {
        sc = sc12[j] & 63;
        m = sc12[j + 4] & 63;
      } else {
        sc = (sc12[j + 4] & 0xF) | ((sc12[j - 4] >> 6) << 4);
        m = (sc12[j + 4] >> 4) | ((sc12[j] >> 6) << 4);
      }
      *d = HalfBits(blk) * static_cast<float>(sc);
      *mn = -(HalfBits(blk + 2) * static_cast<float>(m));
      const uint8_t* qs = blk + (five ? 48 : 16) + 32 * (j / 2);
      for (int l = 0; l < 32; ++l) {
        w[l] = (j & 1) ? qs[l] >> 4 : qs[l] & 0xF;
        if (five) w[l] |= ((blk[16 + l] >> j) & 1) << 4;
      }
      return;
    }
    case GgmlType::kQ6_K: {
      const uint8_t* blk = row + (s / 8) * 210;
      const int n = j / 4, q = j % 4;
      const uint8_t* ql = blk + 64 * n + 32 * (q & 1);
      const uint8_t* qh = blk + 128 + 32 * n;
      const auto* sc = reinterpret_cast<const int8_t*>(blk + 192 + 8 * n + 2 * q);
      for (int l = 0; l < 32; ++l) {
        const int lo = (q >> 1) ? ql[l] >> 4 : ql[l] & 0xF;
        w[l] = ((lo | (((qh[l] >> (2 * q)) & 3) << 4)) - 32) * sc[l / 16];
      }
      *d = HalfBits(blk + 208);
      *mn = 0.0f;
      return;
    }
    default: {  // Q5_0, Q5_1
      const bool q51 = t == GgmlType::kQ5_1;
      const uint8_t* blk = row + s * (q51 ? 24 : 22);
      uint32_t qh;
      std::memcpy(&qh, blk + (q51 ? 4 : 2), 4);
      const uint8_t* qs = blk + (q51 ? 8 : 6);
      for (int l = 0; l < 32; ++l) {
        const int nib = l < 16 ? qs[l] & 0xF : qs[l - 16] >> 4;
        w[l] = nib | static_cast<int>(((qh >> l) & 1) << 4);
      }
      *d = HalfBits(blk);
      *mn = q51 ? HalfBits(blk + 2) : *d * -16.0f;
      return;
    }
  }
}

// The int8 and int16 reference for those types: per x block the exact integer dot with x's
// quantised values times d * d_x, plus mn times the x block sums the mode pairs it with (int8:
// d_x * sum(q_x); int16: the exact fp32 sums).
template <class Act>
bool RowsIntKRef(const QuantMatrix& w, const Act& xa, const float* side_sum, float* y, int64_t ldy,
                 int64_t j0, int64_t j1) {
  if (!IsIntBlockType(w.type) || w.interleave != 1) return false;
  int32_t wi[32];
  for (int64_t j = j0; j < j1; ++j) {
    const uint8_t* row = static_cast<const uint8_t*>(w.data) + j * w.row_bytes;
    for (int i = 0; i < xa.m; ++i) {
      float s = 0.0f;
      for (int64_t b = 0; b < xa.nb; ++b) {
        float d, mn;
        IntBlockOf(w.type, row, b, wi, &d, &mn);
        const auto* xb = xa.q + i * xa.k + b * 32;
        int64_t dot = 0;
        for (int t = 0; t < 32; ++t) dot += int64_t{wi[t]} * xb[t];
        s += d * xa.scale[i * xa.nb + b] * static_cast<float>(dot);
        s += mn * side_sum[i * xa.nb + b];
      }
      y[i * ldy + j] = s;
    }
  }
  return true;
}

}  // namespace

bool RowsInt8(const QuantMatrix& w, const Int8Act& xa, float* y, int64_t ldy, int64_t j0,
              int64_t j1) {
  return RowsIntKRef(w, xa, xa.sum, y, ldy, j0, j1) ||
         RowsIntRef(w, xa.q, xa.scale, xa.sum, xa.m, xa.k, xa.nb, y, ldy, j0, j1);
}

bool RowsInt16(const QuantMatrix& w, const Int16Act& xa, float* y, int64_t ldy, int64_t j0,
               int64_t j1) {
  return RowsIntKRef(w, xa, xa.bsum, y, ldy, j0, j1) ||
         RowsIntRef(w, xa.q, xa.scale, xa.bsum, xa.m, xa.k, xa.nb, y, ldy, j0, j1);
}

}  // namespace scalar
}  // namespace qgemv

namespace {

// Block bytes of the types the vector kernels read as blocks (and so may be interleaved), else 0.
int InterleaveBlockBytes(GgmlType t) {
  const bool block = t == GgmlType::kQ4_0 || t == GgmlType::kQ4_1 || t == GgmlType::kQ8_0;
  return block ? TypeInfo(t).block_bytes : 0;
}

}  // namespace

bool CanInterleave(const QuantMatrix& w) {
  const int bb = InterleaveBlockBytes(w.type);
  return bb > 0 && w.interleave == 1 && w.k > 0 && w.k % 32 == 0 && w.row_bytes == w.k / 32 * bb;
}

void InterleaveRows(const QuantMatrix& w, void* dst) {
  const int64_t bb = InterleaveBlockBytes(w.type), nb = w.k / 32, g = kInterleaveRows;
  const int sb = qgemv::IlScaleBytes(w.type);
  const auto* src = static_cast<const uint8_t*>(w.data);
  auto* out = static_cast<uint8_t*>(dst);
  const int64_t grouped = w.n / g * g;
  // The run's addresses point into out (IlRun is a read-only view, hence the const_casts).
  auto put = [](const uint8_t* to, const uint8_t* from, size_t n) {
    std::memcpy(const_cast<uint8_t*>(to), from, n);
  };
  for (int64_t j0 = 0; j0 < grouped; j0 += g) {
    const uint8_t* in = src + j0 * w.row_bytes;
    for (int64_t c = 0; c * qgemv::kIlRun < nb; ++c) {
      const qgemv::IlRun run = qgemv::IlRunOf(out + j0 * w.row_bytes, w.type, nb, c);
      for (int r = 0; r < g; ++r) {
        for (int j = 0; j < run.cnt; ++j) {
          const uint8_t* blk = in + r * w.row_bytes + (c * qgemv::kIlRun + j) * bb;
          put(run.d(r, j), blk, 2);
          if (sb == 4) put(run.m(r, j), blk + 2, 2);
          put(run.q(r, j), blk + sb, bb - sb);
        }
      }
    }
  }
  std::memcpy(out + grouped * w.row_bytes, src + grouped * w.row_bytes,
              static_cast<size_t>(w.n - grouped) * w.row_bytes);
}

const uint8_t* GgufRow(const QuantMatrix& w, int64_t j, uint8_t* buf) {
  if (w.interleave == 1) return static_cast<const uint8_t*>(w.data) + j * w.row_bytes;
  CopyRowOut(w, j, buf);
  return buf;
}

void CopyRowOut(const QuantMatrix& w, int64_t j, uint8_t* out) {
  const auto* src = static_cast<const uint8_t*>(w.data);
  if (j >= InterleavedRows(w)) {
    std::memcpy(out, src + j * w.row_bytes, w.row_bytes);
    return;
  }
  const int64_t bb = InterleaveBlockBytes(w.type), g = w.interleave, nb = w.k / 32;
  const int sb = qgemv::IlScaleBytes(w.type), r = static_cast<int>(j % g);
  const uint8_t* group = src + (j - r) * w.row_bytes;
  for (int64_t c = 0; c * qgemv::kIlRun < nb; ++c) {
    const qgemv::IlRun run = qgemv::IlRunOf(group, w.type, nb, c);
    for (int b = 0; b < run.cnt; ++b) {
      uint8_t* blk = out + (c * qgemv::kIlRun + b) * bb;
      std::memcpy(blk, run.d(r, b), 2);
      if (sb == 4) std::memcpy(blk + 2, run.m(r, b), 2);
      std::memcpy(blk + sb, run.q(r, b), bb - sb);
    }
  }
}

namespace {

// Types with vector fp32 kernels (all the supported ones).
bool HasVectorKernel(GgmlType t) {
  return t == GgmlType::kF32 || t == GgmlType::kF16 || t == GgmlType::kBF16 ||
         t == GgmlType::kQ4_0 || t == GgmlType::kQ4_1 || t == GgmlType::kQ8_0 ||
         qgemv::IsIntBlockType(t);
}

int BlockElems(GgmlType t) {
  switch (t) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16:
      return 1;
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
      return 256;
    default:
      return 32;
  }
}

}  // namespace

void DequantizeMatrixRow(const QuantMatrix& w, int64_t j, float* out) {
  const IsaLevel isa = ActiveIsa();
  if (isa >= IsaLevel::kAvx512 && qgemv::avx512::DequantRow(w, j, out)) return;
  if (isa >= IsaLevel::kAvx2 && qgemv::avx2::DequantRow(w, j, out)) return;
  thread_local std::vector<uint8_t> row;
  row.resize(w.row_bytes);
  DequantizeRow(w.type, GgufRow(w, j, row.data()), out, w.k);
}

const char* GemvModeName(GemvMode mode) {
  switch (mode) {
    case GemvMode::kInt8:
      return "int8";
    case GemvMode::kInt16:
      return "int16";
    case GemvMode::kBf16:
      return "bf16";
    case GemvMode::kF32Tile:
      return "fp32-tile";
    default:
      return "fp32";
  }
}

void QuantGemm(const QuantMatrix& w, const float* x, int m, int64_t ldx, float* y, int64_t ldy,
               GemvMode mode) {
  const QuantPart part{w, 0};
  QuantGemm(std::span<const QuantPart>(&part, 1), x, m, ldx, y, ldy, mode, false);
}

namespace {

// The plain sums of each 16 of n integers (n a multiple of 16), as floats (exact: at most
// 16 * 32767): Q6_K's offset term.
template <class Q>
const float* SumsOf16(const Q* q, int64_t n, std::vector<float>& out) {
  out.resize(n / 16);
  for (int64_t h = 0; h < n / 16; ++h) {
    int s = 0;
    for (int t = 0; t < 16; ++t) s += q[h * 16 + t];
    out[h] = static_cast<float>(s);
  }
  return out.data();
}

}  // namespace

void QuantGemm(std::span<const QuantPart> parts, const float* x, int m, int64_t ldx, float* y,
               int64_t ldy, GemvMode mode, bool accumulate) {
  if (m <= 0 || parts.empty()) return;
  const IsaLevel isa = ActiveIsa();
  const int64_t k = parts[0].q.k;
  const int64_t nb = k / 32;
  // How each part runs: the kernel family follows its weight type.
  enum class Path : uint8_t { kInvalid, kBf16, kInt8, kInt16, kF32Tile, kF32 };
  constexpr int kMaxParts = 8;
  if (parts.size() > kMaxParts) {
    for (size_t p0 = 0; p0 < parts.size(); p0 += kMaxParts) {
      QuantGemm(parts.subspan(p0, std::min<size_t>(kMaxParts, parts.size() - p0)), x, m, ldx, y,
                ldy, mode, accumulate);
    }
    return;
  }
  Path path[kMaxParts];
  bool need_bf16 = false, need_int8 = false, need_int16 = false, need_bsum = false,
       need_tile = false, need_sum16 = false, need_pair16 = false;
  for (size_t p = 0; p < parts.size(); ++p) {
    const QuantMatrix& w = parts[p].q;
    if (w.n <= 0) {
      path[p] = Path::kInvalid;
      continue;
    }
    if (w.k != k || w.k <= 0 || w.k % BlockElems(w.type) != 0 || w.data == nullptr) {
      // Not a valid matrix: NaNs make the caller's mistake visible instead of reading past it.
      for (int i = 0; i < m; ++i) {
        float* yi = y + i * ldy + parts[p].col;
        std::fill(yi, yi + w.n, std::numeric_limits<float>::quiet_NaN());
      }
      path[p] = Path::kInvalid;
      continue;
    }
    const bool block_type =
        w.type == GgmlType::kQ4_0 || w.type == GgmlType::kQ4_1 || w.type == GgmlType::kQ8_0;
    const bool q4 = w.type == GgmlType::kQ4_0 || w.type == GgmlType::kQ4_1;
    // K-quants, Q5_0 and Q5_1: int8 kernels in the int8 mode where they exist, int16 kernels in
    // the int16 mode (and in int8 on AVX2, and bf16 below its rows or without its hardware), the
    // tile kernel in kF32Tile (fp32 without AVX2). Float weights have nothing to gain from integer
    // x: kF32.
    const bool int_block = qgemv::IsIntBlockType(w.type);
    if (mode == GemvMode::kBf16 && m >= kBf16MinRows && (block_type || int_block) &&
        isa >= IsaLevel::kAvx512 && GetCpuFeatures().avx512bf16) {
      path[p] = Path::kBf16;
      need_bf16 = true;
    } else if (mode == GemvMode::kInt8 &&
               (block_type ||
                (int_block && (isa >= IsaLevel::kAvx512 || isa == IsaLevel::kScalar)))) {
      // K-quants, Q5_0 and Q5_1 have int8 kernels on AVX-512 (VNNI) and the scalar reference.
      path[p] = Path::kInt8;
      need_int8 = true;
      need_sum16 |= w.type == GgmlType::kQ6_K;
    } else if (mode == GemvMode::kF32Tile && (block_type || int_block) && isa >= IsaLevel::kAvx2) {
      path[p] = Path::kF32Tile;
      need_tile = true;
    } else if ((mode == GemvMode::kInt16 && block_type) ||
               (mode != GemvMode::kF32 && mode != GemvMode::kF32Tile && int_block)) {
      path[p] = Path::kInt16;
      need_int16 = true;
      need_bsum |= q4 || int_block;
      need_pair16 |= int_block && isa >= IsaLevel::kAvx2;
      need_sum16 |= w.type == GgmlType::kQ6_K;
    } else {
      path[p] = Path::kF32;
      need_bsum |= q4 && isa >= IsaLevel::kAvx2;
    }
  }

  // x prepared once per call (m * k values) by the calling thread, shared by all threads and
  // parts.
  thread_local std::vector<int8_t> xq;
  thread_local std::vector<int16_t> xq16, xq16p;
  thread_local std::vector<float> xs, xsum, xsum16, bsum;
  thread_local std::vector<uint16_t> xb;
  thread_local std::vector<float> xt;
  qgemv::Int8Act xa8;
  qgemv::Int16Act xa16;
  qgemv::Bf16Act xab;
  qgemv::F32TileAct xat;
  qgemv::F32Act xa{x, ldx, nullptr, m, k, nb};
  if (need_bf16) {
    xb.resize(static_cast<size_t>(m) * k);
    qgemv::avx512::ConvertActBf16(x, m, ldx, k, xb.data());
    xab = {xb.data(), m, k, nb};
  }
  if (need_tile) {
    xt.resize(static_cast<size_t>((m + 15) / 16) * 16 * k);
    if (isa >= IsaLevel::kAvx512) {
      qgemv::avx512::TransposeAct(x, m, ldx, k, xt.data());
    } else {
      qgemv::avx2::TransposeAct(x, m, ldx, k, xt.data());
    }
    xat = {xt.data(), m, k, nb};
  }
  if (need_int8) {
    xq.resize(static_cast<size_t>(m) * k);
    xs.resize(static_cast<size_t>(m) * nb);
    xsum.resize(static_cast<size_t>(m) * nb);
    if (isa >= IsaLevel::kAvx512) {
      qgemv::avx512::QuantizeActInt8(x, m, ldx, k, xq.data(), xs.data(), xsum.data());
    } else if (isa >= IsaLevel::kAvx2) {
      qgemv::avx2::QuantizeActInt8(x, m, ldx, k, xq.data(), xs.data(), xsum.data());
    } else {
      qgemv::scalar::QuantizeActInt8(x, m, ldx, k, xq.data(), xs.data(), xsum.data());
    }
    xa8 = {xq.data(), xs.data(), xsum.data(), m, k, nb};
    if (need_sum16) xa8.sum16 = SumsOf16(xq.data(), m * k, xsum16);
  }
  if (need_bsum) {
    bsum.resize(static_cast<size_t>(m) * nb);
    if (isa >= IsaLevel::kAvx512) {
      qgemv::avx512::BlockSums(x, m, ldx, k, bsum.data());
    } else if (isa >= IsaLevel::kAvx2) {
      qgemv::avx2::BlockSums(x, m, ldx, k, bsum.data());
    } else {
      qgemv::scalar::BlockSums(x, m, ldx, k, bsum.data());
    }
    xa.bsum = bsum.data();
  }
  if (need_int16) {
    xq16.resize(static_cast<size_t>(m) * k);
    xs.resize(static_cast<size_t>(m) * nb);
    if (isa >= IsaLevel::kAvx512) {
      qgemv::avx512::QuantizeActInt16(x, m, ldx, k, xq16.data(), xs.data());
    } else if (isa >= IsaLevel::kAvx2) {
      qgemv::avx2::QuantizeActInt16(x, m, ldx, k, xq16.data(), xs.data());
    } else {
      qgemv::scalar::QuantizeActInt16(x, m, ldx, k, xq16.data(), xs.data());
    }
    xa16 = {xq16.data(), xs.data(), need_bsum ? bsum.data() : nullptr, m, k, nb};
    if (need_pair16) {
      // x in the order the int-block kernels widen their weights (Int16Act::qp).
      xa16.kp = isa >= IsaLevel::kAvx512 ? (k + 63) / 64 * 64 : k;
      xq16p.resize(static_cast<size_t>(m) * xa16.kp);
      if (isa >= IsaLevel::kAvx512) {
        qgemv::avx512::PairOrderInt16(xq16.data(), m, k, xq16p.data(), xa16.kp);
      } else {
        qgemv::avx2::LaneOrderInt16(xq16.data(), m, k, xq16p.data());
      }
      xa16.qp = xq16p.data();
    }
    if (need_sum16) xa16.sum16 = SumsOf16(xq16.data(), m * k, xsum16);
  }
  // With accumulate the kernels write a scratch [m][n_total], which the same work unit then
  // adds into y.
  int64_t n_total = 0;
  for (const QuantPart& p : parts) n_total = std::max(n_total, p.col + std::max<int64_t>(0, p.q.n));
  thread_local std::vector<float> acc_tmp;
  float* out = y;
  int64_t ldo = ldy;
  if (accumulate) {
    acc_tmp.resize(static_cast<size_t>(m) * n_total);
    out = acc_tmp.data();
    ldo = n_total;
  }

  // Work units of kRowQuantum rows, so the kernels' row groups stay whole; part p owns units
  // [first[p], first[p + 1]).
  const int64_t q = qgemv::kRowQuantum;
  int64_t first[kMaxParts + 1];
  int64_t unit_bytes = 0;
  first[0] = 0;
  for (size_t p = 0; p < parts.size(); ++p) {
    const QuantMatrix& w = parts[p].q;
    const int64_t units = path[p] == Path::kInvalid ? 0 : (w.n + q - 1) / q;
    first[p + 1] = first[p] + units;
    unit_bytes = std::max(unit_bytes, q * w.row_bytes * std::max(1, m));
  }
  const int64_t units = first[parts.size()];
  if (units == 0) return;

  auto run_part = [&](size_t p, int64_t j0, int64_t j1) {
    const QuantMatrix& w = parts[p].q;
    float* yp = out + parts[p].col;
    switch (path[p]) {
      case Path::kBf16:
        if (qgemv::avx512::RowsBf16(w, xab, yp, ldo, j0, j1)) return;
        if (qgemv::avx512::RowsBf16KQuant(w, xab, yp, ldo, j0, j1)) return;
        break;
      case Path::kInt8:
        if (isa >= IsaLevel::kAvx512 && qgemv::avx512::RowsInt8(w, xa8, yp, ldo, j0, j1)) return;
        if (isa >= IsaLevel::kAvx2 && qgemv::avx2::RowsInt8(w, xa8, yp, ldo, j0, j1)) return;
        qgemv::scalar::RowsInt8(w, xa8, yp, ldo, j0, j1);
        return;
      case Path::kF32Tile:
        if (isa >= IsaLevel::kAvx512 && qgemv::avx512::RowsF32Tile(w, xat, yp, ldo, j0, j1)) return;
        if (qgemv::avx2::RowsF32Tile(w, xat, yp, ldo, j0, j1)) return;
        break;
      case Path::kInt16:
        if (isa >= IsaLevel::kAvx512 && qgemv::avx512::RowsInt16(w, xa16, yp, ldo, j0, j1)) return;
        if (isa >= IsaLevel::kAvx2 && qgemv::avx2::RowsInt16(w, xa16, yp, ldo, j0, j1)) return;
        qgemv::scalar::RowsInt16(w, xa16, yp, ldo, j0, j1);
        return;
      default:
        break;
    }
    if (HasVectorKernel(w.type)) {
      if (isa >= IsaLevel::kAvx512 && qgemv::avx512::RowsF32(w, xa, yp, ldo, j0, j1)) return;
      if (isa >= IsaLevel::kAvx2 && qgemv::avx2::RowsF32(w, xa, yp, ldo, j0, j1)) return;
    }
    qgemv::scalar::RowsF32(w, xa, yp, ldo, j0, j1);
  };
  auto run = [&](int64_t u0, int64_t u1) {
    for (size_t p = 0; p < parts.size(); ++p) {
      const int64_t a = std::max(u0, first[p]), b = std::min(u1, first[p + 1]);
      if (a >= b) continue;
      const int64_t j0 = (a - first[p]) * q, j1 = std::min(parts[p].q.n, (b - first[p]) * q);
      run_part(p, j0, j1);
      if (accumulate) {
        for (int i = 0; i < m; ++i) {
          float* yi = y + i * ldy + parts[p].col;
          const float* ti = out + i * ldo + parts[p].col;
          for (int64_t j = j0; j < j1; ++j) yi[j] += ti[j];
        }
      }
    }
  };
  // One contiguous range per thread (static, no shared counter), none under ~16 KB of weights:
  // each thread then reads one stream, which the prefetchers follow (faster than ~4 dynamic chunks
  // per thread: docs/cpu-kernels.md, "Figures behind the code's constants"). A fork/join costs
  // about as much as streaming 16 KB.
  const int threads = ComputeThreads();
  const int64_t min_units = std::max<int64_t>(1, (16 << 10) / std::max<int64_t>(1, unit_bytes));
  const int64_t grain = std::max<int64_t>(min_units, (units + threads - 1) / threads);
  ParallelFor(units, run, grain);
}

}  // namespace tripod
