// HugePageBuffer, HugePageArena; see huge_pages.h.
#include "common/util/huge_pages.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tripod {
namespace {
constexpr size_t kHugePage = size_t{2} << 20;
}  // namespace

absl::StatusOr<HugePageBuffer> HugePageBuffer::Allocate(size_t bytes) {
  HugePageBuffer b;
  if (bytes == 0) return b;
  if (bytes > (size_t{1} << 47)) {  // past any x86-64 address space (and no overflow below)
    return absl::ResourceExhaustedError(absl::StrCat("cannot map ", bytes, " bytes"));
  }
  const size_t size = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  // Over-map by one huge page and trim, so that the buffer starts on a huge-page boundary
  // (a huge page needs its virtual range aligned).
  void* raw = ::mmap(nullptr, size + kHugePage, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot map ", bytes, " bytes: ", std::strerror(errno)));
  }
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kHugePage - 1) / kHugePage * kHugePage;
  if (aligned > start) ::munmap(raw, aligned - start);
  const size_t tail = (start + size + kHugePage) - (aligned + size);
  if (tail > 0) ::munmap(reinterpret_cast<void*>(aligned + size), tail);
  b.data_ = reinterpret_cast<uint8_t*>(aligned);
  b.size_ = size;
#ifdef MADV_HUGEPAGE
  ::madvise(b.data_, b.size_, MADV_HUGEPAGE);  // advice only: 4 KiB pages where THP is off
#endif
  return b;
}

HugePageBuffer& HugePageBuffer::operator=(HugePageBuffer&& o) noexcept {
  if (this != &o) {
    if (data_ != nullptr) ::munmap(data_, size_);
    data_ = o.data_;
    size_ = o.size_;
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

HugePageBuffer::~HugePageBuffer() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

absl::StatusOr<uint8_t*> HugePageArena::Allocate(size_t bytes) {
  const size_t need = (bytes + 63) / 64 * 64;
  if (chunks_.empty() || offset_ + need > chunks_.back().size()) {
    absl::StatusOr<HugePageBuffer> chunk =
        HugePageBuffer::Allocate(need > kChunkBytes ? need : kChunkBytes);
    if (!chunk.ok()) return chunk.status();
    chunks_.push_back(std::move(chunk).value());
    offset_ = 0;
  }
  uint8_t* p = chunks_.back().data() + offset_;
  offset_ += need;
  used_ += need;
  return p;
}

}  // namespace tripod
