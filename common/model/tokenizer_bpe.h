// The merge loops of the two BPE flavours (byte-level by merge rank, SentencePiece by piece
// score), GPT-2's byte <-> code point map and small UTF-8 helpers. Internal to the tokenizer.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
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

// Byte-level BPE merges: (left id, right id) -> (rank, merged id). Open addressing over flat
// arrays: the lookups are the hot loop of encoding, and node-based maps miss the cache there.
class MergeTable {
 public:
  struct Entry {
    uint64_t key = kEmpty;
    int32_t rank = 0;
    int32_t merged = 0;
  };
  void Reserve(size_t n);
  // Keeps the first rank given to a pair (duplicates in the list are ignored).
  void Add(int32_t left, int32_t right, int32_t rank, int32_t merged);
  const Entry* Find(int32_t left, int32_t right) const {
    // Negative ids (bytes without a token) never merge; (-1, -1) would also hit kEmpty.
    if (slots_.empty() || left < 0 || right < 0) return nullptr;
    const uint64_t key = Key(left, right);
    for (size_t i = Hash(key);; i = (i + 1) & mask_) {
      const Entry& e = slots_[i];
      if (e.key == key) return &e;
      if (e.key == kEmpty) return nullptr;
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static uint64_t Key(int32_t l, int32_t r) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(r);
  }
  size_t Hash(uint64_t key) const { return (key * 0x9E3779B97F4A7C15ull) >> shift_; }
  std::vector<Entry> slots_;
  size_t mask_ = 0;
  int shift_ = 64;
  size_t size_ = 0;
};

// Piece text -> id over strings the caller keeps alive (the vocabulary), open addressing.
class PieceIndex {
 public:
  // First occurrence wins for duplicate pieces.
  void Build(const std::vector<std::string>& pieces);
  int32_t Find(std::string_view piece) const {
    if (slots_.empty()) return -1;
    const uint64_t h = std::hash<std::string_view>()(piece);
    const auto tag = static_cast<uint32_t>(h >> 32);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.id < 0) return -1;
      if (s.tag == tag && (*pieces_)[s.id] == piece) return s.id;
    }
  }

 private:
  struct Slot {
    int32_t id = -1;
    uint32_t tag = 0;
  };
  const std::vector<std::string>* pieces_ = nullptr;
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

// Reused buffers so that encoding a long text does not allocate per word.
struct BpeScratch {
  struct Symbol {
    int32_t id;  // byte-level: token id; SentencePiece: unused
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
  const PieceIndex* ids;
  std::span<const float> scores;
  std::span<const uint8_t> mergeable;  // per id: may a merge produce this piece
};
void MergeByScore(const SpmVocabView& vocab, std::string_view text, BpeScratch* scratch,
                  std::vector<std::string_view>* out);

}  // namespace tripod::tok
