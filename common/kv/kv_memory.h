// Where a KV store keeps its bytes when they are not host memory: a GPU backend's device memory.
// The store only allocates and frees through it; the backend's kernels read and write the bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

namespace tripod {

struct KvMemory {
  // Returns `bytes` of zeroed memory, or null when there is not enough.
  std::function<uint8_t*(size_t bytes)> alloc;
  std::function<void(uint8_t*)> free;
};

}  // namespace tripod
