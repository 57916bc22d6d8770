// The decode engine as the decode worker's tests run it: the test model, fp32 (batch-invariant
// kernels: exact tokens under batching), longer prompts in chunks of 128 tokens.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "decode_node/decode_engine.h"
#include "tests/unit/test_model.h"

namespace tripod {

inline DecodeEngineOptions TestEngineOptions(size_t kv_bytes = size_t{64} << 20) {
  DecodeEngineOptions o;
  o.model_path = TestModelPath();
  o.precision = "fp32";
  o.kv_budget_bytes = kv_bytes;
  o.max_tokens_per_step = 128;
  return o;
}

// A greedy request for max_tokens tokens past end-of-generation (on_event left to the caller).
inline DecodeRequest GreedyRequest(std::vector<int32_t> prompt, int max_tokens) {
  DecodeRequest r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0;
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

// Null (and a test failure) when the engine cannot be made.
inline std::unique_ptr<DecodeEngine> NewTestEngine(const DecodeEngineOptions& o) {
  auto e = DecodeEngine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(e).value() : nullptr;
}

}  // namespace tripod
