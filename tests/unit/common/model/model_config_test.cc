// Tests for common/model/model_config's refusal of architectures Tripod does not serve: a GGUF
// saying gemma3 is refused before any weight is read, by ReadModelConfig, by the loader a tool
// opens (Session) and by the model identity every worker computes at start, each naming the
// architecture and the supported ones.
#include "common/model/model_config.h"

#include <unistd.h>

#include <fstream>
#include <memory>
#include <string>

#include "common/compute/session.h"
#include "common/model/gguf.h"
#include "common/rpc/model_identity.h"
#include "common/util/mmap_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/gguf_writer.h"

namespace tripod {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

auto NamesArchitectures(const std::string& refused) {
  return AllOf(HasSubstr("unsupported architecture '" + refused + "'"), HasSubstr("llama"),
               HasSubstr("qwen2"), HasSubstr("qwen3"));
}

TEST(ModelConfigTest, SupportedArchitecturesParse) {
  for (const char* arch : {"llama", "mistral", "qwen2", "qwen3"}) {
    const std::string bytes = gguf_writer::ModelMetadata(arch, {"a", "b"});
    absl::StatusOr<std::unique_ptr<GgufFile>> gguf =
        GgufFile::Parse(MmapFile::FromMemory(bytes.data(), bytes.size(), "mem.gguf"));
    ASSERT_TRUE(gguf.ok()) << gguf.status();
    absl::StatusOr<ModelConfig> c = ReadModelConfig(**gguf);
    ASSERT_TRUE(c.ok()) << arch << ": " << c.status();
    EXPECT_EQ(c->n_layers, 2);
    EXPECT_EQ(c->vocab_size, 2);
  }
}

TEST(ModelConfigTest, AnArchitectureTripodDoesNotServeIsRefusedAtStart) {
  const std::string bytes = gguf_writer::ModelMetadata("gemma3", {"a", "b"});
  absl::StatusOr<std::unique_ptr<GgufFile>> gguf =
      GgufFile::Parse(MmapFile::FromMemory(bytes.data(), bytes.size(), "mem.gguf"));
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  absl::StatusOr<ModelConfig> c = ReadModelConfig(**gguf);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(c.status().message(), NamesArchitectures("gemma3"));

  const std::string path =
      ::testing::TempDir() + "/model_config_gemma3_" + std::to_string(getpid()) + ".gguf";
  std::ofstream(path, std::ios::binary) << bytes;
  // A worker's first step (tripod-prefill, -decode, -draft): the refusal names the file too.
  absl::StatusOr<ModelIdentityInfo> id = ComputeModelIdentity(path);
  ASSERT_FALSE(id.ok());
  EXPECT_THAT(id.status().message(), AllOf(HasSubstr(path), NamesArchitectures("gemma3")));
  // tripod generate's.
  SessionOptions o;
  o.model_path = path;
  absl::StatusOr<std::unique_ptr<Session>> s = Session::Open(o);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), NamesArchitectures("gemma3"));
  unlink(path.c_str());
}

}  // namespace
}  // namespace tripod
