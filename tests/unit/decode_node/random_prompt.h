// Prompts of random token ids for the decode worker's tests (ids in SmolLM2's ordinary range).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace tripod {

inline std::vector<int32_t> RandomPrompt(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(200, 40000);
  std::vector<int32_t> p(n);
  for (int32_t& t : p) t = id(rng);
  return p;
}

}  // namespace tripod
