// mmap(2) wrapper; see mmap_file.h.
#include "common/util/mmap_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace tripod {

namespace {

// Model files are streamed once per decoded token, and on 4 KiB pages every 4 KiB costs a TLB
// walk (two levels under a hypervisor) and stops the hardware prefetchers. Linux 6.x keeps the
// pages of files on filesystems with large folios (ext4, xfs) in 2 MiB folios when they are read
// in through a mapping with madvise(MADV_HUGEPAGE), and maps such a folio with one PMD where the
// mapping's address is 2 MiB-aligned: one huge page shared by every process mapping the file
// (decode about 7% faster on the 1.5B, docs/cpu-kernels.md, "Model files on huge pages").
constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kHugeFileBytes = size_t{64} << 20;

// The file mapped read-only at a 2 MiB-aligned address (files of a huge page or more).
void* MapAligned(int fd, size_t size) {
  if (size < kHugePage) return ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  // Reserve size + 2 MiB, place the file at the first aligned address inside, free the slack.
  void* r = ::mmap(nullptr, size + kHugePage, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (r == MAP_FAILED) return r;
  const uintptr_t base = reinterpret_cast<uintptr_t>(r);
  const uintptr_t aligned = (base + kHugePage - 1) / kHugePage * kHugePage;
  void* p =
      ::mmap(reinterpret_cast<void*>(aligned), size, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    ::munmap(r, size + kHugePage);
    errno = err;
    return p;
  }
  if (aligned > base) ::munmap(r, aligned - base);
  // The file's mapping ends at its last page's end (munmap wants page-aligned addresses).
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t end = (aligned + size + page - 1) / page * page;
  const uintptr_t reserved_end = base + size + kHugePage;
  if (reserved_end > end) ::munmap(reinterpret_cast<void*>(end), reserved_end - end);
  return p;
}

// This process's file pages mapped by PMD, in kB (/proc/self/smaps_rollup), or -1 where the
// kernel does not say.
int64_t FilePmdMappedKb() {
  std::ifstream in("/proc/self/smaps_rollup");
  std::string line;
  while (std::getline(in, line)) {
    int64_t kb = 0;
    if (absl::StartsWith(line, "FilePmdMapped:") &&
        absl::SimpleAtoi(absl::StripAsciiWhitespace(
                             absl::StripSuffix(absl::StripPrefix(line, "FilePmdMapped:"), "kB")),
                         &kb)) {
      return kb;
    }
  }
  return -1;
}

// Asks for the file's pages in 2 MiB folios and says whether its first huge page came in as one.
// Pages the page cache already holds in 4 KiB folios (a file just downloaded or copied) stay so
// while cached; where the first 2 MiB come back as one folio once dropped, the file's pages that no
// process maps are dropped too (they are clean) so that they are read back in 2 MiB folios: a
// one-time read of the file, after which every process shares them.
bool AskForHugeFolios(int fd, void* p, size_t size) {
  if (FilePmdMappedKb() < 0 || ::madvise(p, size, MADV_HUGEPAGE) != 0) return false;
  auto first_page_huge = [&] {
    const int64_t before = FilePmdMappedKb();
    (void)*static_cast<const volatile uint8_t*>(p);
    return FilePmdMappedKb() >= before + static_cast<int64_t>(kHugePage >> 10);
  };
  if (first_page_huge()) return true;
  // Only the first 2 MiB are dropped to try: where the kernel or the filesystem keeps no large
  // folios they come back small, and the rest of the cache is left alone (no re-read per start).
  ::madvise(p, kHugePage, MADV_DONTNEED);
  ::posix_fadvise(fd, 0, kHugePage, POSIX_FADV_DONTNEED);
  if (!first_page_huge()) return false;
  ::posix_fadvise(fd, kHugePage, 0, POSIX_FADV_DONTNEED);
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MmapFile>> MmapFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::InternalError(absl::StrCat("cannot stat ", path, ": ", std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  }
  std::unique_ptr<MmapFile> file(new MmapFile());
  file->path_ = path;
  file->size_ = static_cast<size_t>(st.st_size);
  if (file->size_ > 0) {
    void* p = MapAligned(fd, file->size_);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return absl::InternalError(absl::StrCat("cannot mmap ", path, ": ", std::strerror(err)));
    }
    file->data_ = static_cast<const uint8_t*>(p);
    file->owned_ = true;
    if (file->size_ >= kHugeFileBytes) file->huge_pages_ = AskForHugeFolios(fd, p, file->size_);
  }
  ::close(fd);
  return file;
}

std::unique_ptr<MmapFile> MmapFile::FromMemory(const void* data, size_t size, std::string name) {
  std::unique_ptr<MmapFile> file(new MmapFile());
  file->data_ = static_cast<const uint8_t*>(data);
  file->size_ = size;
  file->path_ = std::move(name);
  return file;
}

MmapFile::~MmapFile() {
  if (owned_ && data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

void MmapFile::ReleasePages(const void* p, size_t bytes) const {
  if (!owned_ || p == nullptr) return;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(data_);
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const uintptr_t end = std::min(reinterpret_cast<uintptr_t>(p) + bytes, lo + size_) / page * page;
  if (begin < lo || end <= begin) return;
  ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

absl::StatusOr<std::span<const uint8_t>> MmapFile::Range(uint64_t offset, uint64_t length) const {
  if (offset > size_ || length > size_ - offset) {
    return absl::OutOfRangeError(absl::StrCat(path_, ": range [", offset, ", +", length,
                                              ") lies outside the file (", size_, " bytes)"));
  }
  return std::span<const uint8_t>(data_ + offset, length);
}

}  // namespace tripod
