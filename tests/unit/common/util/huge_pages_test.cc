// Tests for HugePageBuffer, HugePageArena and MmapFile's mappings (alignment, huge pages,
// ReleasePages).
#include "common/util/huge_pages.h"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/util/mmap_file.h"
#include "gtest/gtest.h"

namespace tripod {
namespace {

constexpr size_t kHuge = size_t{2} << 20;

TEST(HugePageBufferTest, ZeroedAlignedAndWritable) {
  absl::StatusOr<HugePageBuffer> b = HugePageBuffer::Allocate(3 * kHuge + 5);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_NE(b->data(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % kHuge, 0u);
  EXPECT_EQ(b->size(), 4 * kHuge);  // rounded up to whole huge pages
  for (size_t i = 0; i < b->size(); i += 4096) ASSERT_EQ(b->data()[i], 0) << i;
  std::memset(b->data(), 0x5a, b->size());
  EXPECT_EQ(b->data()[b->size() - 1], 0x5a);
}

TEST(HugePageBufferTest, EmptyAndMoved) {
  absl::StatusOr<HugePageBuffer> empty = HugePageBuffer::Allocate(0);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->data(), nullptr);
  EXPECT_EQ(empty->size(), 0u);

  HugePageBuffer a = *HugePageBuffer::Allocate(100);
  uint8_t* p = a.data();
  p[7] = 3;
  HugePageBuffer b = std::move(a);
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(b.data()[7], 3);
  HugePageBuffer c = *HugePageBuffer::Allocate(kHuge);
  c = std::move(b);  // c's old mapping is released, b's taken over
  EXPECT_EQ(c.data(), p);
}

TEST(HugePageBufferTest, ImpossibleSizeIsAnError) {
  absl::StatusOr<HugePageBuffer> b = HugePageBuffer::Allocate(size_t{1} << 62);
  EXPECT_FALSE(b.ok());
}

TEST(HugePageArenaTest, BlocksAreAlignedDisjointAndShareChunks) {
  HugePageArena arena;
  std::vector<uint8_t*> blocks;
  const size_t sizes[] = {1, 100, 64, 207360, 4096, 3, HugePageArena::kChunkBytes + 1, 10};
  for (size_t s : sizes) {
    absl::StatusOr<uint8_t*> p = arena.Allocate(s);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(*p) % 64, 0u);
    std::memset(*p, static_cast<int>(blocks.size() + 1), s);
    blocks.push_back(*p);
  }
  // Every block still holds its own fill: no two overlap.
  for (size_t i = 0; i < blocks.size(); ++i) {
    EXPECT_EQ(blocks[i][0], static_cast<uint8_t>(i + 1)) << i;
    EXPECT_EQ(blocks[i][sizes[i] - 1], static_cast<uint8_t>(i + 1)) << i;
  }
  // The small blocks before the oversized one came from one chunk, in order.
  EXPECT_EQ(blocks[1], blocks[0] + 64);
  EXPECT_EQ(blocks[2], blocks[1] + 128);
  size_t used = 0;
  for (size_t s : sizes) used += (s + 63) / 64 * 64;
  EXPECT_EQ(arena.bytes_used(), used);
}

TEST(MmapFileTest, ReleasedPagesReadBackFromTheFile) {
  const std::string path = ::testing::TempDir() + "/release_pages.bin";
  std::vector<uint8_t> bytes(5 * 4096 + 123);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 7 + 1);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
  std::fclose(f);
  absl::StatusOr<std::unique_ptr<MmapFile>> file = MmapFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const uint8_t* d = (*file)->data();
  ASSERT_EQ(std::memcmp(d, bytes.data(), bytes.size()), 0);
  (*file)->ReleasePages(d + 100, bytes.size() - 100);
  (*file)->ReleasePages(d + bytes.size() - 10, 1000);  // past the end: clipped
  EXPECT_EQ(std::memcmp(d, bytes.data(), bytes.size()), 0);
  std::remove(path.c_str());
}

// Writes n bytes of a pattern to path; the page cache then holds them as written.
void WritePattern(const std::string& path, size_t n) {
  std::vector<uint8_t> bytes(n);
  for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>(i * 13 + i / 4096);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(std::fwrite(bytes.data(), 1, n, f), n);
  ASSERT_EQ(std::fclose(f), 0);
}

bool PatternHolds(const uint8_t* d, size_t n) {
  for (size_t i = 0; i < n; i += 997) {
    if (d[i] != static_cast<uint8_t>(i * 13 + i / 4096)) return false;
  }
  return d[n - 1] == static_cast<uint8_t>((n - 1) * 13 + (n - 1) / 4096);
}

// The number of this process's mappings (lines of /proc/self/maps).
int MappingCount() {
  std::FILE* f = std::fopen("/proc/self/maps", "r");
  if (f == nullptr) return -1;
  int lines = 0;
  for (int c; (c = std::fgetc(f)) != EOF;) lines += c == '\n';
  std::fclose(f);
  return lines;
}

TEST(MmapFileTest, LargeFilesAreMappedOnHugePageBoundaries) {
  // A file of 2 MiB or more starts at a 2 MiB-aligned address (so that 2 MiB folios can be
  // mapped whole); below 64 MiB nothing more is asked of the kernel.
  const std::string path = ::testing::TempDir() + "/aligned_map.bin";
  const size_t n = 3 * kHuge + 4321;
  WritePattern(path, n);
  const int mappings = MappingCount();
  for (int i = 0; i < 3; ++i) {  // each mapping, not just a lucky first one
    absl::StatusOr<std::unique_ptr<MmapFile>> file = MmapFile::Open(path);
    ASSERT_TRUE(file.ok()) << file.status();
    EXPECT_EQ(reinterpret_cast<uintptr_t>((*file)->data()) % kHuge, 0u);
    EXPECT_EQ((*file)->size(), n);
    EXPECT_FALSE((*file)->huge_pages());
    EXPECT_TRUE(PatternHolds((*file)->data(), n));
  }
  // The aligned placement reserves 2 MiB more than the file; none of it outlives the files.
  EXPECT_EQ(MappingCount(), mappings);
  std::remove(path.c_str());
}

TEST(MmapFileTest, AModelSizedFileReadsTheSameOnEitherPageSize) {
  // 64 MiB and more: the pages are asked for in 2 MiB folios, dropping the cached 4 KiB ones the
  // write left. Whether the kernel grants them depends on its filesystem and configuration;
  // where it says so, /proc must show the PMD mapping, and the bytes must be the file's anyway,
  // also after a release and a second mapping.
  const std::string path = ::testing::TempDir() + "/huge_map.bin";
  const size_t n = (size_t{64} << 20) + 12345;
  WritePattern(path, n);
  absl::StatusOr<std::unique_ptr<MmapFile>> file = MmapFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const uint8_t* d = (*file)->data();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(d) % kHuge, 0u);
  ASSERT_TRUE(PatternHolds(d, n));
  if ((*file)->huge_pages()) {
    std::FILE* f = std::fopen("/proc/self/smaps_rollup", "r");
    ASSERT_NE(f, nullptr);
    char line[256];
    long kb = -1;
    while (std::fgets(line, sizeof line, f) != nullptr) {
      if (std::sscanf(line, "FilePmdMapped: %ld kB", &kb) == 1) break;
    }
    std::fclose(f);
    EXPECT_GE(kb, 2048);
  }
  (*file)->ReleasePages(d + 4096, 5 * kHuge);  // splits the first huge pages
  EXPECT_TRUE(PatternHolds(d, n));
  absl::StatusOr<std::unique_ptr<MmapFile>> again = MmapFile::Open(path);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(PatternHolds((*again)->data(), n));
  EXPECT_EQ((*again)->huge_pages(), (*file)->huge_pages());
  std::remove(path.c_str());
}

TEST(MmapFileTest, ReleaseIsANoOpForWrappedMemory) {
  // Anonymous memory would lose its contents to MADV_DONTNEED: FromMemory must not release.
  HugePageBuffer mem = *HugePageBuffer::Allocate(3 * 4096);
  for (size_t i = 0; i < 3 * 4096; ++i) mem.data()[i] = static_cast<uint8_t>(i % 251 + 1);
  std::unique_ptr<MmapFile> file = MmapFile::FromMemory(mem.data(), 3 * 4096, "wrapped");
  file->ReleasePages(mem.data(), 3 * 4096);
  for (size_t i = 0; i < 3 * 4096; ++i) ASSERT_EQ(mem.data()[i], i % 251 + 1) << i;
}

}  // namespace
}  // namespace tripod
