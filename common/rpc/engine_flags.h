// The flags of the three processes that run a model (tripod-prefill, -decode, -draft): --backend,
// --precision, --threads and the core share (--core_share, --core_share_slot, --core_share_member).
// In an object of their own, which the scheduler does not link, so that it takes none of them.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace tripod {

struct EngineFlags {
  std::string backend;    // cpu | cuda | cpu-guarded-kv
  std::string precision;  // fp32 | bf16 | int8 | int16 | auto
};

// Checks --threads and sets the compute threads from it (0: all cores, or all of a core share's;
// thread_pool.h), joins the core share if one is named (core_share.h), and returns the rest.
absl::StatusOr<EngineFlags> SetUpEngineFlags();

}  // namespace tripod
