// Tokenizer unit tests: SmolLM2's real vocabulary (expected ids taken once from Hugging Face
// tokenizers), special tokens, streaming decode, SentencePiece BPE on a hand-built vocabulary,
// and malformed vocabularies.
#include "common/model/tokenizer.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/model/gguf.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/test_model.h"

namespace tripod {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string ModelPath() { return TestModelPath(); }

class SmolLmTokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto file = GgufFile::Open(ModelPath());
    ASSERT_TRUE(file.ok()) << file.status();
    gguf_ = file->release();
    auto tok = Tokenizer::FromGguf(*gguf_);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = tok->release();
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete gguf_;
    tok_ = nullptr;
    gguf_ = nullptr;
  }
  static GgufFile* gguf_;
  static Tokenizer* tok_;
};

GgufFile* SmolLmTokenizerTest::gguf_ = nullptr;
Tokenizer* SmolLmTokenizerTest::tok_ = nullptr;

// Expected ids from Hugging Face tokenizers (BPE + Digits + ByteLevel) on the same vocabulary.
TEST_F(SmolLmTokenizerTest, KnownEncodings) {
  EXPECT_THAT(tok_->Encode("Hello, world!"), ElementsAre(19556, 28, 905, 17));
  // Digits are split one by one, and the space before a number stays on its own.
  EXPECT_THAT(tok_->Encode("The year 2024 had 366 days."),
              ElementsAre(504, 713, 216, 34, 32, 34, 36, 761, 216, 35, 38, 38, 2009, 30));
  EXPECT_THAT(tok_->Encode("  leading spaces\n\n\tand tabs"),
              ElementsAre(216, 2899, 5600, 1116, 197, 397, 29416));
  EXPECT_THAT(tok_->Encode("Привет, мир! 你好世界"),
              ElementsAre(155, 249, 46879, 16464, 32547, 28, 41337, 7872, 9175, 17, 216, 18645, 250,
                          48392, 138, 7906, 240, 178, 239, 230));
  EXPECT_THAT(tok_->Encode("def f(x):\n    return x+1"),
              ElementsAre(1604, 275, 24, 104, 727, 472, 1003, 1792, 27, 33));
  EXPECT_THAT(tok_->Encode("I'm here 🦙"), ElementsAre(57, 5248, 1535, 15107, 116, 243));
  EXPECT_TRUE(tok_->Encode("").empty());
}

TEST_F(SmolLmTokenizerTest, Metadata) {
  EXPECT_EQ(tok_->vocab_size(), 49152);
  EXPECT_EQ(tok_->kind(), TokenizerKind::kByteLevelBpe);
  EXPECT_EQ(tok_->bos_id(), 1);
  EXPECT_EQ(tok_->eos_id(), 2);
  EXPECT_FALSE(tok_->add_bos());
  EXPECT_EQ(tok_->TokenText(19556), "Hello");
  EXPECT_EQ(tok_->TokenText(905), "\xC4\xA0world");  // "Ġworld"
  EXPECT_EQ(tok_->TokenText(-1), "");
  EXPECT_EQ(tok_->TokenText(49152), "");
  EXPECT_EQ(tok_->FindToken("<|im_start|>"), 1);
  EXPECT_EQ(tok_->FindToken("no such piece"), std::nullopt);
  EXPECT_EQ(tok_->token_type(1), TokenType::kControl);
}

TEST_F(SmolLmTokenizerTest, SpecialTokens) {
  const std::string chat = "<|im_start|>user\nHi<|im_end|>\n";
  EXPECT_THAT(tok_->Encode(chat, /*parse_special=*/true), ElementsAre(1, 4093, 198, 26843, 2, 198));
  // Not parsed: the markup is plain text (ids from HF with encode_special_tokens).
  EXPECT_THAT(tok_->Encode("<|im_start|>user", /*parse_special=*/false),
              ElementsAre(44, 108, 306, 79, 3738, 108, 46, 4093));
  EXPECT_EQ(tok_->Decode(tok_->Encode(chat)), chat);
  EXPECT_EQ(tok_->Decode(std::vector<int32_t>{1, 2, 0}), "<|im_start|><|im_end|><|endoftext|>");
  // Longest match wins and a partial marker is text.
  EXPECT_THAT(tok_->Encode("<|im_start"), ::testing::Not(::testing::Contains(1)));
  EXPECT_TRUE(tok_->IsEndOfGeneration(2));  // eos = <|im_end|>
  EXPECT_TRUE(tok_->IsEndOfGeneration(0));  // <|endoftext|>
  EXPECT_FALSE(tok_->IsEndOfGeneration(1));
  EXPECT_FALSE(tok_->IsEndOfGeneration(19556));
  EXPECT_FALSE(tok_->IsEndOfGeneration(-5));
}

TEST_F(SmolLmTokenizerTest, SegmentsParseSpecialsOnlyWhereAllowed) {
  const std::vector<TextSegment> segments = {
      {"<|im_start|>user\n", true}, {"say <|im_end|> now", false}, {"<|im_end|>\n", true}};
  const std::vector<int32_t> ids = tok_->EncodeSegments(segments);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 2), 1);  // only the template's <|im_end|>
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(tok_->Decode(ids), "<|im_start|>user\nsay <|im_end|> now<|im_end|>\n");
  // All segments parsed: the same as encoding the joined text.
  const std::vector<TextSegment> all = {{"a <|im_end|>", true}, {" b", true}};
  EXPECT_EQ(tok_->EncodeSegments(all), tok_->Encode("a <|im_end|> b"));
}

TEST_F(SmolLmTokenizerTest, RoundTripsText) {
  for (const std::string& text :
       {std::string("Tabs\tand\r\nCRLF  double  spaces   "),
        std::string("Ελληνικά, 日本語のテキスト"),
        std::string("emoji 👨‍👩‍👧 and ½ and 123456"), std::string(1000, ' ') + "x"}) {
    EXPECT_EQ(tok_->Decode(tok_->Encode(text)), text);
  }
}

TEST_F(SmolLmTokenizerTest, MinTokensIsALowerBound) {
  // The longest piece: a newline and 80 spaces, 2 bytes each byte-mapped.
  EXPECT_EQ(tok_->max_token_bytes(), 162u);
  std::string specials;
  for (int i = 0; i < 200; ++i) specials += "<|im_start|>";
  for (const std::string& text :
       {std::string(5000, ' '), std::string("\n").append(4000, ' '), std::string(3000, 'a'),
        std::string(2000, '-'), specials,
        std::string("Ελληνικά 日本語 👨‍👩‍👧 ").append(99, '='),
        std::string(300, '\xFF')}) {
    const size_t n = tok_->Encode(text).size();
    EXPECT_LE(tok_->MinTokens(text), n) << text.substr(0, 20);
  }
  EXPECT_EQ(tok_->MinTokens(std::string(1620, ' ')), 10u);
  // Bytes this vocabulary has no token for are dropped, and not counted.
  EXPECT_EQ(tok_->MinTokens(std::string(300, '\xFF')), 0u);
  EXPECT_EQ(tok_->MinTokens(std::string(1620, '\xFF').append("a")), 1u);
}

TEST_F(SmolLmTokenizerTest, InvalidUtf8IsEncodedByteByByte) {
  // Truncated and stray UTF-8 bytes whose byte tokens exist: encoded, and decoded back exactly.
  const std::string text = "ab\xC3 x\xE4\xBD y\x80z";
  const std::vector<int32_t> ids = tok_->Encode(text);
  EXPECT_FALSE(ids.empty());
  EXPECT_EQ(tok_->Decode(ids), text);
  // Bytes without a token in this vocabulary (0xF5..0xFF) are dropped, never a crash.
  EXPECT_EQ(tok_->Decode(tok_->Encode("a\xFF\xFE"
                                      "b")),
            "ab");
}

TEST_F(SmolLmTokenizerTest, DecodeSkipsBadIds) {
  EXPECT_EQ(tok_->Decode(std::vector<int32_t>{19556, -1, 1 << 30, 905}), "Hello world");
}

TEST_F(SmolLmTokenizerTest, StreamingHoldsBackSplitCharacters) {
  // "I'm here 🦙": the llama is three byte-level tokens (" \xF0\x9F", "\xA6", "\x99").
  StreamingDecoder dec(*tok_);
  EXPECT_EQ(dec.Push(57), "I");
  EXPECT_EQ(dec.Push(5248), "'m");
  EXPECT_EQ(dec.Push(1535), " here");
  EXPECT_EQ(dec.Push(15107), " ");  // the space goes out, the emoji's first bytes wait
  EXPECT_TRUE(dec.holding());
  EXPECT_EQ(dec.Push(116), "");
  EXPECT_EQ(dec.Push(243), "🦙");
  EXPECT_FALSE(dec.holding());
  EXPECT_EQ(dec.Flush(), "");
  // CJK split over byte tokens: "你好世界" = 18645 250 48392 138 7906 240 178 239 230.
  StreamingDecoder cjk(*tok_);
  std::string out;
  std::vector<std::string> pieces;
  for (int32_t id : {18645, 250, 48392, 138, 7906, 240, 178, 239, 230}) {
    pieces.push_back(cjk.Push(id));
    out += pieces.back();
  }
  EXPECT_THAT(pieces, ElementsAre("", "你", "", "好", "", "世", "", "", "界"));
  EXPECT_EQ(out + cjk.Flush(), "你好世界");
  // An unfinished character at the end comes out in Flush, as Decode would give it.
  StreamingDecoder tail(*tok_);
  EXPECT_EQ(tail.Push(18645), "");
  EXPECT_EQ(tail.Flush(), "\xE4\xBD");
}

TEST(Utf8Test, IncompleteTail) {
  EXPECT_EQ(tok::IncompleteUtf8Tail(""), 0u);
  EXPECT_EQ(tok::IncompleteUtf8Tail("abc"), 0u);
  EXPECT_EQ(tok::IncompleteUtf8Tail("a\xF0\x9F"), 2u);
  EXPECT_EQ(tok::IncompleteUtf8Tail("a\xF0\x9F\xA6"), 3u);
  EXPECT_EQ(tok::IncompleteUtf8Tail("a\xF0\x9F\xA6\x99"), 0u);
  EXPECT_EQ(tok::IncompleteUtf8Tail("\xE4"), 1u);
  EXPECT_EQ(tok::IncompleteUtf8Tail("\x80\x80"), 0u);  // no lead byte: never completes
  EXPECT_EQ(tok::IncompleteUtf8Tail("\xFF"), 0u);
  EXPECT_EQ(tok::IncompleteUtf8Tail("\xE0\x80"), 0u);  // overlong prefix: never valid
  EXPECT_EQ(tok::IncompleteUtf8Tail("\xED\xA0"), 0u);  // surrogate prefix
}

// A small SentencePiece vocabulary: expected ids follow from the rules (highest-score pair
// first, leftmost on ties, byte fallback, space prefix).
TokenizerVocab SmallSpmVocab() {
  TokenizerVocab v;
  v.model = "llama";
  v.tokens = {"<unk>", "<s>", "</s>"};
  v.token_types = {2, 3, 3};
  v.scores = {0, 0, 0};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    v.tokens.push_back(name);
    v.token_types.push_back(6);
    v.scores.push_back(0);
  }
  // id 259.. : pieces with scores (higher merges first).
  const std::vector<std::pair<std::string, float>> pieces = {{"\xE2\x96\x81", -1},
                                                             {"h", -2},
                                                             {"e", -2},
                                                             {"l", -2},
                                                             {"o", -2},
                                                             {"w", -2},
                                                             {"r", -2},
                                                             {"d", -2},
                                                             {"ll", -3},
                                                             {"\xE2\x96\x81h", -4},
                                                             {"he", -5},
                                                             {"llo", -6},
                                                             {"\xE2\x96\x81he", -7},
                                                             {"\xE2\x96\x81hello", -8},
                                                             {"lo", -9},
                                                             {"or", -9},
                                                             {"wor", -10},
                                                             {"\xE2\x96\x81w", -11}};
  for (const auto& [p, s] : pieces) {
    v.tokens.push_back(p);
    v.token_types.push_back(1);
    v.scores.push_back(s);
  }
  v.bos_id = 1;
  v.eos_id = 2;
  v.unk_id = 0;
  return v;
}

int32_t Id(const Tokenizer& t, const std::string& piece) { return *t.FindToken(piece); }

TEST(SentencePieceTest, MergesByScoreWithSpacePrefixAndByteFallback) {
  auto tok = Tokenizer::FromVocab(SmallSpmVocab());
  ASSERT_TRUE(tok.ok()) << tok.status();
  const Tokenizer& t = **tok;
  EXPECT_EQ(t.kind(), TokenizerKind::kSentencePieceBpe);
  EXPECT_TRUE(t.add_bos());  // the SentencePiece default
  // "hello" -> "▁hello": ll(-3) first, then ▁h(-4), ▁he(-7)... llo(-6) before ▁he(-7).
  EXPECT_THAT(t.Encode("hello"), ElementsAre(Id(t, "\xE2\x96\x81hello")));
  // "world": w,o,r,l,d: "or"(-9) merges, then "wor" would need w+or (-10) -> "▁" "w"... the
  // pair ▁+w (-11) loses to w+or (-10); "ld" is no piece.
  EXPECT_THAT(t.Encode("world"),
              ElementsAre(Id(t, "\xE2\x96\x81"), Id(t, "wor"), Id(t, "l"), Id(t, "d")));
  // "é" is no piece: its UTF-8 bytes.
  EXPECT_THAT(t.Encode("\xC3\xA9"),
              ElementsAre(Id(t, "\xE2\x96\x81"), Id(t, "<0xC3>"), Id(t, "<0xA9>")));
  // Every text fragment gets the space prefix, also after a special token.
  EXPECT_THAT(t.Encode("hello</s>hello"),
              ElementsAre(Id(t, "\xE2\x96\x81hello"), 2, Id(t, "\xE2\x96\x81hello")));
  // Decode: the prefix space is dropped once; byte tokens become bytes.
  EXPECT_EQ(t.Decode(t.Encode("hello world \xC3\xA9")), "hello world \xC3\xA9");
  EXPECT_EQ(t.Decode(t.Encode(" hello")), " hello");
  EXPECT_EQ(t.Decode(std::vector<int32_t>{1, Id(t, "\xE2\x96\x81hello")}), "<s> hello");
  // Streaming matches Decode, including the dropped leading space.
  StreamingDecoder dec(t);
  std::string streamed;
  for (int32_t id : t.Encode("hello \xC3\xA9")) streamed += dec.Push(id);
  EXPECT_EQ(streamed + dec.Flush(), "hello \xC3\xA9");
  // A continuation (a stream moved from another decode worker) is not the text's start: its
  // first token keeps its space.
  StreamingDecoder cont(t, /*continuation=*/true);
  EXPECT_EQ(cont.Push(Id(t, "\xE2\x96\x81hello")), " hello");
}

TEST(SentencePieceTest, MinTokensCountsBytesAnUnknownTokenCovers) {
  // 25 bytes; the longest piece is "▁hello", 8 bytes.
  const std::string text = "hello \xC3\xA9 qqqqqqqqqqqqqqqq";
  auto with_bytes = *Tokenizer::FromVocab(SmallSpmVocab());
  EXPECT_EQ(with_bytes->max_token_bytes(), 8u);
  EXPECT_EQ(with_bytes->MinTokens(text), 4u);
  EXPECT_LE(with_bytes->MinTokens(text), with_bytes->Encode(text).size());
  // Without byte tokens past ASCII, "é" becomes two <unk>s: its bytes still count.
  TokenizerVocab v = SmallSpmVocab();
  for (int b = 0x80; b < 256; ++b) v.tokens[3 + b] = std::string("x").append(std::to_string(b));
  auto with_unk = *Tokenizer::FromVocab(v);
  EXPECT_EQ(with_unk->MinTokens(text), 4u);
  EXPECT_LE(with_unk->MinTokens(text), with_unk->Encode(text).size());
  // Without an unknown token either, they are dropped and do not count: ceil(23 / 8).
  v.unk_id = -1;
  auto dropping = *Tokenizer::FromVocab(v);
  EXPECT_EQ(dropping->MinTokens(text), 3u);
  EXPECT_LE(dropping->MinTokens(text), dropping->Encode(text).size());
}

TEST(SentencePieceTest, LeftmostWinsOnEqualScores) {
  TokenizerVocab v = SmallSpmVocab();
  v.add_space_prefix = false;
  auto tok = Tokenizer::FromVocab(v);
  ASSERT_TRUE(tok.ok()) << tok.status();
  // "lll": "ll" at 0 and at 1 tie; the left one merges.
  EXPECT_THAT((*tok)->Encode("lll"), ElementsAre(Id(**tok, "ll"), Id(**tok, "l")));
}

TokenizerVocab ByteLevelVocab() {
  TokenizerVocab v;
  v.model = "gpt2";
  v.pre = "gpt-2";
  for (int b = 0; b < 256; ++b) {
    std::string piece;
    tok::AppendUtf8(tok::ByteToCodepoint()[b], &piece);
    v.tokens.push_back(piece);
  }
  for (const char* p : {"bc", "ab", "abc", "<|end|>"}) v.tokens.push_back(p);
  v.token_types.assign(v.tokens.size(), 1);
  v.token_types.back() = 3;
  v.merges = {"b c", "a b", "a bc"};
  return v;
}

TEST(ByteLevelBpeTest, LowestRankMergesFirst) {
  auto tok = Tokenizer::FromVocab(ByteLevelVocab());
  ASSERT_TRUE(tok.ok()) << tok.status();
  const Tokenizer& t = **tok;
  EXPECT_THAT(t.Encode("abc"), ElementsAre(258 /*abc*/));  // b c, then a bc
  EXPECT_THAT(t.Encode("abab"), ElementsAre(257, 257));
  EXPECT_THAT(t.Encode("x<|end|>"), ElementsAre('x', 259));
  EXPECT_TRUE(t.IsEndOfGeneration(259));
  EXPECT_FALSE(t.add_bos());
  EXPECT_EQ(t.Decode(t.Encode("abc abc\n")), "abc abc\n");
}

TEST(ByteLevelBpeTest, Llama3SkipsMergesForWholeWordTokens) {
  TokenizerVocab v = ByteLevelVocab();
  v.pre = "llama-bpe";
  v.merges = {"a b"};  // "abc" is reachable by no merge, but is a token
  auto tok = Tokenizer::FromVocab(v);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT((*tok)->Encode("abc"), ElementsAre(258));
  EXPECT_TRUE((*tok)->add_bos());  // Llama 3's default
  v.pre = "gpt-2";
  auto plain = Tokenizer::FromVocab(v);
  ASSERT_TRUE(plain.ok());
  EXPECT_THAT((*plain)->Encode("abc"), ElementsAre(257, 'c'));
}

TEST(TokenizerErrorsTest, RejectsBadVocabularies) {
  TokenizerVocab v = ByteLevelVocab();
  v.model = "bert";
  EXPECT_THAT(Tokenizer::FromVocab(v).status().message(), HasSubstr("unsupported"));
  v = ByteLevelVocab();
  v.pre = "mystery";
  auto st = Tokenizer::FromVocab(v).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(st.message(), HasSubstr("mystery"));
  v = ByteLevelVocab();
  v.pre.clear();
  EXPECT_FALSE(Tokenizer::FromVocab(v).ok());
  v = ByteLevelVocab();
  v.merges = {"nospace"};
  EXPECT_THAT(Tokenizer::FromVocab(v).status().message(), HasSubstr("merge 0"));
  v = ByteLevelVocab();
  v.token_types.pop_back();
  EXPECT_FALSE(Tokenizer::FromVocab(v).ok());
  v = ByteLevelVocab();
  v.eos_id = 100000;
  EXPECT_THAT(Tokenizer::FromVocab(v).status().message(), HasSubstr("eos"));
  v = ByteLevelVocab();
  v.tokens.clear();
  v.token_types.clear();
  EXPECT_FALSE(Tokenizer::FromVocab(v).ok());
  TokenizerVocab s = SmallSpmVocab();
  s.scores.pop_back();
  EXPECT_FALSE(Tokenizer::FromVocab(s).ok());
}

}  // namespace
}  // namespace tripod
