// GuardedKvBackend; see guarded_kv_backend.h. Written here: no packaged library maps memory
// twice with different rights.
#include "common/compute/guarded_kv_backend.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/compute/forwarding_backend.h"
#include "common/kv/kv_link_hash.h"
#include "common/kv/kv_staging.h"
#include "common/util/log.h"
#include "common/util/mutex.h"

namespace tripod {
namespace {

// The allocations: guarded address -> its writable twin. Shared by the backend and the KvMemory
// it hands out (a store may outlive neither, but the copies hold it anyway).
class GuardedRegions {
 public:
  uint8_t* Alloc(size_t bytes) {
    const int fd = memfd_create("tripod-guarded-kv", MFD_CLOEXEC);
    if (fd < 0) return nullptr;
    const size_t size = PageRound(bytes);
    if (ftruncate(fd, static_cast<off_t>(size)) != 0) {  // zero-filled
      close(fd);
      return nullptr;
    }
    return MapTwice(fd, size, "");
  }
  // As a GPU's IPC memory: a POSIX shared-memory object another process opens by its name (the
  // handle), unlinked when its owner frees it.
  uint8_t* AllocShared(size_t bytes, std::string* handle) {
    static std::atomic<uint64_t> counter{0};
    const std::string name = "/tripod-kv-" + std::to_string(getpid()) + "-" +
                             std::to_string(counter.fetch_add(1)) + "-" +
                             std::to_string(std::random_device{}());
    const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) return nullptr;
    const size_t size = PageRound(bytes);
    if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
      close(fd);
      shm_unlink(name.c_str());
      return nullptr;
    }
    uint8_t* p = MapTwice(fd, size, name);
    if (p == nullptr) {
      shm_unlink(name.c_str());
      return nullptr;
    }
    *handle = name;
    return p;
  }
  uint8_t* OpenShared(const std::string& name, std::string* error) {
    const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
    struct stat st {};
    if (fd < 0 || fstat(fd, &st) != 0) {
      *error = std::string("shm_open ") + name + ": " + std::strerror(errno);
      if (fd >= 0) close(fd);
      return nullptr;
    }
    uint8_t* p = MapTwice(fd, static_cast<size_t>(st.st_size), "");
    if (p == nullptr) *error = "mmap failed";
    return p;
  }
  void Free(uint8_t* p) {
    Region r;
    {
      MutexLock lock(&mu_);
      const auto it = regions_.find(p);
      if (it == regions_.end()) Die("free of memory it did not allocate", p);
      r = it->second;
      regions_.erase(it);
    }
    munmap(p, r.size);
    munmap(r.rw, r.size);
    if (!r.shm_name.empty()) shm_unlink(r.shm_name.c_str());
  }
  // The writable address of [p, p + bytes), which must lie in one allocation.
  uint8_t* Rw(const uint8_t* p, size_t bytes) const {
    MutexLock lock(&mu_);
    auto it = regions_.upper_bound(const_cast<uint8_t*>(p));
    if (it == regions_.begin()) Die("an address outside its memory", p);
    --it;
    const size_t off = static_cast<size_t>(p - it->first);
    if (off + bytes > it->second.size) Die("a range outside its memory", p);
    return it->second.rw + off;
  }

  KvLayerRef Rw(KvLayerRef ref) const {
    if (ref.k_base != nullptr) ref.k_base = Rw(ref.k_base, 0);
    if (ref.v_base != nullptr) ref.v_base = Rw(ref.v_base, 0);
    return ref;
  }

 private:
  struct Region {
    size_t size = 0;
    uint8_t* rw = nullptr;
    std::string shm_name;  // a shared object this process made: unlinked with the memory
  };
  static size_t PageRound(size_t bytes) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return std::max(page, (bytes + page - 1) / page * page);
  }
  // Maps fd (closed here) twice: writable, and without rights (the address handed out).
  uint8_t* MapTwice(int fd, size_t size, std::string shm_name) {
    void* rw = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    void* guarded = mmap(nullptr, size, PROT_NONE, MAP_SHARED, fd, 0);
    close(fd);  // the mappings keep the file
    if (rw == MAP_FAILED || guarded == MAP_FAILED) {
      if (rw != MAP_FAILED) munmap(rw, size);
      if (guarded != MAP_FAILED) munmap(guarded, size);
      return nullptr;
    }
    MutexLock lock(&mu_);
    regions_[static_cast<uint8_t*>(guarded)] =
        Region{size, static_cast<uint8_t*>(rw), std::move(shm_name)};
    return static_cast<uint8_t*>(guarded);
  }
  [[noreturn]] static void Die(const char* what, const void* p) {
    Logger("compute.guarded_kv").critical("guarded KV memory: {} ({})", what, p);
    std::abort();
  }
  mutable Mutex mu_;
  std::map<uint8_t*, Region> regions_;
};

// One "device" per machine (its boot): processes there share memory by name.
std::string GuardedDeviceName() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return std::string("guarded:") + host + ":" + id;
}

class GuardedKvBackend final : public ForwardingBackend {
 public:
  explicit GuardedKvBackend(std::unique_ptr<Backend> inner)
      : ForwardingBackend(*inner),
        owned_(std::move(inner)),
        regions_(std::make_shared<GuardedRegions>()) {}

  std::string name() const override { return inner_.name() + " (guarded KV)"; }
  // The ops that reach K/V: their refs move to the writable mapping.
  void WriteKv(const float* k, const float* v, int m, int64_t ld, int n_kv_heads, int head_dim,
               const KvLayerRef& kv, int64_t slot_begin) override {
    inner_.WriteKv(k, v, m, ld, n_kv_heads, head_dim, regions_->Rw(kv), slot_begin);
  }
  void Attention(std::span<const AttentionArgs> seqs) override {
    std::vector<AttentionArgs> rw(seqs.begin(), seqs.end());
    for (AttentionArgs& a : rw) a.kv = regions_->Rw(a.kv);
    inner_.Attention(rw);
  }
  void AttentionScores(std::span<const AttentionScoreArgs> seqs) override {
    std::vector<AttentionScoreArgs> rw(seqs.begin(), seqs.end());
    for (AttentionScoreArgs& a : rw) a.kv = regions_->Rw(a.kv);
    inner_.AttentionScores(rw);
  }
  std::optional<KvMemory> DeviceKvMemory() override {
    std::shared_ptr<GuardedRegions> r = regions_;
    KvMemory m;
    m.alloc = [r](size_t bytes) { return r->Alloc(bytes); };
    m.free = [r](uint8_t* p) { r->Free(p); };
    // Nothing to copy is a valid call (an empty payload), whose host pointer may be null.
    m.to_host = [r](uint8_t* host, const uint8_t* src, size_t n) {
      if (n > 0) std::memcpy(host, r->Rw(src, n), n);
    };
    m.from_host = [r](uint8_t* dst, const uint8_t* host, size_t n) {
      if (n > 0) std::memcpy(r->Rw(dst, n), host, n);
    };
    m.copy = [r](uint8_t* dst, const uint8_t* src, size_t n) {
      if (n > 0) std::memmove(r->Rw(dst, n), r->Rw(src, n), n);
    };
    // As a GPU's: rows gathered "on the device" (the writable twin) and handed over whole.
    m.read_rows = [r](const KvLayerRef& ref, int heads, int head_dim, int s0, int s1,
                      uint8_t* rows) { ReadKvRows(r->Rw(ref), heads, head_dim, s0, s1, rows); };
    m.write_rows = [r](const uint8_t* rows, int heads, int head_dim, int s0, int s1,
                       const KvLayerRef& ref) {
      WriteKvRows(rows, heads, head_dim, s0, s1, r->Rw(ref));
    };
    m.gather_rows = [r](const KvLayerRef& ref, int heads, int head_dim, int s0, int s1,
                        uint8_t* rows) {
      const size_t n = 2 * size_t{1} * heads * (s1 - s0) * KvRowBytes(ref.dtype, head_dim);
      ReadKvRows(r->Rw(ref), heads, head_dim, s0, s1, r->Rw(rows, n));
    };
    m.scatter_rows = [r](const uint8_t* rows, int heads, int head_dim, int s0, int s1,
                         const KvLayerRef& ref) {
      const size_t n = 2 * size_t{1} * heads * (s1 - s0) * KvRowBytes(ref.dtype, head_dim);
      WriteKvRows(r->Rw(rows, n), heads, head_dim, s0, s1, r->Rw(ref));
    };
    m.hash = [r](const uint8_t* p, size_t n) { return KvLinkHash(r->Rw(p, n), n); };
    m.alloc_shared = [r](size_t bytes, std::string* handle) {
      return r->AllocShared(bytes, handle);
    };
    m.open_shared = [r](const std::string& handle, std::string* error) {
      return r->OpenShared(handle, error);
    };
    m.close_shared = [r](uint8_t* p) { r->Free(p); };  // not the owner's: nothing to unlink
    m.device = GuardedDeviceName();
    return m;
  }

 private:
  std::unique_ptr<Backend> owned_;
  std::shared_ptr<GuardedRegions> regions_;
};

}  // namespace

std::unique_ptr<Backend> MakeGuardedKvBackend(std::unique_ptr<Backend> inner) {
  return std::make_unique<GuardedKvBackend>(std::move(inner));
}

}  // namespace tripod
