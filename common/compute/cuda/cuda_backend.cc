// CudaBackend; see cuda_backend.h. Host side: weight preparation, buffers, cuBLAS, and the
// Backend calls turned into the launchers of cuda_kernels.h.
#include "common/compute/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/compute/cuda/cuda_check.h"
#include "common/compute/cuda/cuda_kernels.h"
#include "common/compute/cuda/step_graph.h"
#include "common/kv/kv_link_hash.h"
#include "common/model/quant_types.h"
#include "common/util/log.h"

namespace tripod {
namespace {

[[noreturn]] void Fatal(const std::string& what) {
  Logger("compute.cuda").critical("CUDA backend: {}", what);
  std::abort();
}

struct DeviceBuffer {
  void* p = nullptr;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t n) : bytes(n) {
    if (n > 0) TRIPOD_CUDA_CHECK(cudaMalloc(&p, n));
  }
  ~DeviceBuffer() {
    if (p != nullptr) cudaFree(p);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

class CudaMatrix final : public PreparedMatrix {
 public:
  CudaMatrix(int64_t n, int64_t k, std::shared_ptr<DeviceBuffer> w)
      : n_(n), k_(k), w_(std::move(w)) {}
  int64_t n() const override { return n_; }
  int64_t k() const override { return k_; }
  size_t resident_bytes() const override { return size_t{2} * n_ * k_; }
  const uint16_t* w() const { return static_cast<const uint16_t*>(w_->p); }

 private:
  int64_t n_, k_;
  std::shared_ptr<DeviceBuffer> w_;
};

class CudaVector final : public PreparedVector {
 public:
  CudaVector(int64_t n, std::unique_ptr<DeviceBuffer> v) : n_(n), v_(std::move(v)) {}
  int64_t size() const override { return n_; }
  const float* data() const override { return static_cast<const float*>(v_->p); }  // device

 private:
  int64_t n_;
  std::unique_ptr<DeviceBuffer> v_;
};

// A scratch device buffer that only grows (growing frees the old one; cudaFree waits for the
// device, so nothing enqueued still uses it).
struct Scratch {
  std::unique_ptr<DeviceBuffer> buf;
  void* Get(size_t bytes) {
    if (!buf || buf->bytes < bytes)
      buf = std::make_unique<DeviceBuffer>(std::max(bytes, size_t{256}) * 3 / 2);
    return buf->p;
  }
};

// KvLayerRef -> KvView, block_ids left null (the caller puts a device table there, or needs none).
cuda::KvView ViewWithoutTable(const KvLayerRef& kv, int head_dim) {
  if (kv.dtype == KvDtype::kQ8_0) Fatal("KV dtype q8_0 is not supported on CUDA");
  cuda::KvView v;
  v.k_base = kv.k_base;
  v.v_base = kv.v_base;
  v.block_bytes = static_cast<int64_t>(kv.block_bytes);
  v.block_tokens = kv.block_tokens;
  v.dtype = static_cast<int>(kv.dtype);
  v.first_visible = kv.first_visible_slot;
  v.k_tiled = kv.k_tiled(head_dim) ? 1 : 0;
  if (kv.block_tokens > 0 && (kv.block_tokens & (kv.block_tokens - 1)) == 0) {
    v.bt_shift = __builtin_ctz(static_cast<unsigned>(kv.block_tokens));
  }
  return v;
}

// KvMemory::read_rows / write_rows: the blocks that hold the slots get a device table of their
// own, the rows one scratch buffer, all on the calling thread's default stream (any thread: the
// backend's state is not touched), waited for.
// rows: host memory (staged through a device scratch buffer) or, device_rows, device memory.
void KvRowsThroughDevice(const KvLayerRef& ref, int heads, int head_dim, int s0, int s1,
                         uint8_t* host_rows, bool read, bool device_rows = false) {
  if (s1 <= s0) return;
  const int bt = ref.block_tokens;
  const int b0 = s0 / bt, b1 = (s1 - 1) / bt;
  const size_t n_blocks = static_cast<size_t>(b1 - b0 + 1);
  const size_t table_bytes = (n_blocks * sizeof(int32_t) + 255) / 256 * 256;
  const size_t bytes = 2 * size_t{1} * heads * (s1 - s0) * KvRowBytes(ref.dtype, head_dim);
  cudaStream_t st = cudaStreamPerThread;
  void* scratch = nullptr;
  TRIPOD_CUDA_CHECK(cudaMallocAsync(&scratch, table_bytes + (device_rows ? 0 : bytes), st));
  int32_t* table = static_cast<int32_t*>(scratch);
  uint8_t* rows = device_rows ? host_rows : static_cast<uint8_t*>(scratch) + table_bytes;
  TRIPOD_CUDA_CHECK(cudaMemcpyAsync(table, ref.block_ids + b0, n_blocks * sizeof(int32_t),
                                    cudaMemcpyHostToDevice, st));
  cuda::KvView v = ViewWithoutTable(ref, head_dim);
  v.block_ids = table;  // block b0 is the table's first: slots shift by b0 blocks
  const int slot0 = s0 - b0 * bt;
  if (read) {
    cuda::PackKvRows(v, heads, head_dim, slot0, s1 - s0, rows, st);
    if (!device_rows) {
      TRIPOD_CUDA_CHECK(cudaMemcpyAsync(host_rows, rows, bytes, cudaMemcpyDeviceToHost, st));
    }
  } else {
    if (!device_rows) {
      TRIPOD_CUDA_CHECK(cudaMemcpyAsync(rows, host_rows, bytes, cudaMemcpyHostToDevice, st));
    }
    cuda::UnpackKvRows(rows, heads, head_dim, slot0, s1 - s0, v, st);
  }
  TRIPOD_CUDA_CHECK(cudaFreeAsync(scratch, st));
  TRIPOD_CUDA_CHECK(cudaStreamSynchronize(st));
}

// The ops a decode step records (StepOp::kind) and their arguments' order in StepOp::a.
enum OpKind : uint32_t {
  kEmbed,       // table, d, ids*, m, out, ld
  kRmsNorm,     // x, ldx, w, m, n, eps, y, ldy
  kLinear,      // w, n, k, x, m, ldx, y, ldy, accumulate
  kAddBias,     // x, ldx, b, m, n
  kAddScaled,   // x, ldx, alpha, m, n, y, ldy
  kRope,        // x, ldx, m, n_heads, head_dim, cos, sin, rope_dims, halves
  kSwiGlu,      // gu, ldgu, m, n, out, ldo
  kGatherRows,  // src, lds, rows*, m, n, dst, ldd
  kCopy,        // src*, dst, bytes (device to device: FromHost's staged bytes into place)
  kWriteKv,     // batch*, count, n_kv_heads, head_dim, max_n
  kAttention,   // batch*, n_seqs, n_heads, n_kv_heads, head_dim, max_n_q, splits
};
// (* : an address that is staged bytes while recording)

template <class T>
uint64_t Word(T* p) {
  return reinterpret_cast<uint64_t>(p);
}
template <class T>
requires std::is_integral_v<T> uint64_t Word(T v) {
  return static_cast<uint64_t>(static_cast<int64_t>(v));
}
uint64_t Word(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  return bits;
}

StepOp MakeOp(OpKind kind, std::initializer_list<uint64_t> args) {
  StepOp op;
  op.kind = kind;
  int i = 0;
  for (uint64_t a : args) op.a[i++] = a;
  return op;
}

// An argument of a recorded op: an address (staged offsets made addresses in `arena`), an
// integer, a float.
template <class T>
T* Ptr(const StepOp& op, int i, uint8_t* arena) {
  if ((op.arena_args >> i) & 1) return reinterpret_cast<T*>(arena + op.a[i]);
  return reinterpret_cast<T*>(op.a[i]);
}
int64_t Int(const StepOp& op, int i) { return static_cast<int64_t>(op.a[i]); }
int I32(const StepOp& op, int i) { return static_cast<int>(op.a[i]); }
float Flt(const StepOp& op, int i) {
  const uint32_t bits = static_cast<uint32_t>(op.a[i]);
  float v;
  std::memcpy(&v, &bits, sizeof(v));
  return v;
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaBackendOptions& options) : device_(options.device) {
    const int device = options.device;
    TRIPOD_CUDA_CHECK(cudaSetDevice(device));
    cudaDeviceProp prop;
    TRIPOD_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    name_ = absl::StrCat("cuda:", device, " (", prop.name, ")");
    sm_count_ = prop.multiProcessorCount;
    device_uuid_ = "cuda:";
    for (unsigned char c : prop.uuid.bytes)
      absl::StrAppend(&device_uuid_, absl::Hex(c, absl::kZeroPad2));
    TRIPOD_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    TRIPOD_CUBLAS_CHECK(cublasCreate(&cublas_));
    TRIPOD_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
    if (options.graphs) {
      // cuBLAS's own workspace, so that a captured GEMM allocates nothing (NVIDIA's size for
      // Hopper).
      cublas_workspace_ = std::make_unique<DeviceBuffer>(size_t{32} << 20);
      TRIPOD_CUBLAS_CHECK(
          cublasSetWorkspace(cublas_, cublas_workspace_->p, cublas_workspace_->bytes));
      graphs_ = std::make_unique<StepGraphs>(stream_, options.max_graphs);
    }
  }
  ~CudaBackend() override {
    FlushWrites();
    EndStep();
    cudaStreamSynchronize(stream_);
    graphs_.reset();
    tables_.clear();
    cublasDestroy(cublas_);
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return name_; }

  float* Alloc(size_t floats) override {
    void* p = nullptr;
    TRIPOD_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(floats, 1) * sizeof(float)));
    return static_cast<float*>(p);
  }
  void Free(float* p) override {
    FlushWrites();
    EndStep();  // recorded ops may use the memory
    TRIPOD_CUDA_CHECK(cudaFree(p));
  }

  absl::StatusOr<std::unique_ptr<PreparedMatrix>> PrepareMatrix(
      std::span<const GgufTensorInfo* const> parts) override {
    if (parts.size() == 1) {
      // One tensor may serve twice (a tied head is the embedding table): one device copy.
      std::shared_ptr<DeviceBuffer> t = Table(*parts[0], /*keep=*/false);
      return std::make_unique<CudaMatrix>(parts[0]->rows(), parts[0]->cols(), std::move(t));
    }
    return Upload(parts, {});
  }
  absl::StatusOr<std::unique_ptr<PreparedMatrix>> PrepareScaledMatrix(
      std::span<const GgufTensorInfo* const> parts,
      std::span<const float* const> col_scales) override {
    return Upload(parts, col_scales);
  }
  absl::StatusOr<std::unique_ptr<PreparedVector>> PrepareVector(const GgufTensorInfo& t) override {
    const int64_t n = static_cast<int64_t>(t.n_elements);
    std::vector<float> host(n, 1.0f);  // a tensor without bytes: ones (norm weights)
    if (t.data != nullptr) DequantizeRow(t.type, t.data, host.data(), n);
    auto buf = std::make_unique<DeviceBuffer>(sizeof(float) * n);
    TRIPOD_CUDA_CHECK(
        cudaMemcpyAsync(buf->p, host.data(), sizeof(float) * n, cudaMemcpyHostToDevice, stream_));
    TRIPOD_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return std::make_unique<CudaVector>(n, std::move(buf));
  }
  bool CopiesWeights() const override { return true; }

  void Embed(const GgufTensorInfo& table, std::span<const int32_t> ids, float* out,
             int64_t ld_out) override {
    FlushWrites();
    std::shared_ptr<DeviceBuffer> t = Table(table, /*keep=*/true);
    StepOp op = MakeOp(kEmbed, {Word(t->p), Word(table.cols()), 0,
                                Word(static_cast<int64_t>(ids.size())), Word(out), Word(ld_out)});
    SetInts(op, 2, ids, ids_);
    Run(op);
  }
  void RmsNorm(const float* x, int64_t ldx, const PreparedVector& w, int m, int n, float eps,
               float* y, int64_t ldy) override {
    FlushWrites();
    Run(MakeOp(kRmsNorm, {Word(x), Word(ldx), Word(w.data()), Word(m), Word(n), Word(eps), Word(y),
                          Word(ldy)}));
  }
  void Linear(const PreparedMatrix& w, const float* x, int m, int64_t ldx, float* y, int64_t ldy,
              bool accumulate) override {
    FlushWrites();
    if (m <= 0) return;
    const auto& cw = static_cast<const CudaMatrix&>(w);
    if (Recording()) act_.Get(sizeof(uint16_t) * m * cw.k());  // no allocation once captured
    Run(MakeOp(kLinear, {Word(cw.w()), Word(cw.n()), Word(cw.k()), Word(x), Word(m), Word(ldx),
                         Word(y), Word(ldy), Word(int64_t{accumulate})}));
  }
  void AddBias(float* x, int64_t ldx, const PreparedVector& b, int m, int n) override {
    FlushWrites();
    Run(MakeOp(kAddBias, {Word(x), Word(ldx), Word(b.data()), Word(m), Word(n)}));
  }
  void AddScaled(const float* x, int64_t ldx, float alpha, int m, int n, float* y,
                 int64_t ldy) override {
    FlushWrites();
    Run(MakeOp(kAddScaled,
               {Word(x), Word(ldx), Word(alpha), Word(m), Word(n), Word(y), Word(ldy)}));
  }
  void Rope(float* x, int64_t ldx, int m, int n_heads, int head_dim, const RopeAngles& a) override {
    FlushWrites();
    Run(MakeOp(kRope, {Word(x), Word(ldx), Word(m), Word(n_heads), Word(head_dim), Word(a.cos),
                       Word(a.sin), Word(a.rope_dims), Word(int64_t{a.halves})}));
  }
  void SwiGlu(const float* gu, int64_t ldgu, int m, int n, float* out, int64_t ldo) override {
    FlushWrites();
    Run(MakeOp(kSwiGlu, {Word(gu), Word(ldgu), Word(m), Word(n), Word(out), Word(ldo)}));
  }
  void GatherRows(const float* src, int64_t lds, std::span<const int32_t> src_rows, int n,
                  float* dst, int64_t ldd) override {
    FlushWrites();
    StepOp op =
        MakeOp(kGatherRows, {Word(src), Word(lds), 0, Word(static_cast<int64_t>(src_rows.size())),
                             Word(n), Word(dst), Word(ldd)});
    SetInts(op, 2, src_rows, rows_);
    Run(op);
  }

  // Graphs: from here to the next ToHost (or Synchronize) is one decode step (backend.h).
  void BeginGraphStep() override {
    if (!graphs_) return;
    FlushWrites();
    EndStep();
    graphs_->Begin();
  }

  // Writes wait in a batch until the next op (one launch for every sequence of a layer).
  void WriteKv(const float* k, const float* v, int m, int64_t ld, int n_kv_heads, int head_dim,
               const KvLayerRef& kv, int64_t slot_begin) override {
    if (m <= 0) return;
    op_thread_.store(std::this_thread::get_id(), std::memory_order_relaxed);
    if (!pending_.empty() && (pending_heads_ != n_kv_heads || pending_hd_ != head_dim ||
                              pending_.size() == static_cast<size_t>(cuda::kMaxKvWrites))) {
      FlushWrites();
    }
    pending_.push_back(PendingWrite{k, v, m, ld, kv, slot_begin});
    pending_heads_ = n_kv_heads;
    pending_hd_ = head_dim;
  }

  void Attention(std::span<const AttentionArgs> seqs) override {
    FlushWrites();
    if (Recording()) {
      // A step with prefill rows (the tensor-core kernel, chosen per call) is not recorded.
      for (const AttentionArgs& a : seqs) {
        if (a.n_q >= cuda::kMmaMinQueries) EndStep();
      }
    }
    for (size_t begin = 0; begin < seqs.size(); begin += cuda::kMaxAttnSeqs) {
      const size_t n = std::min<size_t>(cuda::kMaxAttnSeqs, seqs.size() - begin);
      cuda::AttnBatch b;
      size_t blocks = 0;
      for (size_t i = 0; i < n; ++i) {
        const AttentionArgs& a = seqs[begin + i];
        blocks += BlocksOf(a.kv, int64_t{a.n_past} + a.n_q);
      }
      if (!Recording()) ReserveTables(blocks);
      int64_t table_at[cuda::kMaxAttnSeqs];
      for (size_t i = 0; i < n; ++i) {
        const AttentionArgs& a = seqs[begin + i];
        if (i == 0) {
          b.n_heads = a.n_heads;
          b.n_kv_heads = a.n_kv_heads;
          b.head_dim = a.head_dim;
          b.scale = a.scale;
        } else if (a.n_heads != b.n_heads || a.n_kv_heads != b.n_kv_heads ||
                   a.head_dim != b.head_dim || a.scale != b.scale) {
          Fatal("attention: sequences of one call differ in head shape");
        }
        cuda::AttnSeq& s = b.seqs[b.n_seqs++];
        s.q = a.q;
        s.out = a.out;
        s.q_stride = a.q_stride;
        s.out_stride = a.out_stride;
        s.n_q = a.n_q;
        s.n_past = a.n_past;
        s.kv = View(a.kv, a.head_dim, int64_t{a.n_past} + a.n_q, &table_at[i]);
        b.max_n_q = std::max(b.max_n_q, a.n_q);
      }
      // Decode with few sequences fills few blocks (one per sequence and KV head): split each
      // query's slots so that the grid covers the GPU about twice, in shares of 2+ tiles.
      if (b.max_n_q == 1) {
        int max_slots = 0;
        for (int i = 0; i < b.n_seqs; ++i) max_slots = std::max(max_slots, b.seqs[i].n_past + 1);
        const int blocks = b.n_seqs * b.n_kv_heads;
        const int by_size = std::max(1, max_slots / 64);
        b.splits = std::clamp(2 * sm_count_ / std::max(blocks, 1), 1, std::min(by_size, 64));
        if (b.splits > 1 && !Recording()) {
          b.partial = static_cast<float*>(
              partial_.Get(sizeof(float) * b.n_seqs * b.n_heads * b.splits * (b.head_dim + 2)));
        }
      }
      if (Recording()) {
        RecordAttention(b, table_at);
        continue;
      }
      if (cuda::AttentionMma(b, stream_)) continue;
      if (!cuda::Attention(b, stream_)) {
        Fatal(absl::StrCat("attention: head_dim ", b.head_dim, " with ", b.n_heads, " heads over ",
                           b.n_kv_heads,
                           " KV heads is not covered (head_dim 64 or 128, at most "
                           "16 query heads per KV head)"));
      }
    }
  }

  void AttentionScores(std::span<const AttentionScoreArgs> seqs) override {
    FlushWrites();
    EndStep();  // it waits for its results: not a graph's
    for (const AttentionScoreArgs& a : seqs) {
      if (a.n_q == 0 || a.n_keys == 0) continue;
      ReserveTables(BlocksOf(a.kv, a.n_keys));
      int64_t no_table;
      cuda::ScoreArgs s;
      s.q = a.q;
      s.q_stride = a.q_stride;
      s.n_q = a.n_q;
      s.q_slot0 = a.q_slot0;
      s.n_keys = a.n_keys;
      s.n_heads = a.n_heads;
      s.n_kv_heads = a.n_kv_heads;
      s.head_dim = a.head_dim;
      s.scale = a.scale;
      s.ramp = a.ramp_weights;
      s.kv = View(a.kv, a.head_dim, a.n_keys, &no_table);
      const size_t cells = size_t{1} * a.n_kv_heads * a.n_keys;
      auto* dev = static_cast<float*>(
          scores_.Get(sizeof(float) * (2 * cells + 2 * size_t{1} * a.n_q * a.n_heads)));
      cuda::AttentionScores(s, dev + 2 * cells, dev, dev + cells, stream_);
      std::vector<float> host(2 * cells);
      TRIPOD_CUDA_CHECK(cudaMemcpyAsync(host.data(), dev, sizeof(float) * 2 * cells,
                                        cudaMemcpyDeviceToHost, stream_));
      TRIPOD_CUDA_CHECK(cudaStreamSynchronize(stream_));
      for (size_t i = 0; i < cells; ++i) {
        if (a.max_out != nullptr) a.max_out[i] = std::max(a.max_out[i], host[i]);
        if (a.sum_out != nullptr) a.sum_out[i] += host[cells + i];
      }
    }
  }

  void ToHost(const float* src, size_t n, float* host_dst) override {
    FlushWrites();
    EndStep();
    TRIPOD_CUDA_CHECK(
        cudaMemcpyAsync(host_dst, src, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    TRIPOD_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void FromHost(const float* host_src, size_t n, float* dst) override {
    FlushWrites();
    if (Recording()) {
      StepOp op = MakeOp(kCopy, {graphs_->tape().Stage(host_src, n * sizeof(float)), Word(dst),
                                 Word(static_cast<int64_t>(n * sizeof(float)))});
      op.arena_args = 1;
      Run(op);
      return;
    }
    // From pageable memory the copy is staged before the call returns (the source may change).
    TRIPOD_CUDA_CHECK(
        cudaMemcpyAsync(dst, host_src, n * sizeof(float), cudaMemcpyHostToDevice, stream_));
  }

  absl::Status Supports(const ModelConfig& config, KvDtype kv) const override {
    if (kv == KvDtype::kQ8_0) {
      return absl::InvalidArgumentError("the CUDA backend keeps K/V as f32, f16 or bf16, not q8_0");
    }
    if (!CudaSupportsHeadDim(config.head_dim)) {
      return absl::UnimplementedError(
          absl::StrCat("the CUDA attention kernels cover head_dim 64 and 128; this model has ",
                       config.head_dim));
    }
    if (config.n_heads % config.n_kv_heads != 0 || config.n_heads / config.n_kv_heads > 16) {
      return absl::UnimplementedError(
          absl::StrCat("the CUDA attention kernels cover up to 16 query heads per KV head; this "
                       "model has ",
                       config.n_heads, " over ", config.n_kv_heads));
    }
    return absl::OkStatus();
  }

  void Synchronize() override {
    FlushWrites();
    EndStep();
    TRIPOD_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  std::optional<KvMemory> DeviceKvMemory() override {
    KvMemory m;
    // Any thread allocates and frees (a KV link's buffer on its own thread), while this backend's
    // thread may be capturing a step on the compute stream: these never enqueue on that stream,
    // and wait for it only outside a capture.
    m.alloc = [](size_t bytes) -> uint8_t* {
      void* p = nullptr;
      if (cudaMalloc(&p, bytes) != cudaSuccess) {
        cudaGetLastError();  // clear it: the caller reports the shortage
        return nullptr;
      }
      TRIPOD_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, cudaStreamPerThread));
      TRIPOD_CUDA_CHECK(cudaStreamSynchronize(cudaStreamPerThread));
      return static_cast<uint8_t*>(p);
    };
    m.free = [this](uint8_t* p) {
      if (op_thread_.load(std::memory_order_relaxed) == std::this_thread::get_id()) {
        Synchronize();  // this thread's waiting writes and recorded step may use the memory
      } else if (graphs_) {
        MutexLock no_capture(&graphs_->capture_mutex());
        cudaStreamSynchronize(stream_);
      } else {
        cudaStreamSynchronize(stream_);
      }
      cudaFree(p);
    };
    // Callers order these after the ops that touch the same bytes (kv_memory.h), so they need not
    // wait for this backend's stream: each thread's own default stream, which the compute stream
    // (non-blocking) does not wait for either, and is waited for before returning (a
    // device-to-device cudaMemcpy alone would not be).
    auto copy = [](void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
      TRIPOD_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, kind, cudaStreamPerThread));
      TRIPOD_CUDA_CHECK(cudaStreamSynchronize(cudaStreamPerThread));
    };
    m.to_host = [copy](uint8_t* host, const uint8_t* src, size_t n) {
      copy(host, src, n, cudaMemcpyDeviceToHost);
    };
    m.from_host = [copy](uint8_t* dst, const uint8_t* host, size_t n) {
      copy(dst, host, n, cudaMemcpyHostToDevice);
    };
    m.copy = [copy](uint8_t* dst, const uint8_t* src, size_t n) {
      copy(dst, src, n, cudaMemcpyDeviceToDevice);
    };
    m.read_rows = [](const KvLayerRef& ref, int heads, int head_dim, int s0, int s1,
                     uint8_t* rows) {
      KvRowsThroughDevice(ref, heads, head_dim, s0, s1, rows, true);
    };
    m.write_rows = [](const uint8_t* rows, int heads, int head_dim, int s0, int s1,
                      const KvLayerRef& ref) {
      KvRowsThroughDevice(ref, heads, head_dim, s0, s1, const_cast<uint8_t*>(rows), false);
    };
    m.gather_rows = [](const KvLayerRef& ref, int heads, int head_dim, int s0, int s1,
                       uint8_t* rows) {
      KvRowsThroughDevice(ref, heads, head_dim, s0, s1, rows, true, /*device_rows=*/true);
    };
    m.scatter_rows = [](const uint8_t* rows, int heads, int head_dim, int s0, int s1,
                        const KvLayerRef& ref) {
      KvRowsThroughDevice(ref, heads, head_dim, s0, s1, const_cast<uint8_t*>(rows), false,
                          /*device_rows=*/true);
    };
    // IPC: a decode worker's link buffer that a prefill worker on the same GPU maps.
    m.alloc_shared = [](size_t bytes, std::string* handle) -> uint8_t* {
      void* p = nullptr;
      if (cudaMalloc(&p, bytes) != cudaSuccess) {
        cudaGetLastError();
        return nullptr;
      }
      cudaIpcMemHandle_t h;
      if (cudaIpcGetMemHandle(&h, p) != cudaSuccess) {
        cudaGetLastError();
        cudaFree(p);
        return nullptr;
      }
      handle->assign(reinterpret_cast<const char*>(&h), sizeof(h));
      return static_cast<uint8_t*>(p);
    };
    m.open_shared = [device = device_](const std::string& handle, std::string* error) -> uint8_t* {
      if (handle.size() != sizeof(cudaIpcMemHandle_t)) {
        *error = "not a CUDA IPC handle";
        return nullptr;
      }
      cudaIpcMemHandle_t h;
      std::memcpy(&h, handle.data(), sizeof(h));
      void* p = nullptr;
      cudaSetDevice(device);  // this thread's (a link's set-up thread)
      const cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
      if (e != cudaSuccess) {
        cudaGetLastError();
        *error = absl::StrCat("cudaIpcOpenMemHandle: ", cudaGetErrorString(e));
        return nullptr;
      }
      return static_cast<uint8_t*>(p);
    };
    m.close_shared = [](uint8_t* p) { cudaIpcCloseMemHandle(p); };
    m.device = device_uuid_;
    m.hash = [](const uint8_t* p, size_t n) {
      cudaStream_t st = cudaStreamPerThread;
      void* sum = nullptr;
      TRIPOD_CUDA_CHECK(cudaMallocAsync(&sum, sizeof(unsigned long long), st));
      cuda::LinkHashSum(p, n, static_cast<unsigned long long*>(sum), st);
      unsigned long long host = 0;
      TRIPOD_CUDA_CHECK(cudaMemcpyAsync(&host, sum, sizeof(host), cudaMemcpyDeviceToHost, st));
      TRIPOD_CUDA_CHECK(cudaFreeAsync(sum, st));
      TRIPOD_CUDA_CHECK(cudaStreamSynchronize(st));
      return KvLinkFinish(host, n);
    };
    return m;
  }

 private:
  // One tensor's bf16 copy on the device, shared by its users (a tied head is the embedding
  // table). Embed keeps its tables for the backend's life (nothing else owns them); a matrix's
  // copy lives as long as the matrix. An entry is trusted only for the same bytes and shape.
  std::shared_ptr<DeviceBuffer> Table(const GgufTensorInfo& t, bool keep) {
    TableEntry& e = tables_[&t];
    std::shared_ptr<DeviceBuffer> buf = e.buf.lock();
    if (!buf || e.data != t.data || e.rows != t.rows() || e.cols != t.cols()) {
      const GgufTensorInfo* parts[] = {&t};
      buf = UploadBuffer(parts, {});
      e = TableEntry{buf, t.data, t.rows(), t.cols(), nullptr};
    }
    if (keep) e.kept = buf;
    return buf;
  }

  absl::StatusOr<std::unique_ptr<PreparedMatrix>> Upload(
      std::span<const GgufTensorInfo* const> parts, std::span<const float* const> col_scales) {
    if (parts.empty()) return absl::InvalidArgumentError("no tensors to prepare");
    int64_t n = 0;
    const int64_t k = parts[0]->cols();
    for (const GgufTensorInfo* t : parts) {
      if (t->cols() != k) {
        return absl::InvalidArgumentError(
            absl::StrCat("stacked tensors differ in width: ", t->name, " has ", t->cols()));
      }
      n += t->rows();
    }
    return std::make_unique<CudaMatrix>(n, k, UploadBuffer(parts, col_scales));
  }

  // Stacks the parts' rows as bf16 in one device buffer: dequantised on the host in chunks of
  // rows (column scales applied), or seeded random values made on the device for a tensor
  // without bytes (standard deviation 1/sqrt(k), so that activations keep their scale).
  std::shared_ptr<DeviceBuffer> UploadBuffer(std::span<const GgufTensorInfo* const> parts,
                                             std::span<const float* const> col_scales) {
    int64_t n = 0;
    const int64_t k = parts[0]->cols();
    for (const GgufTensorInfo* t : parts) n += t->rows();
    auto buf = std::make_shared<DeviceBuffer>(sizeof(uint16_t) * n * k);
    auto* dst = static_cast<uint16_t*>(buf->p);
    std::vector<float> rowf(k);
    std::vector<uint16_t> chunk;
    int64_t row0 = 0;
    for (size_t p = 0; p < parts.size(); ++p) {
      const GgufTensorInfo& t = *parts[p];
      const int64_t rows = t.rows();
      if (t.data == nullptr) {
        cuda::FillRandomBf16(dst + row0 * k, rows * k, ++seed_,
                             1.0f / std::sqrt(static_cast<float>(k)), stream_);
        row0 += rows;
        continue;
      }
      const size_t row_bytes = t.n_bytes / static_cast<size_t>(rows);
      const float* scale = col_scales.empty() ? nullptr : col_scales[p];
      const int64_t chunk_rows = std::max<int64_t>(1, (int64_t{1} << 22) / k);
      for (int64_t r = 0; r < rows; r += chunk_rows) {
        const int64_t nr = std::min(chunk_rows, rows - r);
        chunk.resize(nr * k);
        for (int64_t i = 0; i < nr; ++i) {
          DequantizeRow(t.type, t.data + (r + i) * row_bytes, rowf.data(), k);
          for (int64_t j = 0; j < k; ++j) {
            chunk[i * k + j] = Fp32ToBf16(scale != nullptr ? rowf[j] * scale[j] : rowf[j]);
          }
        }
        // On the backend's stream (which the legacy stream's copies would not order with);
        // the chunk is reused only after the stream caught up.
        TRIPOD_CUDA_CHECK(cudaMemcpyAsync(dst + (row0 + r) * k, chunk.data(),
                                          sizeof(uint16_t) * nr * k, cudaMemcpyHostToDevice,
                                          stream_));
        TRIPOD_CUDA_CHECK(cudaStreamSynchronize(stream_));
      }
      row0 += rows;
    }
    TRIPOD_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return buf;
  }

  const int32_t* UploadInts(std::span<const int32_t> v, Scratch& where) {
    auto* d = static_cast<int32_t*>(where.Get(sizeof(int32_t) * std::max<size_t>(v.size(), 1)));
    if (!v.empty()) {
      TRIPOD_CUDA_CHECK(cudaMemcpyAsync(d, v.data(), sizeof(int32_t) * v.size(),
                                        cudaMemcpyHostToDevice, stream_));
    }
    return d;
  }

  // KvLayerRef -> KvView. A block table that maps block b to b (a contiguous cache) needs none on
  // the device; another table's blocks up to `slots` are copied into this call's table space, or
  // staged while a step is recorded (*table_at: its offset there, for a PointAt; else -1).
  cuda::KvView View(const KvLayerRef& kv, int head_dim, int64_t slots, int64_t* table_at) {
    cuda::KvView v = ViewWithoutTable(kv, head_dim);
    const int64_t blocks = static_cast<int64_t>(BlocksOf(kv, slots));
    bool identity = true;
    for (int64_t b = 0; b < blocks && identity; ++b) identity = kv.block_ids[b] == b;
    *table_at = -1;
    if (!identity && Recording()) {
      *table_at = static_cast<int64_t>(graphs_->tape().StageTable(
          std::span<const int32_t>(kv.block_ids, static_cast<size_t>(blocks))));
    } else if (!identity) {
      table_host_.assign(kv.block_ids, kv.block_ids + blocks);
      // Each view of one call gets its own stretch of the table space (ReserveTables).
      if (!block_tables_.buf || block_tables_.buf->bytes < (tables_used_ + blocks) * 4) {
        Fatal("block table space was not reserved for this call");
      }
      int32_t* d = static_cast<int32_t*>(block_tables_.buf->p) + tables_used_;
      TRIPOD_CUDA_CHECK(cudaMemcpyAsync(d, table_host_.data(), sizeof(int32_t) * blocks,
                                        cudaMemcpyHostToDevice, stream_));
      tables_used_ += blocks;
      v.block_ids = d;
    }
    return v;
  }

  struct PendingWrite {
    const float* k;
    const float* v;
    int m;
    int64_t ld;
    KvLayerRef kv;  // its block table is the store's, unchanged until the next op
    int64_t slot_begin;
  };
  void FlushWrites() {
    op_thread_.store(std::this_thread::get_id(), std::memory_order_relaxed);
    if (pending_.empty()) return;
    size_t blocks = 0;
    for (const PendingWrite& p : pending_) blocks += BlocksOf(p.kv, p.slot_begin + p.m);
    if (!Recording()) ReserveTables(blocks);
    int64_t table_at[cuda::kMaxKvWrites];
    cuda::KvWriteBatch b;
    b.n_kv_heads = pending_heads_;
    b.head_dim = pending_hd_;
    for (const PendingWrite& p : pending_) {
      cuda::KvWrite& w = b.w[b.count++];
      w.k = p.k;
      w.v = p.v;
      w.ld = p.ld;
      w.n = p.m;
      w.slot_begin = static_cast<int>(p.slot_begin);
      w.kv = View(p.kv, pending_hd_, p.slot_begin + p.m, &table_at[b.count - 1]);
      b.max_n = std::max(b.max_n, p.m);
    }
    pending_.clear();
    if (!Recording()) return cuda::WriteKv(b, stream_);
    const uint64_t at = StageBatch<cuda::KvWrite>(b, offsetof(cuda::KvWriteBatch, w),
                                                  offsetof(cuda::KvWrite, kv), b.count, table_at);
    StepOp op =
        MakeOp(kWriteKv, {at, Word(b.count), Word(b.n_kv_heads), Word(b.head_dim), Word(b.max_n)});
    op.arena_args = 1;
    Run(op);
  }

  // A batch of a recorded step, staged: its header and `count` entries (the used part), each
  // entry's block table pointed at its staged table (table_at[i]; < 0: none) at upload. Returns
  // the batch's staged offset.
  template <class Entry, class Batch>
  uint64_t StageBatch(const Batch& b, size_t entries_at, size_t kv_at, int count,
                      const int64_t* table_at) {
    StepTape& tape = graphs_->tape();
    const uint64_t at = tape.Stage(&b, entries_at + sizeof(Entry) * count);
    for (int i = 0; i < count; ++i) {
      if (table_at[i] < 0) continue;
      tape.PointAt(at + entries_at + sizeof(Entry) * i + kv_at + offsetof(cuda::KvView, block_ids),
                   StepRegion::kTables, static_cast<uint64_t>(table_at[i]));
    }
    return at;
  }

  // An attention batch of a recorded step, staged as WriteKv's (the split-merging scratch in the
  // step's device-only scratch).
  void RecordAttention(const cuda::AttnBatch& b, const int64_t* table_at) {
    StepTape& tape = graphs_->tape();
    const uint64_t at = StageBatch<cuda::AttnSeq>(b, offsetof(cuda::AttnBatch, seqs),
                                                  offsetof(cuda::AttnSeq, kv), b.n_seqs, table_at);
    if (b.splits > 1) {
      const uint64_t partial =
          tape.Scratch(sizeof(float) * b.n_seqs * b.n_heads * b.splits * (b.head_dim + 2));
      tape.PointAt(at + offsetof(cuda::AttnBatch, partial), StepRegion::kScratch, partial);
    }
    StepOp op = MakeOp(kAttention, {at, Word(b.n_seqs), Word(b.n_heads), Word(b.n_kv_heads),
                                    Word(b.head_dim), Word(b.max_n_q), Word(b.splits)});
    op.arena_args = 1;
    Run(op);
  }

  bool Recording() const { return graphs_ && graphs_->recording(); }

 public:
  CudaGraphStats graph_stats() const {
    if (!graphs_) return {};
    const StepGraphs::Counts& c = graphs_->counts();
    return CudaGraphStats{c.replays, c.captures, c.runs, graphs_->graphs()};
  }

 private:
  // Runs an op now, or records it while a step is recorded.
  void Run(const StepOp& op) {
    if (Recording()) {
      graphs_->tape().Push(op);
    } else {
      Launch(op, nullptr);
    }
  }

  // Ends a recorded step: runs it (StepGraphs::Flush). A no-op when none is recorded.
  void EndStep() {
    if (!Recording()) return;
    graphs_->Flush([this](const StepOp& op, uint8_t* arena) { Launch(op, arena); },
                   Word(act_.buf ? act_.buf->p : nullptr));
  }

  // The ids argument i of `op`: staged while recording, else uploaded into `where`.
  void SetInts(StepOp& op, int i, std::span<const int32_t> ids, Scratch& where) {
    if (Recording()) {
      op.a[i] = graphs_->tape().Stage(ids.data(), ids.size_bytes());
      op.arena_args |= 1u << i;
    } else {
      op.a[i] = Word(UploadInts(ids, where));
    }
  }

  // Enqueues one op (recorded or not) on the stream.
  void Launch(const StepOp& op, uint8_t* arena) {
    switch (op.kind) {
      case kEmbed:
        return cuda::Embed(Ptr<const uint16_t>(op, 0, arena), I32(op, 1),
                           Ptr<const int32_t>(op, 2, arena), I32(op, 3), Ptr<float>(op, 4, arena),
                           Int(op, 5), stream_);
      case kRmsNorm:
        return cuda::RmsNorm(Ptr<const float>(op, 0, arena), Int(op, 1),
                             Ptr<const float>(op, 2, arena), I32(op, 3), I32(op, 4), Flt(op, 5),
                             Ptr<float>(op, 6, arena), Int(op, 7), stream_);
      case kLinear:
        return LaunchLinear(Ptr<const uint16_t>(op, 0, arena), I32(op, 1), I32(op, 2),
                            Ptr<const float>(op, 3, arena), I32(op, 4), Int(op, 5),
                            Ptr<float>(op, 6, arena), Int(op, 7), Int(op, 8) != 0);
      case kAddBias:
        return cuda::AddBias(Ptr<float>(op, 0, arena), Int(op, 1), Ptr<const float>(op, 2, arena),
                             I32(op, 3), I32(op, 4), stream_);
      case kAddScaled:
        return cuda::AddScaled(Ptr<const float>(op, 0, arena), Int(op, 1), Flt(op, 2), I32(op, 3),
                               I32(op, 4), Ptr<float>(op, 5, arena), Int(op, 6), stream_);
      case kRope:
        return cuda::Rope(Ptr<float>(op, 0, arena), Int(op, 1), I32(op, 2), I32(op, 3), I32(op, 4),
                          Ptr<const float>(op, 5, arena), Ptr<const float>(op, 6, arena),
                          I32(op, 7), Int(op, 8) != 0, stream_);
      case kSwiGlu:
        return cuda::SwiGlu(Ptr<const float>(op, 0, arena), Int(op, 1), I32(op, 2), I32(op, 3),
                            Ptr<float>(op, 4, arena), Int(op, 5), stream_);
      case kGatherRows:
        return cuda::GatherRows(Ptr<const float>(op, 0, arena), Int(op, 1),
                                Ptr<const int32_t>(op, 2, arena), I32(op, 3), I32(op, 4),
                                Ptr<float>(op, 5, arena), Int(op, 6), stream_);
      case kCopy:
        TRIPOD_CUDA_CHECK(cudaMemcpyAsync(Ptr<void>(op, 1, arena), Ptr<const void>(op, 0, arena),
                                          static_cast<size_t>(Int(op, 2)), cudaMemcpyDeviceToDevice,
                                          stream_));
        return;
      case kWriteKv: {
        const cuda::KvWriteShape sh{I32(op, 1), I32(op, 2), I32(op, 3), I32(op, 4)};
        return cuda::WriteKvAt(sh, Ptr<const cuda::KvWriteBatch>(op, 0, arena), stream_);
      }
      case kAttention: {
        const cuda::AttnShape sh{I32(op, 1), I32(op, 2), I32(op, 3),
                                 I32(op, 4), I32(op, 5), I32(op, 6)};
        if (!cuda::AttentionAt(sh, Ptr<const cuda::AttnBatch>(op, 0, arena), stream_)) {
          Fatal(absl::StrCat("attention: head_dim ", sh.head_dim, " with ", sh.n_heads,
                             " heads over ", sh.n_kv_heads, " KV heads is not covered"));
        }
        return;
      }
      default:
        Fatal(absl::StrCat("unknown recorded op ", op.kind));
    }
  }

  void LaunchLinear(const uint16_t* w, int n, int k, const float* x, int m, int64_t ldx, float* y,
                    int64_t ldy, bool accumulate) {
    // A few rows (decode): our bandwidth-bound kernel on the fp32 activations as they are.
    if (cuda::Gemv(w, n, k, x, ldx, m, y, ldy, accumulate, stream_)) return;
    auto* xb = static_cast<uint16_t*>(act_.Get(sizeof(uint16_t) * m * k));
    cuda::ToBf16(x, ldx, m, k, xb, stream_);
    // Row-major y[m, n] = x[m, k] W[n, k]^T is column-major y^T = W^T(op) x^T.
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    TRIPOD_CUBLAS_CHECK(cublasGemmEx(
        cublas_, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w, CUDA_R_16BF, k, xb, CUDA_R_16BF, k,
        &beta, y, CUDA_R_32F, static_cast<int>(ldy), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

  // Room for `blocks` block ids of non-contiguous tables, for the views of the call that starts
  // (growing it waits for the device: cudaFree of the old space).
  void ReserveTables(size_t blocks) {
    tables_used_ = 0;
    block_tables_.Get(std::max<size_t>(blocks, 1024) * sizeof(int32_t));
  }
  static size_t BlocksOf(const KvLayerRef& kv, int64_t slots) {
    return static_cast<size_t>(
        std::min<int64_t>(kv.n_blocks, (slots + kv.block_tokens - 1) / kv.block_tokens));
  }

  int device_;
  std::string name_;
  std::string device_uuid_;  // "cuda:" and the GPU's UUID: KvMemory::device
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  Scratch act_, ids_, rows_, scores_, block_tables_, partial_;
  std::unique_ptr<DeviceBuffer> cublas_workspace_;
  std::unique_ptr<StepGraphs> graphs_;  // null: every op launched as called
  // The thread of the last op (every op flushes the waiting writes first): its frees of KV memory
  // flush its state; another thread's do not touch it.
  std::atomic<std::thread::id> op_thread_;
  int sm_count_ = 1;
  std::vector<PendingWrite> pending_;
  int pending_heads_ = 0, pending_hd_ = 0;
  size_t tables_used_ = 0;
  std::vector<int32_t> table_host_;
  struct TableEntry {
    std::weak_ptr<DeviceBuffer> buf;
    const uint8_t* data = nullptr;
    int64_t rows = 0, cols = 0;
    std::shared_ptr<DeviceBuffer> kept;
  };
  std::map<const GgufTensorInfo*, TableEntry> tables_;
  uint64_t seed_ = 0x5eed;
};

}  // namespace

std::string CudaUnavailableReason() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    return absl::StrCat("no usable CUDA device: ", cudaGetErrorString(err));
  }
  if (n == 0) return "no CUDA device on this machine";
  return "";
}

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(const CudaBackendOptions& options) {
  if (std::string why = CudaUnavailableReason(); !why.empty()) {
    return absl::UnavailableError(why);
  }
  int n = 0;
  cudaGetDeviceCount(&n);
  if (options.device < 0 || options.device >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", options.device, " does not exist (", n, " found)"));
  }
  return std::make_unique<CudaBackend>(options);
}

bool CudaSupportsHeadDim(int head_dim) { return head_dim == 64 || head_dim == 128; }

CudaGraphStats GetCudaGraphStats(Backend& backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  return cuda != nullptr ? cuda->graph_stats() : CudaGraphStats{};
}

}  // namespace tripod
