// eval-pop and pop-importance on a few short windows of the bundled corpus: what must hold
// whatever the model (ratio 0 reproduces the full model exactly, pruning more moves further
// away, a last-layer prefill gate changes nothing) and the JSON shape.
#include "eval/pop/pop_eval.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "common/compute/cpu/cpu_backend.h"
#include "common/model/tokenizer.h"
#include "eval/pop/corpus_windows.h"
#include "eval/pop/pop_importance.h"
#include "tests/unit/test_model.h"

namespace tripod {
namespace {

class PopAnalysisTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = TestModelPath();
    // fp32, as `tripod pop-importance` runs: its central differences need smooth arithmetic.
    backend_ = MakeCpuBackend(*CpuOptionsForPrecision("fp32")).release();
    auto m = LoadModel(path, *backend_);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = m->release();
    auto tok = Tokenizer::FromGguf(*model_->gguf);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = tok->release();
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete model_;
    delete backend_;
  }
  void SetUp() override { ASSERT_NE(tok_, nullptr); }

  static std::vector<CorpusWindow> Windows(const std::string& file, std::vector<int> lengths,
                                           int continuation) {
    auto text = ReadTextFile(TestSourceDir() + "/data/corpus/" + file);
    EXPECT_TRUE(text.ok()) << text.status();
    auto w = CutWindows(*tok_, *text, lengths, continuation);
    EXPECT_TRUE(w.ok()) << w.status();
    return *w;
  }

  static Backend* backend_;
  static LoadedModel* model_;
  static Tokenizer* tok_;
};
Backend* PopAnalysisTest::backend_ = nullptr;
LoadedModel* PopAnalysisTest::model_ = nullptr;
Tokenizer* PopAnalysisTest::tok_ = nullptr;

TEST(PopMethodsTest, ParsingAndSkipSets) {
  EXPECT_EQ(PopSkippedLayers(30, 1.0 / 3),
            (std::vector<int>{20, 21, 22, 23, 24, 25, 26, 27, 28, 29}));
  EXPECT_EQ(PopSkippedLayers(30, 0.2).size(), 6u);
  EXPECT_EQ(PopSkippedLayers(30, 0.25).size(), 7u);
  EXPECT_TRUE(PopSkippedLayers(30, 0).empty());
  auto m = ParsePopMethods("pop:0.25, nokv:1/3,shortgpt:0.5,noboundary:0");
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->size(), 4u);
  EXPECT_EQ((*m)[1].kind, PopMethodKind::kNoKv);
  EXPECT_DOUBLE_EQ((*m)[1].ratio, 1.0 / 3);
  EXPECT_EQ((*m)[0].name(), "pop@0.250");
  EXPECT_FALSE(ParsePopMethods("pop").ok());
  EXPECT_FALSE(ParsePopMethods("prune:0.3").ok());
  EXPECT_FALSE(ParsePopMethods("pop:1.5").ok());
  EXPECT_FALSE(ParsePopMethods("pop:1/0").ok());
  EXPECT_EQ(DefaultPopMethods().size(), 9u);
}

TEST(CorpusWindowsTest, SpreadLengthsCoverTheRange) {
  std::vector<int> l = SpreadLengths(100, 256, 2048, 1);
  ASSERT_EQ(l.size(), 100u);
  EXPECT_EQ(*std::min_element(l.begin(), l.end()), 256);
  EXPECT_EQ(*std::max_element(l.begin(), l.end()), 2048);
  EXPECT_NE(l, SpreadLengths(100, 256, 2048, 2));  // shuffled by the seed
}

TEST_F(PopAnalysisTest, WindowsAreDisjointAndSized) {
  std::vector<CorpusWindow> w = Windows("eval.txt", {40, 70}, 8);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(w[0].prompt.size(), 40u);
  EXPECT_EQ(w[1].prompt.size(), 70u);
  EXPECT_EQ(w[0].continuation.size(), 8u);
  EXPECT_NE(w[0].continuation, w[1].continuation);
  auto short_text = CutWindows(*tok_, "A few words.", {40}, 8);
  EXPECT_FALSE(short_text.ok());
}

TEST_F(PopAnalysisTest, EvalPopHoldsItsInvariants) {
  const std::vector<CorpusWindow> w = Windows("eval.txt", {48, 80, 64}, 8);
  auto methods =
      ParsePopMethods("pop:0,pop:0.2,pop:1/3,pop:0.5,shortgpt:1/3,noboundary:1/3,nokv:1/3");
  ASSERT_TRUE(methods.ok());
  PopEvalOptions opt;
  opt.generate_tokens = 8;
  auto res = EvalPop(*model_, *backend_, w, *methods, opt);
  ASSERT_TRUE(res.ok()) << res.status();
  ASSERT_EQ(res->methods.size(), 7u);
  const nlohmann::json j = PopEvalToJson(*res);
  ASSERT_EQ(j["methods"].size(), 7u);
  EXPECT_EQ(j["prompts"], 3);
  EXPECT_EQ(j["per_prompt"]["prompt_tokens"].size(), 3u);
  for (const auto& m : j["methods"]) {
    for (const char* key : {"name", "kl", "kl_se", "agreement", "ppl", "nll", "skipped_layers",
                            "first_token_agreement", "by_length"}) {
      EXPECT_TRUE(m.contains(key)) << key;
    }
    EXPECT_GE(m["kl"].get<double>(), 0.0);
    EXPECT_TRUE(std::isfinite(m["ppl"].get<double>()));
    EXPECT_GE(m["agreement"].get<double>(), 0.0);
    EXPECT_LE(m["agreement"].get<double>(), 1.0);
  }
  auto kl = [&](int i) { return j["methods"][i]["kl"].get<double>(); };
  // Ratio 0 is the reference computation itself.
  EXPECT_EQ(kl(0), 0.0);
  EXPECT_EQ(j["methods"][0]["agreement"].get<double>(), 1.0);
  EXPECT_EQ(j["methods"][0]["nll"].get<double>(), j["full"]["nll"].get<double>());
  EXPECT_EQ(j["methods"][2]["skipped_layers"].size(), 10u);
  // Pruning moves away from the full model, more so at 1/2 than at 1/5.
  EXPECT_GT(kl(1), 0.0);
  EXPECT_GT(kl(3), kl(1));
  // Every control at 1/3 differs from POP at 1/3 (different computations).
  for (int c = 4; c < 7; ++c) EXPECT_NE(kl(c), kl(2)) << c;
}

TEST_F(PopAnalysisTest, ImportanceSeparatesTheStages) {
  std::vector<CorpusWindow> w = Windows("calib.txt", {16}, 0);
  const int L = model_->config.n_layers;
  PopImportanceOptions opt;
  opt.answer_tokens = 6;
  opt.layers = {1, 14, L - 1};
  auto res = PopImportance(*model_, *backend_, {w[0].prompt}, opt);
  ASSERT_TRUE(res.ok()) << res.status();
  ASSERT_EQ(res->layers.size(), size_t(L));
  // The last layer's prefill-stage branches feed nothing that pass 2 reads (its own K/V come
  // from its input): exactly no effect. Its decode-stage branches feed the head: an effect.
  EXPECT_EQ(res->layers[L - 1].d_prefill[0], 0.0);
  EXPECT_EQ(res->layers[L - 1].ablate_prefill[0], 0.0);
  EXPECT_NE(res->layers[L - 1].d_decode[0], 0.0);
  // An early layer matters in both stages.
  EXPECT_NE(res->layers[1].d_prefill[0], 0.0);
  EXPECT_GT(res->base_loss[0], 0.0);
  EXPECT_TRUE(res->layers[2].d_prefill.empty());  // not asked for
  // A half step gives nearly the same derivative where it is not tiny.
  opt.eps = 0.025;
  auto half = PopImportance(*model_, *backend_, {w[0].prompt}, opt);
  ASSERT_TRUE(half.ok());
  EXPECT_EQ(half->base_loss[0], res->base_loss[0]);  // same seed, same answer
  for (int l : opt.layers) {
    const double a = res->layers[l].d_decode[0], b = half->layers[l].d_decode[0];
    EXPECT_NEAR(a, b, 0.1 * std::fabs(b) + 0.02) << "layer " << l;
  }
  const nlohmann::json j = PopImportanceToJson(*res);
  ASSERT_EQ(j["layers"].size(), 3u);
  for (const char* key : {"layer", "prefill_importance", "decode_importance", "prefill_ablation",
                          "decode_ablation", "prefill_importance_se"}) {
    EXPECT_TRUE(j["layers"][0].contains(key)) << key;
  }
  EXPECT_FALSE(PopImportanceTable(*res).empty());
}

}  // namespace
}  // namespace tripod
