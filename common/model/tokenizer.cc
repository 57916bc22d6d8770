// Tokenizer: reads the vocabulary out of GGUF metadata, splits special tokens out of the text,
// runs the pre-tokenizer and the merges, and maps ids back to bytes.
#include "common/model/tokenizer.h"

#include <algorithm>
#include <cstdio>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"

namespace tripod {
namespace {

constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// Texts of control tokens that end a turn in the model families we serve.
constexpr std::string_view kEndOfGenerationTexts[] = {
    "<|eot_id|>",    "<|eom_id|>",      "<|im_end|>", "<|end|>",         "<end_of_turn>",
    "<|endoftext|>", "<|end_of_text|>", "<EOT>",      "<|end_of_turn|>",
};

bool IsByteLevelPreLlama3(std::string_view pre) {
  return pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3";
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// "<0xAB>" -> 0xAB; -1 for anything else.
int ParseByteToken(std::string_view text) {
  if (text.size() != 6 || !text.starts_with("<0x") || text[5] != '>') return -1;
  const int hi = HexDigit(text[3]), lo = HexDigit(text[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

absl::Status CheckId(std::string_view what, int32_t id, size_t n) {
  if (id < -1 || id >= static_cast<int64_t>(n)) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer: ", std::string(what), " id ", id,
                                                   " is outside the vocabulary of ", n));
  }
  return absl::OkStatus();
}

// Optional integer key: -1 when absent, an error when present but unusable.
absl::StatusOr<int32_t> OptionalId(const GgufFile& gguf, const std::string& key) {
  if (gguf.Find(key) == nullptr) return -1;
  ASSIGN_OR_RETURN(int64_t v, gguf.GetInt(key));
  if (v < -1 || v > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer: ", key, " = ", v, " is not an id"));
  }
  return static_cast<int32_t>(v);
}

absl::StatusOr<std::optional<bool>> OptionalBool(const GgufFile& gguf, const std::string& key) {
  if (gguf.Find(key) == nullptr) return std::optional<bool>();
  ASSIGN_OR_RETURN(bool v, gguf.GetBool(key));
  return std::optional<bool>(v);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const GgufFile& gguf) {
  TokenizerVocab v;
  ASSIGN_OR_RETURN(v.model, gguf.GetString("tokenizer.ggml.model"));
  if (gguf.Find("tokenizer.ggml.pre") != nullptr) {
    ASSIGN_OR_RETURN(v.pre, gguf.GetString("tokenizer.ggml.pre"));
  }
  ASSIGN_OR_RETURN(const std::vector<std::string>* tokens,
                   gguf.GetStringArray("tokenizer.ggml.tokens"));
  v.tokens = *tokens;
  if (gguf.Find("tokenizer.ggml.token_type") != nullptr) {
    ASSIGN_OR_RETURN(std::vector<int64_t> types, gguf.GetIntArray("tokenizer.ggml.token_type"));
    v.token_types.reserve(types.size());
    for (int64_t t : types) v.token_types.push_back(static_cast<int32_t>(t));
  }
  if (gguf.Find("tokenizer.ggml.scores") != nullptr) {
    ASSIGN_OR_RETURN(std::vector<double> scores, gguf.GetFloatArray("tokenizer.ggml.scores"));
    v.scores.assign(scores.begin(), scores.end());
  }
  if (gguf.Find("tokenizer.ggml.merges") != nullptr) {
    ASSIGN_OR_RETURN(const std::vector<std::string>* merges,
                     gguf.GetStringArray("tokenizer.ggml.merges"));
    v.merges = *merges;
  }
  ASSIGN_OR_RETURN(v.bos_id, OptionalId(gguf, "tokenizer.ggml.bos_token_id"));
  ASSIGN_OR_RETURN(v.eos_id, OptionalId(gguf, "tokenizer.ggml.eos_token_id"));
  ASSIGN_OR_RETURN(v.unk_id, OptionalId(gguf, "tokenizer.ggml.unknown_token_id"));
  ASSIGN_OR_RETURN(v.eot_id, OptionalId(gguf, "tokenizer.ggml.eot_token_id"));
  ASSIGN_OR_RETURN(v.eom_id, OptionalId(gguf, "tokenizer.ggml.eom_token_id"));
  ASSIGN_OR_RETURN(v.add_bos, OptionalBool(gguf, "tokenizer.ggml.add_bos_token"));
  ASSIGN_OR_RETURN(v.add_space_prefix, OptionalBool(gguf, "tokenizer.ggml.add_space_prefix"));
  return FromVocab(std::move(v));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromVocab(TokenizerVocab vocab) {
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  RETURN_IF_ERROR(t->Init(std::move(vocab)));
  return t;
}

absl::Status Tokenizer::Init(TokenizerVocab v) {
  if (v.model == "gpt2") {
    kind_ = TokenizerKind::kByteLevelBpe;
  } else if (v.model == "llama") {
    kind_ = TokenizerKind::kSentencePieceBpe;
  } else {
    return absl::UnimplementedError(absl::StrCat("tokenizer: unsupported tokenizer.ggml.model '",
                                                 v.model, "' (supported: gpt2, llama)"));
  }
  const size_t n = v.tokens.size();
  if (n == 0 || n > static_cast<size_t>(INT32_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer: bad vocabulary size ", n));
  }
  if (!v.token_types.empty() && v.token_types.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer: ", v.token_types.size(), " token types for ", n, " tokens"));
  }
  if (!v.scores.empty() && v.scores.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer: ", v.scores.size(), " scores for ", n, " tokens"));
  }
  RETURN_IF_ERROR(CheckId("bos", v.bos_id, n));
  RETURN_IF_ERROR(CheckId("eos", v.eos_id, n));
  RETURN_IF_ERROR(CheckId("unknown", v.unk_id, n));
  RETURN_IF_ERROR(CheckId("eot", v.eot_id, n));
  RETURN_IF_ERROR(CheckId("eom", v.eom_id, n));

  tokens_ = std::move(v.tokens);
  types_.resize(n, TokenType::kNormal);
  for (size_t i = 0; i < v.token_types.size(); ++i) {
    const int32_t t = v.token_types[i];
    types_[i] = (t >= 0 && t <= 6) ? static_cast<TokenType>(t) : TokenType::kNormal;
  }
  scores_ = v.scores.empty() ? std::vector<float>(n, 0.0f) : std::move(v.scores);
  token_to_id_.Build(tokens_);
  mergeable_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const TokenType t = types_[i];
    mergeable_[i] =
        t == TokenType::kNormal || t == TokenType::kUserDefined || t == TokenType::kUndefined;
  }
  bos_id_ = v.bos_id;
  eos_id_ = v.eos_id;
  unk_id_ = v.unk_id;
  byte_token_.fill(-1);

  if (kind_ == TokenizerKind::kByteLevelBpe) {
    if (v.pre.empty()) {
      return absl::InvalidArgumentError(
          "tokenizer: byte-level BPE vocabulary without tokenizer.ggml.pre (pre-tokenizer name)");
    }
    ASSIGN_OR_RETURN(pretokenizer_, Pretokenizer::ForName(v.pre));
    ignore_merges_ = IsByteLevelPreLlama3(v.pre);
    add_bos_ = v.add_bos.value_or(IsByteLevelPreLlama3(v.pre));
    add_space_prefix_ = false;
    const auto& b2c = tok::ByteToCodepoint();
    for (int b = 0; b < 256; ++b) {
      tok::AppendUtf8(b2c[b], &byte_piece_[b]);
      byte_token_[b] = token_to_id_.Find(byte_piece_[b]);
    }
    if (v.merges.empty()) {
      return absl::InvalidArgumentError("tokenizer: byte-level BPE without tokenizer.ggml.merges");
    }
    merges_.Reserve(v.merges.size());
    std::string joined;
    for (size_t rank = 0; rank < v.merges.size(); ++rank) {
      const std::string& m = v.merges[rank];
      // Pieces never hold a plain space (GPT-2 maps it to U+0120), so the first one separates.
      const size_t sp = m.find(' ', 1);
      if (sp == std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat("tokenizer: merge ", rank, " '", m, "' is not 'left right'"));
      }
      const std::string_view left(m.data(), sp), right(m.data() + sp + 1, m.size() - sp - 1);
      const int32_t l = token_to_id_.Find(left), r = token_to_id_.Find(right);
      joined.assign(left).append(right);
      const int32_t j = token_to_id_.Find(joined);
      // A merge whose parts or result are not tokens can never fire; skip it.
      if (l < 0 || r < 0 || j < 0) continue;
      merges_.Add(l, r, static_cast<int32_t>(rank), j);
    }
  } else {
    add_bos_ = v.add_bos.value_or(true);
    add_space_prefix_ = v.add_space_prefix.value_or(true);
    char name[8];
    for (int b = 0; b < 256; ++b) {
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      byte_token_[b] = token_to_id_.Find(name);
    }
  }

  // What each id decodes to.
  decoded_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string& text = tokens_[i];
    const TokenType type = types_[i];
    std::string& out = decoded_[i];
    if (type == TokenType::kControl || type == TokenType::kUnknown) {
      out = text;
    } else if (kind_ == TokenizerKind::kByteLevelBpe) {
      if (type == TokenType::kUserDefined) {
        out = text;  // added tokens are stored as plain text, not byte-mapped
        continue;
      }
      for (size_t p = 0; p < text.size();) {
        uint32_t cp;
        p += tok::NextUtf8(text, p, &cp);
        const int b = tok::CodepointToByte(cp);
        if (b < 0) {  // not a byte-mapped piece after all: keep it as written
          out = text;
          break;
        }
        out.push_back(static_cast<char>(b));
      }
    } else if (int byte = ParseByteToken(text); type == TokenType::kByte && byte >= 0) {
      out.push_back(static_cast<char>(byte));
    } else {
      for (size_t p = 0; p < text.size();) {
        if (text.compare(p, kSpaceMarker.size(), kSpaceMarker) == 0) {
          out.push_back(' ');
          p += kSpaceMarker.size();
        } else {
          out.push_back(text[p++]);
        }
      }
    }
  }

  // The most input bytes one token can stand for: its raw piece is never shorter than the text it
  // covers (byte-mapped characters take 1-2 bytes for one, the space marker 3 for one), nor is
  // what it decodes to; 4 covers an unknown character. A byte without a token is dropped.
  max_token_bytes_ = 4;
  for (size_t i = 0; i < n; ++i) {
    max_token_bytes_ = std::max({max_token_bytes_, tokens_[i].size(), decoded_[i].size()});
  }
  for (int b = 0; b < 256; ++b) {
    byte_kept_[b] =
        byte_token_[b] >= 0 || (kind_ == TokenizerKind::kSentencePieceBpe && unk_id_ >= 0);
  }

  // Tokens matched verbatim in the text before any splitting.
  for (size_t i = 0; i < n; ++i) {
    const TokenType t = types_[i];
    if ((t == TokenType::kControl || t == TokenType::kUserDefined || t == TokenType::kUnknown) &&
        !tokens_[i].empty()) {
      specials_by_first_byte_[static_cast<uint8_t>(tokens_[i][0])].push_back(
          static_cast<int32_t>(i));
    }
  }
  for (auto& bucket : specials_by_first_byte_) {
    std::stable_sort(bucket.begin(), bucket.end(), [this](int32_t a, int32_t b) {
      return tokens_[a].size() > tokens_[b].size();
    });
  }

  for (int32_t id : {v.eos_id, v.eot_id, v.eom_id}) {
    if (id >= 0) end_of_generation_.push_back(id);
  }
  for (std::string_view text : kEndOfGenerationTexts) {
    const int32_t id = token_to_id_.Find(text);
    if (id >= 0 && types_[id] == TokenType::kControl) end_of_generation_.push_back(id);
  }
  std::sort(end_of_generation_.begin(), end_of_generation_.end());
  end_of_generation_.erase(std::unique(end_of_generation_.begin(), end_of_generation_.end()),
                           end_of_generation_.end());
  return absl::OkStatus();
}

size_t Tokenizer::MatchSpecial(std::string_view text, size_t pos, bool parse_special,
                               int32_t* id) const {
  const auto& bucket = specials_by_first_byte_[static_cast<uint8_t>(text[pos])];
  for (int32_t cand : bucket) {
    if (!parse_special && types_[cand] != TokenType::kUserDefined) continue;
    const std::string& piece = tokens_[cand];
    if (text.size() - pos >= piece.size() && text.compare(pos, piece.size(), piece) == 0) {
      *id = cand;
      return piece.size();
    }
  }
  return 0;
}

void Tokenizer::EncodeText(std::string_view text, tok::BpeScratch* scratch,
                           std::vector<std::string_view>* pieces, std::string* buffer,
                           std::vector<int32_t>* ids, std::vector<int32_t>* out) const {
  if (text.empty()) return;
  if (kind_ == TokenizerKind::kByteLevelBpe) {
    pieces->clear();
    pretokenizer_->Split(text, pieces);
    for (std::string_view piece : *pieces) {
      if (ignore_merges_) {
        buffer->clear();
        for (char c : piece) buffer->append(byte_piece_[static_cast<uint8_t>(c)]);
        const int32_t id = token_to_id_.Find(*buffer);
        if (id >= 0) {
          out->push_back(id);
          continue;
        }
      }
      ids->clear();
      for (char c : piece) ids->push_back(byte_token_[static_cast<uint8_t>(c)]);
      const size_t first = out->size();
      tok::MergeByRank(merges_, *ids, scratch, out);
      // A byte the vocabulary has no token for is dropped, as Hugging Face's BPE does without
      // an unknown token (SmolLM2 lacks bytes that never occur in UTF-8 text, like 0xF5..0xFF;
      // its "unknown" id is <|endoftext|>, which must not appear mid-prompt).
      out->erase(std::remove_if(out->begin() + static_cast<ptrdiff_t>(first), out->end(),
                                [](int32_t id) { return id < 0; }),
                 out->end());
    }
    return;
  }
  // SentencePiece: a space in front of every text fragment, spaces as U+2581, then the merges.
  buffer->clear();
  if (add_space_prefix_) buffer->append(kSpaceMarker);
  for (char c : text) {
    if (c == ' ') {
      buffer->append(kSpaceMarker);
    } else {
      buffer->push_back(c);
    }
  }
  pieces->clear();
  const tok::SpmVocabView view{&token_to_id_, scores_, mergeable_};
  tok::MergeByScore(view, *buffer, scratch, pieces);
  for (std::string_view piece : *pieces) {
    const int32_t id = token_to_id_.Find(piece);
    if (id >= 0 && mergeable_[id]) {
      out->push_back(id);
      continue;
    }
    // Byte fallback: a character outside the vocabulary becomes its UTF-8 bytes.
    for (char c : piece) {
      const int32_t id = byte_token_[static_cast<uint8_t>(c)];
      if (id >= 0) {
        out->push_back(id);
      } else if (unk_id_ >= 0) {
        out->push_back(unk_id_);
      }
    }
  }
}

size_t Tokenizer::MinTokens(std::string_view text) const {
  // Every byte that is not dropped lies in some token's span, and no span is longer than
  // max_token_bytes_.
  size_t kept = 0;
  for (char c : text) kept += byte_kept_[static_cast<uint8_t>(c)];
  return (kept + max_token_bytes_ - 1) / max_token_bytes_;
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool parse_special) const {
  const TextSegment segment{text, parse_special};
  return EncodeSegments(std::span<const TextSegment>(&segment, 1));
}

std::vector<int32_t> Tokenizer::EncodeSegments(std::span<const TextSegment> segments) const {
  // One text, so that the pre-tokenizer and merges see across segment boundaries exactly as they
  // would in the joined string; only the special-token matching is per segment.
  std::string joined_storage;
  std::string_view text;
  if (segments.size() == 1) {
    text = segments[0].text;
  } else {
    for (const TextSegment& s : segments) joined_storage.append(s.text);
    text = joined_storage;
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  tok::BpeScratch scratch;
  std::vector<std::string_view> pieces;
  std::string buffer;
  std::vector<int32_t> ids;
  size_t fragment_start = 0;
  size_t seg_begin = 0;
  for (const TextSegment& seg : segments) {
    const size_t seg_end = seg_begin + seg.text.size();
    const std::string_view seg_text = text.substr(0, seg_end);  // matches end in the segment
    for (size_t pos = seg_begin; pos < seg_end;) {
      int32_t id;
      const size_t len = specials_by_first_byte_[static_cast<uint8_t>(text[pos])].empty()
                             ? 0
                             : MatchSpecial(seg_text, pos, seg.parse_special, &id);
      if (len == 0) {
        ++pos;
        continue;
      }
      EncodeText(text.substr(fragment_start, pos - fragment_start), &scratch, &pieces, &buffer,
                 &ids, &out);
      out.push_back(id);
      pos += len;
      fragment_start = pos;
    }
    seg_begin = seg_end;
  }
  EncodeText(text.substr(fragment_start), &scratch, &pieces, &buffer, &ids, &out);
  return out;
}

std::string_view Tokenizer::DecodedPiece(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return decoded_[id];
}

std::string Tokenizer::Decode(std::span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) out.append(DecodedPiece(id));
  // SentencePiece's decoder drops the space that encoding put in front of the text.
  if (strips_leading_space() && !out.empty() && out[0] == ' ') out.erase(0, 1);
  return out;
}

std::string_view Tokenizer::TokenText(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return tokens_[id];
}

TokenType Tokenizer::token_type(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return TokenType::kUndefined;
  return types_[id];
}

bool Tokenizer::IsEndOfGeneration(int32_t id) const {
  return std::binary_search(end_of_generation_.begin(), end_of_generation_.end(), id);
}

std::optional<int32_t> Tokenizer::FindToken(std::string_view piece) const {
  const int32_t id = token_to_id_.Find(piece);
  if (id < 0) return std::nullopt;
  return id;
}

std::string StreamingDecoder::Push(int32_t id) {
  std::string_view piece = tokenizer_->DecodedPiece(id);
  if (piece.empty()) return {};
  if (at_start_) {
    at_start_ = false;
    if (tokenizer_->strips_leading_space() && piece[0] == ' ') piece.remove_prefix(1);
  }
  pending_.append(piece);
  const size_t hold = tok::IncompleteUtf8Tail(pending_);
  std::string ready = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return ready;
}

std::string StreamingDecoder::Flush() {
  std::string rest;
  rest.swap(pending_);
  return rest;
}

}  // namespace tripod
