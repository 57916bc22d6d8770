// A CPU backend whose KV lives where host code cannot reach it, as a GPU's does: the machines
// that build and test Tripod have no GPU, yet the workers' GPU path (KV in device memory, every
// host read or write of K/V through the store's copies and StagedKvLayer) must be tested there.
//
// Each KV allocation is one memory file mapped twice: the address the store hands out has no
// access rights at all, so any host code that reads or writes K/V through it faults at once (a
// SIGSEGV, on any thread); the backend's kernels and the KvMemory copies reach the bytes through
// the second, writable mapping. Everything else is the wrapped backend's. `--backend
// cpu-guarded-kv` on tripod, the prefill and the decode workers selects it.
#pragma once

#include <memory>

#include "common/compute/backend.h"

namespace tripod {

std::unique_ptr<Backend> MakeGuardedKvBackend(std::unique_ptr<Backend> inner);

}  // namespace tripod
