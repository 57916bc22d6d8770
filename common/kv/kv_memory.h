// Where a KV store keeps its bytes when they are not host memory: a GPU backend's device memory.
// The store allocates and frees through it; the backend's kernels read and write the bytes; host
// code that needs K/V rows (snapshots, the KV-chunk codec, the paged cache's block copies) goes
// through the copies here (see kv_staging.h), never through the pointers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

namespace tripod {

struct KvMemory {
  // Returns `bytes` of zeroed memory, or null when there is not enough.
  std::function<uint8_t*(size_t bytes)> alloc;
  std::function<void(uint8_t*)> free;
  // Synchronous copies: each returns when its bytes have arrived. They may run on any thread, and
  // are not ordered after the backend's queued ops: the caller makes sure that no op still in
  // flight writes what it reads or touches what it writes (the engine synchronized the backend, or
  // the blocks are a reservation no op has used since the engine's last synchronization).
  std::function<void(uint8_t* host_dst, const uint8_t* src, size_t bytes)> to_host;
  std::function<void(uint8_t* dst, const uint8_t* host_src, size_t bytes)> from_host;
  std::function<void(uint8_t* dst, const uint8_t* src, size_t bytes)> copy;  // within the memory
};

}  // namespace tripod
