// MurmurHash3's 64-bit finaliser: a bijection of 64-bit words that mixes every bit into every
// other. On the host and, compiled by nvcc, on the device.
#pragma once

#include <cstdint>

namespace tripod {

#ifdef __CUDACC__
#define TRIPOD_FMIX_HD __host__ __device__
#else
#define TRIPOD_FMIX_HD
#endif

TRIPOD_FMIX_HD inline uint64_t Fmix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

}  // namespace tripod

#undef TRIPOD_FMIX_HD
