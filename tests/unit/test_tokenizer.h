// The test model's tokenizer, for tests that format or parse text without running the model.
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "common/model/gguf.h"
#include "common/model/tokenizer.h"
#include "tests/unit/test_model.h"

namespace tripod {

// Null (and a test failure) when the model file cannot be read.
inline std::unique_ptr<Tokenizer> LoadTestTokenizer() {
  auto gguf = GgufFile::Open(TestModelPath());
  EXPECT_TRUE(gguf.ok()) << gguf.status();
  if (!gguf.ok()) return nullptr;
  auto tok = Tokenizer::FromGguf(**gguf);
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? std::move(*tok) : nullptr;
}

}  // namespace tripod
