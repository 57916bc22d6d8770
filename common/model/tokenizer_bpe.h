// The merge loops of the two BPE flavours (byte-level by merge rank, SentencePiece by piece
// score), GPT-2's byte <-> code point map and small UTF-8 helpers. Internal to the tokenizer.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tripod::tok {

// GPT-2's reversible byte -> code point map: printable Latin-1 bytes map to themselves, the
// other 68 bytes to U+0100.. in byte order.
const std::array<uint32_t, 256>& ByteToCodepoint();
// Inverse of ByteToCodepoint; -1 for a code point outside the map.
int CodepointToByte(uint32_t cp);

void AppendUtf8(uint32_t cp, std::string* out);
// Length of the well-formed UTF-8 sequence at s[i] and its code point; an ill-formed or
// truncated sequence counts as one byte with *cp = 0xFFFFFFFF.
size_t NextUtf8(std::string_view s, size_t i, uint32_t* cp);
// Byte count of the trailing sequence that could still become well-formed UTF-8 when more bytes
// arrive (0 when `s` ends on a sequence boundary or on bytes that can never complete).
size_t IncompleteUtf8Tail(std::string_view s);

// Byte-level BPE merges: (left id, right id) -> (rank, merged id).
class MergeTable {
 public:
  void Reserve(size_t n) { map_.reserve(n); }
  // Keeps the first rank given to a pair (duplicates in the list are ignored).
  void Add(int32_t left, int32_t right, int32_t rank, int32_t merged) {
    map_.try_emplace(Key(left, right), rank, merged);
  }
  const std::pair<int32_t, int32_t>* Find(int32_t left, int32_t right) const {
    auto it = map_.find(Key(left, right));
    return it == map_.end() ? nullptr : &it->second;
  }
  size_t size() const { return map_.size(); }

 private:
  static uint64_t Key(int32_t l, int32_t r) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(r);
  }
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> map_;
};

// Reused buffers so that encoding a long text does not allocate per word.
struct BpeScratch {
  struct Symbol {
    int32_t id;        // byte-level: token id; SentencePiece: unused
    int32_t prev, next;
    uint32_t offset, length;  // SentencePiece: bytes of the piece in the escaped text
    bool alive;
  };
  struct RankEntry {
    int32_t rank, pos, merged;
  };
  struct ScoreEntry {
    float score;
    int32_t left, right;
    uint32_t length;
  };
  std::vector<Symbol> symbols;
  std::vector<RankEntry> rank_heap;
  std::vector<ScoreEntry> score_heap;
};

// Byte-level BPE over one pre-token: `initial` holds one id per character (negative ids never
// merge). Repeatedly merges the adjacent pair of lowest rank, the leftmost on ties, exactly as
// Hugging Face's BPE model does. Appends the result to `out`.
void MergeByRank(const MergeTable& merges, std::span<const int32_t> initial, BpeScratch* scratch,
                 std::vector<int32_t>* out);

// SentencePiece BPE over `text` (spaces already escaped to U+2581): starts from UTF-8
// characters and repeatedly merges the adjacent pair whose concatenation is a mergeable piece of
// highest score, the leftmost on ties. Appends the final pieces (views into `text`) to `out`.
struct SpmVocabView {
  const std::unordered_map<std::string_view, int32_t>* ids;
  std::span<const float> scores;
  std::span<const uint8_t> mergeable;  // per id: may a merge produce this piece
};
void MergeByScore(const SpmVocabView& vocab, std::string_view text, BpeScratch* scratch,
                  std::vector<std::string_view>* out);

}  // namespace tripod::tok
