// KvStore: the owner of KV memory as the forward pass sees it (a contiguous cache, the paged
// block pool). It hands out KvLayerRef views; allocation policy stays with the owner.
#pragma once

#include <cstdint>

#include "common/kv/kv_layout.h"
#include "common/kv/kv_memory.h"

namespace tripod {

// The owner of KV memory, as the forward pass sees it.
class KvStore {
 public:
  virtual ~KvStore() = default;
  virtual KvLayout layout() const = 0;
  // Sequence kv_seq's K/V in `layer`; the caller has made room for every slot it writes.
  virtual KvLayerRef Layer(int32_t kv_seq, int layer) = 0;
  // Where the refs' bytes live: null for host memory, else a device's, which host code reaches
  // only through its copies (StagedKvLayer).
  virtual const KvMemory* memory() const { return nullptr; }
};

}  // namespace tripod
