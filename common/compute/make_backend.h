// The backend an engine runs on, by name: what `--backend cpu|cuda` (with `--precision`, the
// CPU's) selects in the CLI, the Session and the workers that take it.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/compute/backend.h"
#include "common/kv/kv_layout.h"

namespace tripod {

struct MadeBackend {
  std::unique_ptr<Backend> backend;
  KvDtype default_kv = KvDtype::kF32;  // the KV type "auto" means on it
};

// "cpu" (precision: CpuOptionsForPrecision's names) or "cuda" (bf16 weights and GEMMs; f16 KV by
// default). Unavailable with the reason where the build or the machine has no GPU.
absl::StatusOr<MadeBackend> MakeBackend(const std::string& name, const std::string& precision);

}  // namespace tripod
