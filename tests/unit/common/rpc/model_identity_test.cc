// Tests for common/rpc/model_identity over the bundled model and altered copies of it: the
// digest is stable, covers exactly the bytes before the tensor data (checked against sha256sum),
// changes with one header byte and not with the weights; broken files are clear errors.
#include "common/rpc/model_identity.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/model/gguf.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/test_model.h"

namespace tripod {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;

std::string ReadPrefix(const std::string& path, size_t n) {
  std::ifstream in(path, std::ios::binary);
  std::string s(n, '\0');
  in.read(s.data(), static_cast<std::streamsize>(n));
  s.resize(static_cast<size_t>(in.gcount()));
  return s;
}

// Writes `head` and then extends the file with zeros to `size` bytes (sparse: cheap however large
// the model is).
void WriteFile(const std::string& path, const std::string& head, size_t size) {
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(head.data(), static_cast<std::streamsize>(head.size()));
  }
  if (size > head.size()) {
    ASSERT_EQ(truncate(path.c_str(), static_cast<off_t>(size)), 0);
  }
}

class ModelIdentityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto gguf = GgufFile::Open(model_);
    ASSERT_TRUE(gguf.ok()) << gguf.status();
    data_offset_ = (*gguf)->data_offset();
    std::ifstream in(model_, std::ios::binary | std::ios::ate);
    file_size_ = static_cast<size_t>(in.tellg());
    header_ = ReadPrefix(model_, data_offset_);
    ASSERT_EQ(header_.size(), data_offset_);
  }

  std::string TempPath(const std::string& name) {
    std::string path =
        ::testing::TempDir() + "/model_identity_" + std::to_string(getpid()) + "_" + name + ".gguf";
    temps_.push_back(path);
    return path;
  }

  void TearDown() override {
    for (const std::string& p : temps_) std::remove(p.c_str());
  }

  const std::string model_ = TestModelPath();
  uint64_t data_offset_ = 0;
  size_t file_size_ = 0;
  std::string header_;
  std::vector<std::string> temps_;
};

TEST_F(ModelIdentityTest, BundledModel) {
  auto a = ComputeModelIdentity(model_);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = ComputeModelIdentity(model_);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->sha256, b->sha256);
  EXPECT_THAT(a->sha256, MatchesRegex("[0-9a-f]{64}"));
  EXPECT_EQ(a->file_name, model_.substr(model_.rfind('/') + 1));
  EXPECT_GT(data_offset_, 0u);
  EXPECT_LT(data_offset_, file_size_);
  if (a->file_name == "SmolLM2-135M-Instruct.Q4_1.gguf") {
    EXPECT_EQ(a->n_layers, 30);
    EXPECT_EQ(a->n_kv_heads, 3);
    EXPECT_EQ(a->head_dim, 64);
    EXPECT_EQ(a->vocab_size, 49152);
    EXPECT_EQ(a->context_length, 8192);
  }
}

// An independent digest of the same bytes: coreutils' sha256sum of the first data_offset bytes.
TEST_F(ModelIdentityTest, DigestIsSha256OfTheBytesBeforeTheTensorData) {
  auto id = ComputeModelIdentity(model_);
  ASSERT_TRUE(id.ok()) << id.status();
  const std::string header_only = TempPath("header");
  WriteFile(header_only, header_, header_.size());
  FILE* p = popen(("sha256sum '" + header_only + "'").c_str(), "r");
  ASSERT_NE(p, nullptr);
  char digest[65] = {};
  const size_t n = std::fread(digest, 1, 64, p);
  pclose(p);
  ASSERT_EQ(n, 64u);
  EXPECT_EQ(id->sha256, std::string(digest, 64));
}

TEST_F(ModelIdentityTest, WeightsDoNotCountOneHeaderByteDoes) {
  auto original = ComputeModelIdentity(model_);
  ASSERT_TRUE(original.ok()) << original.status();

  // Same header, weights all zero: the same identity (the digest never reads the weights).
  const std::string zero_weights = TempPath("zero_weights");
  WriteFile(zero_weights, header_, file_size_);
  auto same = ComputeModelIdentity(zero_weights);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(same->sha256, original->sha256);

  // One byte of general.name's value changed: still a valid file, another digest.
  const std::string key = "general.name";
  const size_t at = header_.find(key);
  ASSERT_NE(at, std::string::npos);
  const size_t value = at + key.size() + 4 + 8;  // type (u32), length (u64), then the bytes
  ASSERT_LT(value, header_.size());
  std::string changed = header_;
  changed[value] = changed[value] == 'X' ? 'Y' : 'X';
  const std::string renamed = TempPath("renamed");
  WriteFile(renamed, changed, file_size_);
  auto other = ComputeModelIdentity(renamed);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_NE(other->sha256, original->sha256);
  EXPECT_EQ(other->n_layers, original->n_layers);
}

TEST_F(ModelIdentityTest, BrokenFilesAreErrors) {
  const std::string missing = TempPath("missing");
  auto r = ComputeModelIdentity(missing);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr(missing));

  // Cut inside the tensor data, and inside the header.
  for (size_t size : {static_cast<size_t>(data_offset_) + 1000, static_cast<size_t>(100)}) {
    const std::string truncated = TempPath("truncated_" + std::to_string(size));
    WriteFile(truncated, header_.substr(0, std::min<size_t>(size, header_.size())), size);
    r = ComputeModelIdentity(truncated);
    ASSERT_FALSE(r.ok()) << size;
    EXPECT_THAT(r.status().message(), HasSubstr(truncated)) << r.status();
  }

  const std::string text = TempPath("text");
  WriteFile(text, "this is not a GGUF file\n", 0);
  r = ComputeModelIdentity(text);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr(text));
}

TEST(ModelIdentityWireTest, ToWireCopiesEveryField) {
  const ModelIdentityInfo info{"m.gguf", std::string(64, 'a'), 30, 3, 64, 49152, 8192};
  tripod::v1::ModelIdentity wire;
  ToWire(info, &wire);
  EXPECT_EQ(wire.file_name(), "m.gguf");
  EXPECT_EQ(wire.sha256(), std::string(64, 'a'));
  EXPECT_EQ(wire.n_layers(), 30);
  EXPECT_EQ(wire.n_kv_heads(), 3);
  EXPECT_EQ(wire.head_dim(), 64);
  EXPECT_EQ(wire.vocab_size(), 49152);
  EXPECT_EQ(wire.context_length(), 8192);
}

}  // namespace
}  // namespace tripod
