// A read-only memory mapping of a whole file, with bounds-checked sub-spans.
// Parsing (GGUF) lives elsewhere; this only maps and checks ranges.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/statusor.h"

namespace tripod {

class MmapFile {
 public:
  static absl::StatusOr<std::unique_ptr<MmapFile>> Open(const std::string& path);
  // Wraps memory the caller owns (tests, fuzzing); nothing is unmapped.
  static std::unique_ptr<MmapFile> FromMemory(const void* data, size_t size, std::string name);
  ~MmapFile();
  MmapFile(const MmapFile&) = delete;
  MmapFile& operator=(const MmapFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Whether the file's first 2 MiB are mapped as one huge page (files of 64 MiB and more, where
  // the kernel keeps file pages in 2 MiB folios; see mmap_file.cc). Every mapping of 2 MiB or
  // more starts at a 2 MiB-aligned address either way.
  bool huge_pages() const { return huge_pages_; }

  // Drops this process's pages of the page-aligned interior of [p, p + bytes) (inside the
  // mapping); a later access reads them back from the file. For bytes copied elsewhere (the CPU
  // backend's weights), so that they are not resident twice. A no-op for FromMemory.
  void ReleasePages(const void* p, size_t bytes) const;

  // [offset, offset + length) or an OutOfRange error naming the file and the range.
  absl::StatusOr<std::span<const uint8_t>> Range(uint64_t offset, uint64_t length) const;

 private:
  MmapFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool owned_ = false;
  bool huge_pages_ = false;
  std::string path_;
};

}  // namespace tripod
