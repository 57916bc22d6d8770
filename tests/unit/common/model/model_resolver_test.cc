// Tests for common/model/model_resolver: catalogue names found in a models directory or the cache
// (temporary ones, and the ones the environment names), paths passed through, an unknown word
// and a missing or partial model refused with what to do about it.
#include "common/model/model_resolver.h"

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/test_source_dir.h"

namespace tripod {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr char kCatalogue[] = R"({
  "default": "tiny",
  "models": {
    "big-model": {"file": "big.gguf", "bytes": 12, "draft": "tiny", "pop": "1/3",
                  "sha256": "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
                  "parts": {"count": 2, "package": "big-{n}", "version": "1", "member": "p{nn}"}},
    "tiny": {"file": "tiny.gguf", "bytes": 4, "pop": "0",
             "sha256": "ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
             "parts": {"count": 1, "package": "tiny", "version": "1", "member": "tiny.gguf"}}
  }
})";

// Sets an environment variable for the scope, restoring the old value (or its absence) after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

class ModelResolverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<ModelCatalogue> c = ParseModelCatalogue(kCatalogue);
    ASSERT_TRUE(c.ok()) << c.status();
    catalogue_ = *std::move(c);
    std::string tmpl = ::testing::TempDir() + "/model_resolver_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    fs::create_directories(root_ + "/models");
    fs::create_directories(root_ + "/cache");
    search_ = {.models_dirs = {root_ + "/models"}, .cache_dir = root_ + "/cache"};
  }
  void TearDown() override { fs::remove_all(root_); }

  static void Write(const std::string& path, size_t bytes) {
    std::ofstream(path, std::ios::binary) << std::string(bytes, 'x');
  }

  absl::StatusOr<std::string> Resolve(std::string_view name_or_path) {
    return ResolveModelIn(name_or_path, catalogue_, search_);
  }

  ModelCatalogue catalogue_;
  std::string root_;
  ModelSearch search_;
};

TEST_F(ModelResolverTest, FindsANameInTheModelsDirBeforeTheCache) {
  Write(root_ + "/cache/big.gguf", 12);
  absl::StatusOr<std::string> p = Resolve("big-model");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, root_ + "/cache/big.gguf");

  // A models/ link to the cache (what fetch_model makes) is found first, as models/.
  fs::create_symlink(root_ + "/cache/big.gguf", root_ + "/models/big.gguf");
  p = Resolve("big-model");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, root_ + "/models/big.gguf");

  // A dangling link (the cache emptied) is passed over, not taken.
  fs::remove(root_ + "/cache/big.gguf");
  p = Resolve("big-model");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ModelResolverTest, EmptyMeansTheDefaultModel) {
  Write(root_ + "/models/tiny.gguf", 4);
  absl::StatusOr<std::string> p = Resolve("");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, root_ + "/models/tiny.gguf");
}

TEST_F(ModelResolverTest, AMissingNameSaysHowToFetchIt) {
  absl::StatusOr<std::string> p = Resolve("big-model");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(p.status().message(), HasSubstr("scripts/fetch_model big-model"));
  EXPECT_THAT(p.status().message(), HasSubstr(root_ + "/models"));
  EXPECT_THAT(p.status().message(), HasSubstr(root_ + "/cache"));
  EXPECT_THAT(p.status().message(), HasSubstr("big.gguf"));
}

TEST_F(ModelResolverTest, APartialFileIsRefused) {
  Write(root_ + "/cache/big.gguf", 7);
  absl::StatusOr<std::string> p = Resolve("big-model");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(p.status().message(), HasSubstr("is 7 bytes"));
  EXPECT_THAT(p.status().message(), HasSubstr("12 bytes"));
  EXPECT_THAT(p.status().message(), HasSubstr("scripts/fetch_model big-model"));
}

TEST_F(ModelResolverTest, PathsPassThroughAndUnknownWordsAreRefused) {
  // Paths are the loader's to open and report on, existing or not.
  for (const char* path : {"/no/such/file.gguf", "other.gguf", "./big-model", "models/x"}) {
    absl::StatusOr<std::string> p = Resolve(path);
    ASSERT_TRUE(p.ok()) << path << ": " << p.status();
    EXPECT_EQ(*p, path);
  }
  // An existing file without a slash or .gguf is a path too.
  const std::string cwd = fs::current_path().string();
  fs::current_path(root_);
  Write(root_ + "/weights.bin", 3);
  absl::StatusOr<std::string> file = Resolve("weights.bin");
  fs::current_path(cwd);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(*file, "weights.bin");

  absl::StatusOr<std::string> p = Resolve("qwen-9000");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(p.status().message(), HasSubstr("'qwen-9000'"));
  EXPECT_THAT(p.status().message(), HasSubstr("big-model, tiny"));
  EXPECT_FALSE(IsCatalogueName(catalogue_, "qwen-9000"));
  EXPECT_TRUE(IsCatalogueName(catalogue_, "tiny"));
  EXPECT_TRUE(IsCatalogueName(catalogue_, ""));
}

TEST_F(ModelResolverTest, TheEnvironmentNamesTheModelsDirAndTheCache) {
  {
    ScopedEnv models("TRIPOD_MODELS_DIR", (root_ + "/models").c_str());
    ScopedEnv xdg("XDG_CACHE_HOME", (root_ + "/xdg").c_str());
    const ModelSearch s = DefaultModelSearch();
    ASSERT_FALSE(s.models_dirs.empty());
    EXPECT_EQ(s.models_dirs.front(), root_ + "/models");
    EXPECT_EQ(s.cache_dir, root_ + "/xdg/tripod/models");

    fs::create_directories(root_ + "/xdg/tripod/models");
    // The real catalogue through ResolveModel: a 1.5B name found in the XDG cache (a sparse file
    // of the catalogue's size: only the size is checked).
    const CatalogueModel* qwen = BuiltinModelCatalogue().Find("qwen2.5-coder-1.5b-instruct");
    const std::string in_cache = root_ + "/xdg/tripod/models/" + qwen->file;
    std::ofstream(in_cache).close();
    fs::resize_file(in_cache, qwen->bytes);
    absl::StatusOr<std::string> p = ResolveModel("qwen2.5-coder-1.5b-instruct");
    ASSERT_TRUE(p.ok()) << p.status();
    // In DefaultModelSearch()'s order: a checkout's models/ that holds the real file (fetch_model
    // links it there; scripts/test fetches it for the real_model tests) comes before the cache.
    std::string want = in_cache;
    for (const std::string& dir : s.models_dirs) {
      if (fs::exists(dir + "/" + qwen->file)) {
        want = dir + "/" + qwen->file;
        break;
      }
    }
    EXPECT_EQ(*p, want);
    // The cache, with a models directory that lacks the file, whatever the checkout holds.
    p = ResolveModelIn("qwen2.5-coder-1.5b-instruct", BuiltinModelCatalogue(),
                       ModelSearch{{root_ + "/models"}, s.cache_dir});
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(*p, in_cache);
  }
  {
    // An unset (or relative) XDG_CACHE_HOME: $HOME/.cache.
    ScopedEnv xdg("XDG_CACHE_HOME", "relative/dir");
    ScopedEnv home("HOME", root_.c_str());
    EXPECT_EQ(DefaultModelSearch().cache_dir, root_ + "/.cache/tripod/models");
  }
  {
    ScopedEnv xdg("XDG_CACHE_HOME", nullptr);
    ScopedEnv home("HOME", root_.c_str());
    EXPECT_EQ(DefaultModelSearch().cache_dir, root_ + "/.cache/tripod/models");
    ScopedEnv models("TRIPOD_MODELS_DIR", nullptr);
    absl::StatusOr<std::string> p = ResolveModel("qwen2.5-coder-0.5b-instruct");
    // Not in this HOME's cache; found only if this checkout's models/ has it.
    if (!p.ok()) {
      EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound);
      EXPECT_THAT(p.status().message(),
                  HasSubstr("fetch it with: scripts/fetch_model qwen2.5-coder-0.5b-instruct"));
    } else {
      EXPECT_THAT(*p, HasSubstr("/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"));
    }
  }
}

TEST(CheckoutDirsTest, IncludeTheSourceTree) {
  const std::vector<std::string> dirs = CheckoutDirs();
  ASSERT_FALSE(dirs.empty());
  EXPECT_EQ(dirs.front(), std::filesystem::current_path().string());
  bool source = false;
  for (const std::string& d : dirs) {
    source = source || fs::equivalent(d, TestSourceDir());
  }
  EXPECT_TRUE(source);
  EXPECT_FALSE(FetchModelScript().empty());
}

}  // namespace
}  // namespace tripod
