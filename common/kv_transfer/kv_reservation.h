// KvReservation: cache blocks a decode engine set aside for KV that arrives from elsewhere
// (DecodeEngine::ReserveKv), which a transfer (KvTransfers) fills and a request adopts.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/kv/kv_store.h"

namespace tripod {

struct KvReservation {
  int32_t kv_seq = -1;  // the cache sequence; DecodeRequest::reserved_kv_seq adopts it
  int n_slots = 0;      // slots the transfer fills
  int blocks = 0;       // blocks held (room for n_slots + the last prompt token)
  // PyramidKV's trimmed KV: per layer, the first slot the transfer fills (slots below stay empty
  // and are never attended). Empty: 0.
  std::vector<int32_t> layer_first;
  // Writes slots [0, n_slots) of kv_seq from any thread: a copy of the block table, so the
  // writer never touches the cache. Valid until the reservation is released or adopted, and
  // while the engine lives.
  std::unique_ptr<KvStore> store;
};

}  // namespace tripod
