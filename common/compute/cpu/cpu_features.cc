// CPU feature detection (cpuid, xgetbv, the AMX permission request) and the ISA cap that tests
// use to force the lower kernel paths.
#include "common/compute/cpu/cpu_features.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "common/util/log.h"

namespace tripod {
namespace {

constexpr int kArchReqXcompPerm = 0x1023;  // arch_prctl code, asm/prctl.h
constexpr int kXfeatureXtiledata = 18;

uint64_t ReadXcr0() {
  uint32_t eax = 0, edx = 0;
  // xgetbv with ecx = 0; only valid when cpuid reports OSXSAVE (checked by the caller).
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

CpuFeatures Detect() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return f;
  const unsigned max_leaf = a;
  const bool intel = b == 0x756e6547 && d == 0x49656e69 && c == 0x6c65746e;  // "GenuineIntel"
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = (c >> 27) & 1;
  const bool avx = (c >> 28) & 1;
  const bool fma = (c >> 12) & 1;
  const bool f16c = (c >> 29) & 1;
  if (!osxsave || !avx || max_leaf < 7) return f;
  const uint64_t xcr0 = ReadXcr0();
  const bool os_avx = (xcr0 & 0x6) == 0x6;                 // SSE and AVX state
  const bool os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0;  // opmask, ZMM_Hi256, Hi16_ZMM
  const bool os_amx = (xcr0 & 0x60000) == 0x60000;         // XTILECFG and XTILEDATA
  if (!os_avx) return f;

  __cpuid_count(7, 0, a, b, c, d);
  const unsigned b7 = b, c7 = c, d7 = d;
  __cpuid_count(7, 1, a, b, c, d);
  const unsigned a71 = a;

  f.avx2 = (b7 >> 5) & 1;
  f.fma = fma;
  f.f16c = f16c;
  if (os_avx512) {
    f.avx512f = (b7 >> 16) & 1;
    f.avx512dq = (b7 >> 17) & 1;
    f.avx512bw = (b7 >> 30) & 1;
    f.avx512vl = (b7 >> 31) & 1;
    f.avx512vnni = (c7 >> 11) & 1;
    f.avx512fp16 = (d7 >> 23) & 1;
    f.avx512bf16 = (a71 >> 5) & 1;
    f.bf16_dot_fast = f.avx512bf16 && !intel;
  }
  const bool cpu_amx = ((d7 >> 24) & 1) && ((d7 >> 22) & 1);  // AMX-TILE and AMX-BF16
  if (cpu_amx && os_amx && f.avx512f) {
    // Linux grants the large tile state only on request; without it tile loads fault (SIGILL).
    if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0) {
      f.amx_tile = true;
      f.amx_bf16 = true;
      f.amx_int8 = (d7 >> 25) & 1;
    }
  }
  return f;
}

IsaLevel BestLevel(const CpuFeatures& f) {
  // The _avx512 files are compiled with VNNI and BF16, so all of them are required together.
  const bool avx2 = f.avx2 && f.fma && f.f16c;
  const bool avx512 =
      avx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx512vnni && f.avx512bf16;
  if (avx512 && f.amx_tile && f.amx_bf16) return IsaLevel::kAmx;
  if (avx512) return IsaLevel::kAvx512;
  if (avx2) return IsaLevel::kAvx2;
  return IsaLevel::kScalar;
}

// TRIPOD_MAX_CPU_ISA caps the kernels from the start, as ONEDNN_MAX_CPU_ISA caps oneDNN's (which
// it leaves alone): to run or measure an older CPU's paths on a newer one.
int InitialCap() {
  const char* env = std::getenv("TRIPOD_MAX_CPU_ISA");
  if (env == nullptr || *env == '\0') return static_cast<int>(IsaLevel::kAmx);
  const std::optional<IsaLevel> level = ParseIsaName(env);
  if (!level) {
    Logger("compute.cpu")
        .warn("TRIPOD_MAX_CPU_ISA={} ignored: expected scalar, avx2, avx512 or amx", env);
    return static_cast<int>(IsaLevel::kAmx);
  }
  return static_cast<int>(*level);
}

std::atomic<int> g_cap{InitialCap()};

}  // namespace

const CpuFeatures& GetCpuFeatures() {
  static const CpuFeatures features = Detect();
  return features;
}

IsaLevel ActiveIsa() {
  static const IsaLevel best = BestLevel(GetCpuFeatures());
  const int cap = g_cap.load(std::memory_order_relaxed);
  return static_cast<int>(best) < cap ? best : static_cast<IsaLevel>(cap);
}

void SetIsaCap(IsaLevel cap) { g_cap.store(static_cast<int>(cap), std::memory_order_relaxed); }

std::optional<IsaLevel> ParseIsaName(std::string_view name) {
  for (IsaLevel l : {IsaLevel::kScalar, IsaLevel::kAvx2, IsaLevel::kAvx512, IsaLevel::kAmx}) {
    const std::string_view want = IsaName(l);
    if (name.size() == want.size() &&
        std::equal(name.begin(), name.end(), want.begin(), [](char a, char b) {
          return std::tolower(static_cast<unsigned char>(a)) == b;
        })) {
      return l;
    }
  }
  return std::nullopt;
}

const char* IsaName(IsaLevel level) {
  switch (level) {
    case IsaLevel::kScalar:
      return "scalar";
    case IsaLevel::kAvx2:
      return "avx2";
    case IsaLevel::kAvx512:
      return "avx512";
    case IsaLevel::kAmx:
      return "amx";
  }
  return "unknown";
}

}  // namespace tripod
