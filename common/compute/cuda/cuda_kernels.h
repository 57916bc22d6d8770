// Launchers of the CUDA backend's kernels (elementwise.cu, attention.cu). Plain host functions
// over device pointers, all enqueued on the given stream; cuda_backend.cc turns the Backend
// table's calls into these. Activations are fp32, weights bf16, K/V in the cache's dtype and
// layout (common/kv/kv_layout.h), so that caches and snapshots are the same bytes as the CPU's.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tripod::cuda {

// Weights and their conversion.
void ToBf16(const float* x, int64_t ldx, int m, int k, uint16_t* y, cudaStream_t s);  // y: [m, k]
// Seeded uniform values of standard deviation `stddev` (a shape-only model's weights).
void FillRandomBf16(uint16_t* w, int64_t n, uint64_t seed, float stddev, cudaStream_t s);

// y[m, n] (+)= x[m, k] W[n, k]^T for 1 <= m <= kGemvMaxRows (gemv.cu): the decode steps'
// products, at memory bandwidth. False (nothing ran) when m is out of range, k is not a multiple
// of 8, or x, ldx or w are not 16-byte aligned: the caller then takes cuBLAS.
inline constexpr int kGemvMaxRows = 8;
bool Gemv(const uint16_t* w, int n, int k, const float* x, int64_t ldx, int m, float* y,
          int64_t ldy, bool accumulate, cudaStream_t s);

// The elementwise ops of the Backend table (see backend.h for their meaning).
void Embed(const uint16_t* table, int d, const int32_t* ids, int m, float* out, int64_t ld,
           cudaStream_t s);
void RmsNorm(const float* x, int64_t ldx, const float* w, int m, int n, float eps, float* y,
             int64_t ldy, cudaStream_t s);
void AddBias(float* x, int64_t ldx, const float* b, int m, int n, cudaStream_t s);
void AddScaled(const float* x, int64_t ldx, float alpha, int m, int n, float* y, int64_t ldy,
               cudaStream_t s);
void Rope(float* x, int64_t ldx, int m, int n_heads, int head_dim, const float* cos,
          const float* sin, int rope_dims, bool halves, cudaStream_t s);
void SwiGlu(const float* gu, int64_t ldgu, int m, int n, float* out, int64_t ldo, cudaStream_t s);
void GatherRows(const float* src, int64_t lds, const int32_t* rows, int m, int n, float* dst,
                int64_t ldd, cudaStream_t s);

// One sequence's K/V in one layer (KvLayerRef on the device): block_ids is device memory, or
// null when block b is simply block b (a contiguous cache).
struct KvView {
  uint8_t* k_base = nullptr;
  uint8_t* v_base = nullptr;
  const int32_t* block_ids = nullptr;
  int64_t block_bytes = 0;
  int block_tokens = 0;
  int dtype = 0;  // KvDtype: f32, f16, bf16 (q8_0 is refused by the backend)
  int first_visible = 0;
  int k_tiled = 0;    // KvKTiled
  int bt_shift = -1;  // log2(block_tokens) when a power of two, else -1
};

// K/V rows of up to kMaxKvWrites sequences into their caches in one launch: a decode step of
// 32 sequences wrote with 32 launches per layer before.
inline constexpr int kMaxKvWrites = 24;
struct KvWrite {
  const float* k = nullptr;  // [n, n_kv_heads * head_dim], rows ld apart (v likewise)
  const float* v = nullptr;
  int64_t ld = 0;
  int n = 0, slot_begin = 0;
  KvView kv;
};
struct KvWriteBatch {
  int count = 0, n_kv_heads = 0, head_dim = 0, max_n = 0;
  KvWrite w[kMaxKvWrites];
};
void WriteKv(const KvWriteBatch& b, cudaStream_t s);
// What a launch's grid depends on; the rest of a batch is data. A decode step replayed as a CUDA
// graph (step_graph.h) keeps its batches in device memory, rewritten before each replay, and
// launches with the shape alone: `at` is the batch's copy there.
struct KvWriteShape {
  int count = 0, n_kv_heads = 0, head_dim = 0, max_n = 0;
};
KvWriteShape ShapeOf(const KvWriteBatch& b);
void WriteKvAt(const KvWriteShape& shape, const KvWriteBatch* at, cudaStream_t s);

// Slots [slot0, slot0 + n) of kv as the KV-chunk payload's rows ([K, V][kv_head][slot], head_dim
// elements each, K in row order) and back (kv_rows.cu). f32, f16, bf16.
void PackKvRows(const KvView& kv, int n_kv_heads, int head_dim, int slot0, int n, uint8_t* rows,
                cudaStream_t s);
void UnpackKvRows(const uint8_t* rows, int n_kv_heads, int head_dim, int slot0, int n,
                  const KvView& kv, cudaStream_t s);
// KvLinkHash's sum of terms (common/kv/kv_link_hash.h) of `bytes` at p into *sum (device memory),
// before KvLinkFinish.
void LinkHashSum(const uint8_t* p, uint64_t bytes, unsigned long long* sum, cudaStream_t s);

// Attention of up to kMaxAttnSeqs sequences in one launch (their descriptors travel as the
// kernel's parameters: no upload, and a decode step stays one launch per layer).
inline constexpr int kMaxAttnSeqs = 24;
struct AttnSeq {
  const float* q = nullptr;
  float* out = nullptr;
  int64_t q_stride = 0, out_stride = 0;
  int n_q = 0, n_past = 0;
  KvView kv;
};
struct AttnBatch {
  int n_seqs = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  float scale = 0;
  int max_n_q = 0;
  // Decode (every n_q == 1) may split each query's slots into this many shares run by separate
  // blocks (flash-decoding), merged after; partial: n_seqs * n_heads * splits * (head_dim + 2)
  // floats of device scratch. 1: no split.
  int splits = 1;
  float* partial = nullptr;
  AttnSeq seqs[kMaxAttnSeqs];
};
// Prefill attention on the tensor cores (attention_mma.cu): f16 or bf16 caches, head_dim 64 or
// 128, batches with a sequence of at least kMmaMinQueries queries. False (nothing ran) otherwise.
inline constexpr int kMmaMinQueries = 16;
bool AttentionMma(const AttnBatch& b, cudaStream_t s);
// False when head_dim or the group size is one the kernels do not cover (then nothing ran).
bool Attention(const AttnBatch& b, cudaStream_t s);
// The CUDA-core kernel (never the tensor-core one) on a batch in device memory, as WriteKvAt.
struct AttnShape {
  int n_seqs = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, max_n_q = 0, splits = 1;
};
AttnShape ShapeOf(const AttnBatch& b);
bool AttentionAt(const AttnShape& shape, const AttnBatch* at, cudaStream_t s);

// Draft scoring for one sequence (AttentionScoreArgs), into device buffers max_out and sum_out
// ([n_kv_heads][n_keys], overwritten); stats: device scratch of 2 * n_q * n_heads floats.
struct ScoreArgs {
  const float* q = nullptr;
  int64_t q_stride = 0;
  int n_q = 0, q_slot0 = 0, n_keys = 0;
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;
  float scale = 0;
  bool ramp = false;
  KvView kv;
};
void AttentionScores(const ScoreArgs& a, float* stats, float* max_out, float* sum_out,
                     cudaStream_t s);

}  // namespace tripod::cuda
