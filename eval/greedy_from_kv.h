// Greedy tokens from a decode engine given a prompt's KV, in one process: what a decode worker
// does with a transferred KV, for the single-process tools (`tripod prefill --generate`,
// `tripod eval-longctx`).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/kv/kv_snapshot.h"
#include "decode_node/decode_engine.h"

namespace tripod {

// Imports `kv` (prompt[0..n-2], trimmed or not), runs the last prompt token at its true position
// and generates up to `max_tokens` greedily. The engine must not be started (this drives it with
// RunUntilIdle).
absl::StatusOr<std::vector<int32_t>> GreedyFromKv(DecodeEngine& engine,
                                                  const std::vector<int32_t>& prompt,
                                                  const KvSnapshot& kv, int max_tokens);

}  // namespace tripod
