// Where a KV store keeps its bytes when they are not host memory: a GPU backend's device memory.
// The store allocates and frees through it; the backend's kernels read and write the bytes; host
// code that needs K/V rows (snapshots, the KV-chunk codec, the paged cache's block copies) goes
// through the copies here (see kv_staging.h), never through the pointers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "common/kv/kv_layout.h"

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

  // Optional, ordered as the copies: slots [slot_begin, slot_end) of one layer's `ref` as the
  // KV-chunk payload lays them out ([K, V][kv_head][slot] rows of head_dim elements of ref's
  // type, K in row order), gathered on the device and copied to the host in one piece; and the
  // reverse. A transfer then costs one copy per layer and chunk, not one per run of consecutive
  // blocks (a paged cache's blocks are scattered).
  std::function<void(const KvLayerRef& ref, int n_kv_heads, int head_dim, int slot_begin,
                     int slot_end, uint8_t* host_rows)>
      read_rows;
  std::function<void(const uint8_t* host_rows, int n_kv_heads, int head_dim, int slot_begin,
                     int slot_end, const KvLayerRef& ref)>
      write_rows;

  // Optional, for a KV link (device to device): the same rows gathered into, or scattered from,
  // a buffer of this memory (alloc's) rather than the host; and KvLinkHash of such a buffer.
  std::function<void(const KvLayerRef& ref, int n_kv_heads, int head_dim, int slot_begin,
                     int slot_end, uint8_t* rows)>
      gather_rows;
  std::function<void(const uint8_t* rows, int n_kv_heads, int head_dim, int slot_begin,
                     int slot_end, const KvLayerRef& ref)>
      scatter_rows;
  std::function<uint64_t(const uint8_t* bytes, size_t n)> hash;

  // Optional, for a KV link between two processes on one device (an IPC link): memory another
  // process of the same device can map. alloc_shared is alloc with a handle (opaque bytes) that
  // names the allocation, freed with free; open_shared maps another process's allocation by its
  // handle (null, with the reason in *error, when it cannot), close_shared unmaps it. `device`
  // names the device: two memories with the same non-empty name can share allocations.
  std::function<uint8_t*(size_t bytes, std::string* handle)> alloc_shared;
  std::function<uint8_t*(const std::string& handle, std::string* error)> open_shared;
  std::function<void(uint8_t*)> close_shared;
  std::string device;
};

}  // namespace tripod
