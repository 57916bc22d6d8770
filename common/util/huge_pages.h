// Anonymous memory on transparent huge pages (2 MiB on x86-64) where the kernel grants them.
// Why: decode streams every weight and KV byte once per token. On 4 KiB pages that is a TLB miss
// every 4 KiB (a two-level walk under a hypervisor), and the hardware prefetchers stop at each
// page boundary. The decode pass's GEMVs run measurably faster on huge pages
// (docs/cpu-kernels.md, "Weights and KV on huge pages").
// Memory comes from mmap, so it starts zeroed; madvise(MADV_HUGEPAGE) asks for huge pages, and
// where THP is off the memory is simply 4 KiB pages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"

namespace tripod {

// One zeroed mapping of at least `bytes` bytes (rounded up to whole huge pages), unmapped on
// destruction.
class HugePageBuffer {
 public:
  static absl::StatusOr<HugePageBuffer> Allocate(size_t bytes);
  HugePageBuffer() = default;
  HugePageBuffer(HugePageBuffer&& o) noexcept { *this = std::move(o); }
  HugePageBuffer& operator=(HugePageBuffer&& o) noexcept;
  HugePageBuffer(const HugePageBuffer&) = delete;
  HugePageBuffer& operator=(const HugePageBuffer&) = delete;
  ~HugePageBuffer();

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Bump allocation of many blocks (weight matrices) from huge-page chunks of at least
// kChunkBytes, so that small matrices share huge pages. Blocks live as long as the arena.
class HugePageArena {
 public:
  static constexpr size_t kChunkBytes = size_t{32} << 20;
  // `bytes` bytes aligned to 64, or an error if the memory cannot be mapped.
  absl::StatusOr<uint8_t*> Allocate(size_t bytes);
  size_t bytes_used() const { return used_; }

 private:
  std::vector<HugePageBuffer> chunks_;
  size_t offset_ = 0;  // next free byte of the last chunk
  size_t used_ = 0;
};

}  // namespace tripod
