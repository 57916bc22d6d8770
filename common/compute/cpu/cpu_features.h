// What this CPU can run, detected once (cpuid, xgetbv, and the AMX permission request), and the
// instruction-set level the kernels dispatch on: AMX > AVX-512 > AVX2 > scalar.
#pragma once

#include <optional>
#include <string_view>

namespace tripod {

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512vnni = false, avx512bf16 = false, avx512fp16 = false;
  bool amx_tile = false, amx_bf16 = false, amx_int8 = false;  // true only if the OS granted AMX
  // AVX512_BF16's dot products at least as fast as fp32 FMAs, so that bf16 GEMMs and GEMVs pay:
  // AMD's cores (Zen 4, Zen 5) run vdpbf16ps at twice their FMA rate, Intel's at half (their
  // bf16 speed is AMX); docs/cpu-kernels.md, "bf16 dot products on Intel without AMX".
  bool bf16_dot_fast = false;
};

enum class IsaLevel { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAmx = 3 };

const CpuFeatures& GetCpuFeatures();
// The best level this CPU supports, capped by SetIsaCap (tests use the cap to run every path);
// the cap starts at the environment's TRIPOD_MAX_CPU_ISA (scalar, avx2, avx512 or amx) if set.
IsaLevel ActiveIsa();
void SetIsaCap(IsaLevel cap);
const char* IsaName(IsaLevel level);
// The level IsaName gives that name (any case), or nullopt.
std::optional<IsaLevel> ParseIsaName(std::string_view name);

}  // namespace tripod
