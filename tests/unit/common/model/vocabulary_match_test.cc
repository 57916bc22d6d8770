// Tests for common/model/vocabulary_match: a draft and a target with the same tokens pass; a
// different size, a different token and a missing vocabulary are refused, naming both files and
// where they part; the real pair of the catalogue, where fetched, passes.
#include "common/model/vocabulary_match.h"

#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "common/model/model_resolver.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/gguf_writer.h"
#include "tests/unit/test_model.h"

namespace tripod {
namespace {

using ::testing::HasSubstr;

std::string WriteGguf(const std::string& name, const std::string& bytes) {
  const std::string path =
      ::testing::TempDir() + "/vocab_" + std::to_string(getpid()) + "_" + name + ".gguf";
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

TEST(VocabularyMatchTest, SameTokensPass) {
  const std::vector<std::string> tokens = {"<s>", "a", "b", "ab"};
  const std::string draft = WriteGguf("d1", gguf_writer::ModelMetadata("qwen2", tokens));
  const std::string target = WriteGguf("t1", gguf_writer::ModelMetadata("llama", tokens));
  EXPECT_TRUE(CheckSameVocabulary(draft, target).ok());
  EXPECT_TRUE(CheckSameVocabulary(TestModelPath(), TestModelPath()).ok());
}

TEST(VocabularyMatchTest, DifferentVocabulariesAreRefused) {
  const std::string target =
      WriteGguf("t2", gguf_writer::ModelMetadata("qwen2", {"<s>", "a", "b"}));
  const std::string longer =
      WriteGguf("d2", gguf_writer::ModelMetadata("qwen2", {"<s>", "a", "b", "c"}));
  absl::Status s = CheckSameVocabulary(longer, target);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr(longer));
  EXPECT_THAT(s.message(), HasSubstr(target));
  EXPECT_THAT(s.message(), HasSubstr("4 tokens against 3"));
  EXPECT_THAT(s.message(), HasSubstr("the first 3 tokens agree"));

  const std::string other = WriteGguf("d3", gguf_writer::ModelMetadata("qwen2", {"<s>", "a", "x"}));
  s = CheckSameVocabulary(other, target);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("token 2 is x in the draft, b in the target"));

  // The bundled model (49152 tokens) against a small vocabulary.
  s = CheckSameVocabulary(TestModelPath(), target);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("49152 tokens against 3"));
}

TEST(VocabularyMatchTest, TheCataloguesQwenPairShareTheirVocabulary) {
  absl::StatusOr<std::string> target = ResolveModel("qwen2.5-coder-1.5b-instruct");
  absl::StatusOr<std::string> draft = ResolveModel("qwen2.5-coder-0.5b-instruct");
  if (!target.ok() || !draft.ok()) {
    GTEST_SKIP() << "the Qwen pair is not fetched here (scripts/fetch_model --with-draft "
                    "qwen2.5-coder-1.5b-instruct)";
  }
  EXPECT_TRUE(CheckSameVocabulary(*draft, *target).ok());
  EXPECT_FALSE(CheckSameVocabulary(TestModelPath(), *target).ok());
}

}  // namespace
}  // namespace tripod
