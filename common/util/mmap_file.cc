// mmap(2) wrapper; see mmap_file.h.
#include "common/util/mmap_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tripod {

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
    void* p = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return absl::InternalError(absl::StrCat("cannot mmap ", path, ": ", std::strerror(err)));
    }
    file->data_ = static_cast<const uint8_t*>(p);
    file->owned_ = true;
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
