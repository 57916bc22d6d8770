// The backend an engine runs on, by name: what `--backend cpu|cuda` (with `--precision`, the
// CPU's) selects in the CLI, the Session and the workers that take it.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/compute/backend.h"
#include "common/compute/cpu/cpu_backend.h"
#include "common/kv/kv_layout.h"

namespace tripod {

struct MadeBackend {
  std::unique_ptr<Backend> backend;
  KvDtype default_kv = KvDtype::kF32;  // the KV type "auto" means on it
};

// The names --backend takes, for help texts and errors.
inline constexpr char kBackendNames[] = "cpu | cuda | cpu-guarded-kv";

// "cpu" (precision: CpuOptionsForPrecision's names), "cuda" (bf16 weights and GEMMs; f16 KV by
// default; unavailable with the reason where the build or the machine has no GPU), or
// "cpu-guarded-kv" (the CPU with its KV out of the host code's reach, as on a GPU: for tests of
// the GPU's KV paths on machines without one; guarded_kv_backend.h).
absl::StatusOr<MadeBackend> MakeBackend(const std::string& name, const std::string& precision);
// The same with the CPU's options given (an engine that sets more than the precision's).
absl::StatusOr<MadeBackend> MakeBackend(const std::string& name, const CpuBackendOptions& cpu);

}  // namespace tripod
