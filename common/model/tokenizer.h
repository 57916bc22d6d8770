// Text <-> token ids for GGUF models: byte-level BPE (`gpt2`: SmolLM2, Llama 3, Qwen2) and
// SentencePiece-style BPE (`llama`: Llama 2, Mistral), plus streaming detokenisation.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/gguf.h"
#include "common/model/pretokenizer_regex.h"
#include "common/model/tokenizer_bpe.h"

namespace tripod {

// GGUF `tokenizer.ggml.token_type` values.
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

enum class TokenizerKind { kByteLevelBpe, kSentencePieceBpe };

// Everything a tokenizer is built from: what FromGguf reads out of the file. Tests build these
// by hand for small vocabularies.
struct TokenizerVocab {
  std::string model;  // "gpt2" (byte-level BPE) or "llama" (SentencePiece BPE)
  std::string pre;    // byte-level only: pre-tokenizer name (tokenizer.ggml.pre)
  std::vector<std::string> tokens;
  std::vector<int32_t> token_types;  // empty: all normal
  std::vector<float> scores;         // SentencePiece merge priorities; empty: all 0
  std::vector<std::string> merges;   // byte-level: "left right", in rank order
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  int32_t unk_id = -1;
  int32_t eot_id = -1;
  int32_t eom_id = -1;
  std::optional<bool> add_bos;           // unset: the model family's default
  std::optional<bool> add_space_prefix;  // SentencePiece only; unset: true
};

// A piece of text to encode and whether special tokens written in it are recognised.
struct TextSegment {
  std::string_view text;
  bool parse_special = true;
};

class Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const GgufFile& gguf);
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromVocab(TokenizerVocab vocab);
  Tokenizer(const Tokenizer&) = delete;  // the piece index points into tokens_
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Text -> ids; thread-safe. parse_special: control tokens written in the text (like
  // <|im_start|>) become their ids; without it they are tokenized as plain text, so user text
  // cannot inject them. User-defined tokens (type 4) are matched either way, as llama.cpp does.
  // Never adds BOS: callers prepend bos_id() when add_bos() and the text does not start with it.
  std::vector<int32_t> Encode(std::string_view text, bool parse_special = true) const;
  // Encodes the concatenation of the segments as one text, but recognises special tokens only
  // inside segments that allow it (a special token never spans two segments).
  std::vector<int32_t> EncodeSegments(std::span<const TextSegment> segments) const;
  // Ids -> bytes. Control tokens render as their text; unknown ids render as nothing. The result
  // is raw bytes and may be ill-formed UTF-8 when the ids split a character.
  std::string Decode(std::span<const int32_t> ids) const;
  std::string_view TokenText(int32_t id) const;  // the raw vocabulary piece, "" if out of range
  TokenType token_type(int32_t id) const;
  // Bytes token `id` stands for in decoded text ("" for an unknown id).
  std::string_view DecodedPiece(int32_t id) const;

  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  bool add_bos() const { return add_bos_; }
  bool IsEndOfGeneration(int32_t id) const;  // eos, eot, eom, <|im_end|>, <|eot_id|>, ...
  std::span<const int32_t> end_of_generation_ids() const { return end_of_generation_; }
  int32_t vocab_size() const { return static_cast<int32_t>(tokens_.size()); }
  std::optional<int32_t> FindToken(std::string_view piece) const;
  TokenizerKind kind() const { return kind_; }
  // A lower bound on Encode(text).size(), in one pass over the bytes without encoding: a prompt far
  // too long for a context is refused without the second or more that megabytes take to encode.
  size_t MinTokens(std::string_view text) const;
  // The most bytes of text one token covers (its raw piece is never shorter), which MinTokens
  // divides by.
  size_t max_token_bytes() const { return max_token_bytes_; }

 private:
  friend class StreamingDecoder;
  Tokenizer() = default;
  absl::Status Init(TokenizerVocab vocab);
  bool strips_leading_space() const {
    return kind_ == TokenizerKind::kSentencePieceBpe && add_space_prefix_;
  }
  // Encodes one fragment of text without special tokens; the rest are reused buffers.
  void EncodeText(std::string_view text, tok::BpeScratch* scratch,
                  std::vector<std::string_view>* pieces, std::string* buffer,
                  std::vector<int32_t>* ids, std::vector<int32_t>* out) const;
  // Length of the longest special token that starts at text[pos], and its id; 0 if none.
  size_t MatchSpecial(std::string_view text, size_t pos, bool parse_special, int32_t* id) const;

  TokenizerKind kind_ = TokenizerKind::kByteLevelBpe;
  std::vector<std::string> tokens_;
  std::vector<TokenType> types_;
  std::vector<float> scores_;
  std::vector<uint8_t> mergeable_;
  std::vector<std::string> decoded_;  // per id: what Decode emits
  tok::PieceIndex token_to_id_;       // over tokens_
  int32_t bos_id_ = -1, eos_id_ = -1, unk_id_ = -1;
  bool add_bos_ = false;
  size_t max_token_bytes_ = 4;
  std::array<bool, 256> byte_kept_{};  // a byte the encoding does not drop
  bool add_space_prefix_ = false;
  bool ignore_merges_ = false;  // Llama 3: a word that is itself a token skips the merges
  std::vector<int32_t> end_of_generation_;
  // Byte-level: token id of each byte's one-character piece; SentencePiece: the <0xXX> tokens.
  std::array<int32_t, 256> byte_token_{};
  std::array<std::string, 256> byte_piece_;  // byte-level: each byte's mapped UTF-8 character
  tok::MergeTable merges_;
  std::unique_ptr<Pretokenizer> pretokenizer_;
  // Special tokens to match in text, bucketed by first byte, longest first.
  std::array<std::vector<int32_t>, 256> specials_by_first_byte_;
};

// Streaming detokenisation: Push returns the text that is final after one more token, holding
// back a trailing incomplete UTF-8 sequence; Flush returns what is held. The concatenation of
// every Push and the Flush equals Decode of all the ids.
class StreamingDecoder {
 public:
  // continuation: the ids continue text already decoded elsewhere, so the first is not the
  // text's start (no leading space stripped).
  explicit StreamingDecoder(const Tokenizer& tokenizer, bool continuation = false)
      : tokenizer_(&tokenizer), at_start_(!continuation) {}
  std::string Push(int32_t id);
  std::string Flush();
  bool holding() const { return !pending_.empty(); }  // bytes held for an incomplete character

 private:
  const Tokenizer* tokenizer_;
  std::string pending_;
  bool at_start_ = true;  // nothing emitted yet (SentencePiece strips one leading space)
};

}  // namespace tripod
