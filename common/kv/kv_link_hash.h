// KvLinkHash: the checksum of a chunk payload that travels on a KV link (device to device, no
// XXH3 there). A sum over 8-byte words, each mixed with its index, so that a GPU computes it as a
// parallel reduction and the host the same value: every word and its place count, as a bit flip,
// a lost or a swapped word changes it. Written here: no packaged library hashes on a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/util/fmix64.h"

#ifdef __CUDACC__
#define TRIPOD_HD __host__ __device__
#else
#define TRIPOD_HD
#endif

namespace tripod {

// Word i's share of the sum (word: 8 bytes little-endian, the tail zero-padded).
TRIPOD_HD inline uint64_t KvLinkTerm(uint64_t word, uint64_t i) {
  return Fmix64(word + (i + 1) * 0x9e3779b97f4a7c15ULL);
}

TRIPOD_HD inline uint64_t KvLinkFinish(uint64_t sum, uint64_t bytes) {
  return Fmix64(sum ^ Fmix64(bytes));
}

// On the host.
inline uint64_t KvLinkHash(const uint8_t* p, size_t bytes) {
  uint64_t sum = 0;
  const size_t words = bytes / 8;
  for (size_t i = 0; i < words; ++i) {
    uint64_t w;
    std::memcpy(&w, p + i * 8, 8);
    sum += KvLinkTerm(w, i);
  }
  if (bytes % 8 != 0) {
    uint64_t w = 0;
    std::memcpy(&w, p + words * 8, bytes % 8);
    sum += KvLinkTerm(w, words);
  }
  return KvLinkFinish(sum, bytes);
}

}  // namespace tripod

#undef TRIPOD_HD
