// The long-context tasks: each sample lands within 1% of its length, is reproducible from its
// index and seed, hides its answers in the prompt (the needles, the chain's variables, the common
// words at their frequency), and the scoring reads answers out of an output.
#include "eval/longctx_tasks.h"

#include <fstream>
#include <memory>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/model/gguf.h"
#include "gtest/gtest.h"
#include "tests/unit/test_model.h"

namespace tripod {
namespace {

int Count(const std::string& text, const std::string& word) {
  int n = 0;
  for (size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) ++n;
  return n;
}

class LongCtxTasksTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    gguf_ = GgufFile::Open(TestModelPath())->release();
    tokenizer_ = Tokenizer::FromGguf(*gguf_)->release();
    chat_ = new ChatTemplate(*DetectChatTemplate(*gguf_->GetString("tokenizer.chat_template")));
    std::ifstream f(TestSourceDir() + "/data/corpus/eval.txt");
    std::stringstream text;
    text << f.rdbuf();
    // A tenth of the corpus is plenty for 2k-token samples and tokenizes quickly.
    corpus_ = new LongCtxCorpus(MakeLongCtxCorpus(text.str().substr(0, 80000), *tokenizer_));
  }
  static void TearDownTestSuite() {
    delete corpus_;
    delete chat_;
    delete tokenizer_;
    delete gguf_;
  }
  static LongCtxSample Make(const std::string& task, int length, int index, uint64_t seed = 1) {
    absl::StatusOr<LongCtxSample> s =
        MakeLongCtxSample(task, length, index, seed, *corpus_, *tokenizer_, *chat_);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : LongCtxSample{};
  }
  static std::string Text(const LongCtxSample& s) { return tokenizer_->Decode(s.prompt); }

  static GgufFile* gguf_;
  static Tokenizer* tokenizer_;
  static ChatTemplate* chat_;
  static LongCtxCorpus* corpus_;
};
GgufFile* LongCtxTasksTest::gguf_ = nullptr;
Tokenizer* LongCtxTasksTest::tokenizer_ = nullptr;
ChatTemplate* LongCtxTasksTest::chat_ = nullptr;
LongCtxCorpus* LongCtxTasksTest::corpus_ = nullptr;

TEST_F(LongCtxTasksTest, EveryTaskLandsOnItsLengthAndHidesItsAnswers) {
  for (const std::string& task : LongCtxTaskNames()) {
    for (int length : {512, 2048}) {
      SCOPED_TRACE(absl::StrCat(task, " at ", length));
      const LongCtxSample s = Make(task, length, 3);
      EXPECT_LE(std::abs(static_cast<int>(s.prompt.size()) - length), length / 100);
      ASSERT_FALSE(s.answers.empty());
      const std::string text = Text(s);
      for (const std::string& a : s.answers) {
        // Needles say their answer twice (niah_single) or once; the common words `common` times.
        EXPECT_GE(Count(text, a), task == "cwe" ? 4 : 1) << a;
      }
      // The prompt ends with the start of the answer, after the chat's assistant turn.
      EXPECT_NE(text.rfind("assistant\n"), std::string::npos);
      EXPECT_GT(s.max_tokens, 0);
    }
  }
}

TEST_F(LongCtxTasksTest, SamplesAreReproducibleAndDiffer) {
  const LongCtxSample a = Make("niah_multikey", 1024, 5);
  const LongCtxSample b = Make("niah_multikey", 1024, 5);
  const LongCtxSample c = Make("niah_multikey", 1024, 6);
  const LongCtxSample d = Make("niah_multikey", 1024, 5, /*seed=*/2);
  EXPECT_EQ(a.prompt, b.prompt);
  EXPECT_EQ(a.answers, b.answers);
  EXPECT_NE(a.prompt, c.prompt);
  EXPECT_NE(a.prompt, d.prompt);
}

TEST_F(LongCtxTasksTest, VariableChainIsInOrder) {
  const LongCtxSample s = Make("vt", 1024, 0);
  ASSERT_EQ(s.answers.size(), 4u);
  const std::string text = Text(s);
  size_t last = 0;
  for (size_t i = 1; i < s.answers.size(); ++i) {
    const size_t at = text.find(absl::StrCat("VAR ", s.answers[i], " = VAR ", s.answers[i - 1]));
    ASSERT_NE(at, std::string::npos) << s.answers[i];
    EXPECT_GT(at, last);
    last = at;
  }
}

TEST_F(LongCtxTasksTest, BadTasksAndLengthsAreRefused) {
  EXPECT_FALSE(MakeLongCtxSample("qa", 1024, 0, 1, *corpus_, *tokenizer_, *chat_).ok());
  EXPECT_FALSE(MakeLongCtxSample("vt", 100, 0, 1, *corpus_, *tokenizer_, *chat_).ok());
}

TEST(LongCtxScoreTest, RecallAndExactMatch) {
  LongCtxSample one;
  one.answers = {"8021824"};
  EXPECT_EQ(ScoreLongCtxOutput(one, " \"8021824\" is it"), 1.0);
  EXPECT_EQ(ScoreLongCtxOutput(one, " 802182"), 0.0);
  LongCtxSample many;
  many.recall = true;
  many.answers = {"ABCDE", "FGHIJ", "KLMNO", "PQRST"};
  EXPECT_DOUBLE_EQ(ScoreLongCtxOutput(many, "abcde, KLMNO and more"), 0.5);
  EXPECT_DOUBLE_EQ(ScoreLongCtxOutput(many, "none"), 0.0);
}

}  // namespace
}  // namespace tripod
