// DnnlLinear: oneDNN matmul with prepacked weights. One primitive per (m, ldx, ldy), kept in a
// small LRU: fixed shapes let oneDNN pick its best kernel (brgemm / AMX), and creating a
// primitive is negligible beside a prefill GEMM (docs/cpu-kernels.md, "oneDNN primitives kept in
// a cache"). A primitive fixes its thread count when it is made (the calling thread's OpenMP
// setting), so the cache is keyed by the threads of the moment too: in a core share
// (common/util/core_share.h) a GEMM runs on the CPUs lent to it when it starts.
#include "common/compute/cpu/gemm_onednn.h"

#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/compute/cpu/attention.h"
#include "common/kv/kv_dtype.h"
#include "common/util/log.h"
#include "common/util/mutex.h"
#include "common/util/thread_pool.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace tripod {

namespace {

using dt = dnnl::memory::data_type;
using dims = dnnl::memory::dims;

constexpr size_t kMaxCached = 16;
// The M used to ask oneDNN for its preferred weight layout once; all later shapes reuse it.
constexpr int64_t kLayoutM = 512;

// The threads a GEMM starting now may use, set as this thread's OpenMP setting, whence oneDNN
// takes a new primitive's thread count.
int GemmThreads() {
  const int nthr = ComputeThreads();
  if (omp_get_max_threads() != nthr) omp_set_num_threads(nthr);
  return nthr;
}

struct Entry {
  int64_t m, ldx, ldy;
  int nthr;
  dnnl::matmul prim;
  dnnl::memory::desc src_md, dst_md;
};

}  // namespace

struct DnnlLinear::Impl {
  int64_t n = 0, k = 0;
  GemmPrecision precision = GemmPrecision::kF32;
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::memory::desc wei_md;  // the packed layout
  dnnl::memory weights;       // packed weights, owned by oneDNN memory
  mutable Mutex mu;
  mutable std::list<Entry> cache;  // most recently used first

  dt src_dt() const { return precision == GemmPrecision::kBF16 ? dt::bf16 : dt::f32; }

  // Throws dnnl::error.
  Entry MakeEntry(int64_t m, int64_t ldx, int64_t ldy, int nthr) const {
    dnnl::memory::desc src_md({m, k}, src_dt(), dims{ldx, 1});
    dnnl::memory::desc dst_md({m, n}, dt::f32, dims{ldy, 1});
    dnnl::matmul::desc d(src_md, wei_md, dst_md);
    dnnl::matmul::primitive_desc pd(d, engine);
    return Entry{m, ldx, ldy, nthr, dnnl::matmul(pd), src_md, dst_md};
  }

  const Entry& Get(int64_t m, int64_t ldx, int64_t ldy, int nthr) const {
    for (auto it = cache.begin(); it != cache.end(); ++it) {
      if (it->m == m && it->ldx == ldx && it->ldy == ldy && it->nthr == nthr) {
        cache.splice(cache.begin(), cache, it);
        return cache.front();
      }
    }
    cache.push_front(MakeEntry(m, ldx, ldy, nthr));
    if (cache.size() > kMaxCached) cache.pop_back();
    return cache.front();
  }
};

absl::StatusOr<std::unique_ptr<DnnlLinear>> DnnlLinear::Create(const float* w, int64_t n, int64_t k,
                                                               GemmPrecision precision) {
  if (w == nullptr || n <= 0 || k <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("DnnlLinear::Create: bad weights (n=", n, ", k=", k, ")"));
  }
  auto impl = std::make_unique<Impl>();
  impl->n = n;
  impl->k = k;
  impl->precision = precision;
  try {
    dnnl::stream stream(impl->engine);
    // Our W is [n, k] row-major, i.e. oneDNN's K x N weights with strides {1, k}.
    dnnl::memory::desc plain_md({k, n}, dt::f32, dims{1, k});
    dnnl::memory plain(plain_md, impl->engine, const_cast<float*>(w));
    dnnl::memory::desc any_md({k, n}, impl->src_dt(), dnnl::memory::format_tag::any);
    dnnl::memory::desc src_md({kLayoutM, k}, impl->src_dt(), dnnl::memory::format_tag::ab);
    dnnl::memory::desc dst_md({kLayoutM, n}, dt::f32, dnnl::memory::format_tag::ab);
    dnnl::matmul::primitive_desc pd;
    try {
      pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(src_md, any_md, dst_md), impl->engine);
    } catch (const dnnl::error& e) {
      if (precision != GemmPrecision::kBF16) throw;
      return absl::UnimplementedError(
          "DnnlLinear::Create: oneDNN has no bf16 matmul on this CPU; use GemmPrecision::kF32");
    }
    const std::string impl_name = pd.impl_info_str();
    if (precision == GemmPrecision::kBF16 && impl_name.rfind("ref", 0) == 0) {
      // Reference bf16 kernels run at a few GFLOP/s: no bf16 support worth using here.
      return absl::UnimplementedError(
          absl::StrCat("DnnlLinear::Create: oneDNN has no fast bf16 matmul on this CPU (picked ",
                       impl_name, "); use GemmPrecision::kF32"));
    }
    impl->wei_md = pd.weights_desc();
    impl->weights = dnnl::memory(impl->wei_md, impl->engine);
    dnnl::reorder(plain, impl->weights).execute(stream, plain, impl->weights);
    stream.wait();
    // Build the kLayoutM primitive now so Create reports any failure instead of Run.
    impl->Get(kLayoutM, k, n, GemmThreads());
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("DnnlLinear::Create(n=", n, ", k=", k,
                                            "): oneDNN error ", static_cast<int>(e.status), ": ",
                                            e.what()));
  }
  return std::unique_ptr<DnnlLinear>(new DnnlLinear(std::move(impl)));
}

DnnlLinear::DnnlLinear(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DnnlLinear::~DnnlLinear() = default;

int64_t DnnlLinear::n() const { return impl_->n; }
int64_t DnnlLinear::k() const { return impl_->k; }
size_t DnnlLinear::packed_bytes() const { return impl_->wei_md.get_size(); }

void DnnlLinear::Run(const float* x, int64_t m, int64_t ldx, float* y, int64_t ldy) const {
  if (m <= 0) return;
  const Impl& im = *impl_;
  try {
    thread_local std::vector<uint16_t> xb;
    const void* src = x;
    int64_t src_ld = ldx;
    if (im.precision == GemmPrecision::kBF16) {
      xb.resize(static_cast<size_t>(m) * im.k);
      ConvertRowsCpu(x, m, ldx, static_cast<int>(im.k), KvDtype::kBF16,
                     reinterpret_cast<uint8_t*>(xb.data()), im.k * 2);
      src = xb.data();
      src_ld = im.k;
    }
    MutexLock lock(&im.mu);
    const Entry& e = im.Get(m, src_ld, ldy, GemmThreads());
    dnnl::stream stream(im.engine);
    dnnl::memory src_mem(e.src_md, im.engine, const_cast<void*>(src));
    dnnl::memory dst_mem(e.dst_md, im.engine, y);
    e.prim.execute(
        stream, {{DNNL_ARG_SRC, src_mem}, {DNNL_ARG_WEIGHTS, im.weights}, {DNNL_ARG_DST, dst_mem}});
    stream.wait();
  } catch (const dnnl::error& e) {
    // Shapes were validated in Create; an error here is a programming error, not bad input.
    Logger("compute.cpu")
        .critical("DnnlLinear::Run(m={}, n={}, k={}): oneDNN error: {}", m, im.n, im.k, e.what());
    std::abort();
  }
}

struct DnnlPlainGemm::Impl {
  GemmPrecision precision = GemmPrecision::kF32;
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  struct Shape {
    int64_t m, n, k, ldx, ldw, ldy;
    int nthr;
    bool operator==(const Shape&) const = default;
  };
  struct Prim {
    Shape shape;
    dnnl::matmul prim;
    dnnl::memory::desc src_md, wei_md, dst_md;
  };
  mutable Mutex mu;
  mutable std::list<std::shared_ptr<const Prim>> cache;  // most recently used first

  dt type() const { return precision == GemmPrecision::kBF16 ? dt::bf16 : dt::f32; }
  std::shared_ptr<const Prim> Get(const Shape& s) const {
    MutexLock lock(&mu);
    for (auto it = cache.begin(); it != cache.end(); ++it) {
      if ((*it)->shape == s) {
        cache.splice(cache.begin(), cache, it);
        return cache.front();
      }
    }
    // W [n, k] row-major is oneDNN's K x N weights with strides {1, ldw}.
    dnnl::memory::desc src_md({s.m, s.k}, type(), dims{s.ldx, 1});
    dnnl::memory::desc wei_md({s.k, s.n}, type(), dims{1, s.ldw});
    dnnl::memory::desc dst_md({s.m, s.n}, dt::f32, dims{s.ldy, 1});
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, wei_md, dst_md), engine);
    cache.push_front(
        std::make_shared<const Prim>(Prim{s, dnnl::matmul(pd), src_md, wei_md, dst_md}));
    if (cache.size() > 8 * kMaxCached) cache.pop_back();  // shapes x tiles x thread counts
    return cache.front();
  }
};

absl::StatusOr<std::unique_ptr<DnnlPlainGemm>> DnnlPlainGemm::Create(GemmPrecision precision) {
  auto impl = std::make_unique<Impl>();
  impl->precision = precision;
  try {
    dnnl::memory::desc src_md({kLayoutM, 256}, impl->type(), dims{256, 1});
    dnnl::memory::desc wei_md({256, 256}, impl->type(), dims{1, 256});
    dnnl::memory::desc dst_md({kLayoutM, 256}, dt::f32, dims{256, 1});
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, wei_md, dst_md), impl->engine);
    const std::string name = pd.impl_info_str();
    if (name.rfind("ref", 0) == 0) {
      return absl::UnimplementedError(absl::StrCat(
          "DnnlPlainGemm: oneDNN has no fast matmul of this precision here (picked ", name, ")"));
    }
  } catch (const dnnl::error& e) {
    return absl::UnimplementedError(absl::StrCat("DnnlPlainGemm: oneDNN error: ", e.what()));
  }
  return std::unique_ptr<DnnlPlainGemm>(new DnnlPlainGemm(std::move(impl)));
}

DnnlPlainGemm::DnnlPlainGemm(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DnnlPlainGemm::~DnnlPlainGemm() = default;
GemmPrecision DnnlPlainGemm::precision() const { return impl_->precision; }

void DnnlPlainGemm::Run(const void* x, int64_t m, int64_t ldx, const void* w, int64_t n, int64_t k,
                        int64_t ldw, float* y, int64_t ldy) const {
  if (m <= 0 || n <= 0) return;
  try {
    const std::shared_ptr<const Impl::Prim> p = impl_->Get({m, n, k, ldx, ldw, ldy, GemmThreads()});
    dnnl::stream stream(impl_->engine);
    dnnl::memory src(p->src_md, impl_->engine, const_cast<void*>(x));
    dnnl::memory wei(p->wei_md, impl_->engine, const_cast<void*>(w));
    dnnl::memory dst(p->dst_md, impl_->engine, y);
    p->prim.execute(stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}});
    stream.wait();
  } catch (const dnnl::error& e) {
    Logger("compute.cpu")
        .critical("DnnlPlainGemm::Run(m={}, n={}, k={}): oneDNN error: {}", m, n, k, e.what());
    std::abort();
  }
}

}  // namespace tripod
