// Where a prefill's KV goes as the forward makes it: a KvSink hears of each range of layers and
// cache slots as soon as it is final in the store, so that the KV can leave (be encoded and sent)
// while the forward goes on.
#pragma once

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "common/kv/kv_store.h"

namespace tripod {

// Layers [layer_begin, layer_end) x cache slots [slot_begin, slot_end) of one sequence.
struct KvRange {
  int layer_begin = 0, layer_end = 0;
  int slot_begin = 0, slot_end = 0;

  int n_layers() const { return layer_end - layer_begin; }
  int n_slots() const { return slot_end - slot_begin; }
};

// Told, on the engine thread, that `range` of sequence kv_seq of `store` is final: once per prompt
// chunk and layer (the stacked K/V-only layers as one range). Slot s is prompt position s. The
// store is valid only during the call: copy (encode) what is needed before returning. A non-OK
// status stops the prefill, which returns it.
using KvSink = std::function<absl::Status(KvStore& store, int32_t kv_seq, const KvRange& range)>;

}  // namespace tripod
