// BPE merge loops: a linked list of symbols plus a binary heap of candidate pairs, so a word of
// n characters costs O(n log n); stale heap entries are detected and skipped when popped.
#include "common/model/tokenizer_bpe.h"

#include <algorithm>

namespace tripod::tok {
namespace {

std::array<uint32_t, 256> MakeByteToCodepoint() {
  std::array<uint32_t, 256> map{};
  uint32_t next_extra = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    map[b] = printable ? static_cast<uint32_t>(b) : next_extra++;
  }
  return map;
}

std::array<int16_t, 512> MakeCodepointToByte() {
  std::array<int16_t, 512> inv;
  inv.fill(-1);
  const auto& fwd = ByteToCodepoint();
  for (int b = 0; b < 256; ++b) inv[fwd[b]] = static_cast<int16_t>(b);
  return inv;
}

// Min-heap on (rank, pos): std heap functions build a max-heap, hence "greater".
bool RankAfter(const BpeScratch::RankEntry& a, const BpeScratch::RankEntry& b) {
  if (a.rank != b.rank) return a.rank > b.rank;
  return a.pos > b.pos;
}

// Max-heap on score, then min on position.
bool ScoreBefore(const BpeScratch::ScoreEntry& a, const BpeScratch::ScoreEntry& b) {
  if (a.score != b.score) return a.score < b.score;
  return a.left > b.left;
}

}  // namespace

const std::array<uint32_t, 256>& ByteToCodepoint() {
  static const std::array<uint32_t, 256> map = MakeByteToCodepoint();
  return map;
}

int CodepointToByte(uint32_t cp) {
  static const std::array<int16_t, 512> inv = MakeCodepointToByte();
  return cp < inv.size() ? inv[cp] : -1;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t NextUtf8(std::string_view s, size_t i, uint32_t* cp) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  *cp = 0xFFFFFFFF;
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  size_t n;
  uint32_t v, min;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2, v = b0 & 0x1F, min = 0x80;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3, v = b0 & 0x0F, min = 0x800;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4, v = b0 & 0x07, min = 0x10000;
  } else {
    return 1;
  }
  if (i + n > s.size()) return 1;
  for (size_t k = 1; k < n; ++k) {
    const auto b = static_cast<uint8_t>(s[i + k]);
    if ((b & 0xC0) != 0x80) return 1;
    v = (v << 6) | (b & 0x3F);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 1;
  *cp = v;
  return n;
}

size_t IncompleteUtf8Tail(std::string_view s) {
  // Look back at most 3 bytes for the lead byte of the last sequence.
  const size_t max_back = std::min<size_t>(3, s.size());
  for (size_t back = 1; back <= max_back; ++back) {
    const auto b = static_cast<uint8_t>(s[s.size() - back]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: keep looking
    size_t need;
    if (b >= 0xC2 && b <= 0xDF) {
      need = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      need = 3;
    } else if (b >= 0xF0 && b <= 0xF4) {
      need = 4;
    } else {
      return 0;  // ASCII or a byte that never starts a sequence
    }
    if (back >= need) return 0;  // complete (or over-long junk, which waiting cannot fix)
    // The bytes so far must be a prefix of some well-formed sequence (second-byte ranges).
    if (back >= 2) {
      const auto b1 = static_cast<uint8_t>(s[s.size() - back + 1]);
      if ((b == 0xE0 && b1 < 0xA0) || (b == 0xED && b1 > 0x9F) || (b == 0xF0 && b1 < 0x90) ||
          (b == 0xF4 && b1 > 0x8F)) {
        return 0;
      }
    }
    return back;
  }
  return 0;
}

void MergeTable::Reserve(size_t n) {
  size_t cap = 16;
  int bits = 4;
  while (cap < 2 * n) cap <<= 1, ++bits;
  slots_.assign(cap, Entry{});
  mask_ = cap - 1;
  shift_ = 64 - bits;
  size_ = 0;
}

void MergeTable::Add(int32_t left, int32_t right, int32_t rank, int32_t merged) {
  if (left < 0 || right < 0) return;
  if (2 * (size_ + 1) > slots_.size()) {
    // Grow and re-insert (only when Reserve was too small).
    std::vector<Entry> old;
    old.swap(slots_);
    Reserve(2 * (size_ + 1));
    for (const Entry& e : old) {
      if (e.key != kEmpty) {
        Add(static_cast<int32_t>(e.key >> 32), static_cast<int32_t>(e.key & 0xFFFFFFFFu), e.rank,
            e.merged);
      }
    }
  }
  const uint64_t key = Key(left, right);
  for (size_t i = Hash(key);; i = (i + 1) & mask_) {
    Entry& e = slots_[i];
    if (e.key == key) return;
    if (e.key == kEmpty) {
      e = {key, rank, merged};
      ++size_;
      return;
    }
  }
}

void PieceIndex::Build(const std::vector<std::string>& pieces) {
  pieces_ = &pieces;
  size_t cap = 16;
  while (cap < 2 * pieces.size()) cap <<= 1;
  slots_.assign(cap, Slot{});
  mask_ = cap - 1;
  for (size_t id = 0; id < pieces.size(); ++id) {
    if (Find(pieces[id]) >= 0) continue;
    const uint64_t h = std::hash<std::string_view>()(pieces[id]);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].id < 0) {
        slots_[i] = {static_cast<int32_t>(id), static_cast<uint32_t>(h >> 32)};
        break;
      }
    }
  }
}

void MergeByRank(const MergeTable& merges, std::span<const int32_t> initial, BpeScratch* scratch,
                 std::vector<int32_t>* out) {
  const int32_t n = static_cast<int32_t>(initial.size());
  if (n == 0) return;
  if (n == 1) {
    out->push_back(initial[0]);
    return;
  }
  auto& sym = scratch->symbols;
  auto& heap = scratch->rank_heap;
  sym.resize(n);
  heap.clear();
  for (int32_t i = 0; i < n; ++i) sym[i] = {initial[i], i - 1, i + 1 < n ? i + 1 : -1, 0, 0, true};
  auto push_pair = [&](int32_t pos) {
    const int32_t next = sym[pos].next;
    if (next < 0) return;
    if (const auto* m = merges.Find(sym[pos].id, sym[next].id)) {
      heap.push_back({m->rank, pos, m->merged});
      std::push_heap(heap.begin(), heap.end(), RankAfter);
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) push_pair(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), RankAfter);
    const BpeScratch::RankEntry top = heap.back();
    heap.pop_back();
    BpeScratch::Symbol& left = sym[top.pos];
    if (!left.alive || left.next < 0) continue;
    BpeScratch::Symbol& right = sym[left.next];
    // Stale if either side has changed since the entry was pushed.
    const auto* m = merges.Find(left.id, right.id);
    if (m == nullptr || m->merged != top.merged) continue;
    left.id = top.merged;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) sym[right.next].prev = top.pos;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(top.pos);
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) out->push_back(sym[i].id);
}

void MergeByScore(const SpmVocabView& vocab, std::string_view text, BpeScratch* scratch,
                  std::vector<std::string_view>* out) {
  if (text.empty()) return;
  auto& sym = scratch->symbols;
  auto& heap = scratch->score_heap;
  sym.clear();
  heap.clear();
  for (size_t i = 0; i < text.size();) {
    uint32_t cp;
    const size_t len = NextUtf8(text, i, &cp);
    const auto idx = static_cast<int32_t>(sym.size());
    sym.push_back({-1, idx - 1, -1, static_cast<uint32_t>(i), static_cast<uint32_t>(len), true});
    if (idx > 0) sym[idx - 1].next = idx;
    i += len;
  }
  auto try_pair = [&](int32_t l) {
    if (l < 0) return;
    const int32_t r = sym[l].next;
    if (r < 0) return;
    const uint32_t len = sym[l].length + sym[r].length;
    const int32_t id = vocab.ids->Find(text.substr(sym[l].offset, len));
    if (id < 0 || static_cast<size_t>(id) >= vocab.scores.size() || !vocab.mergeable[id]) return;
    heap.push_back({vocab.scores[id], l, r, len});
    std::push_heap(heap.begin(), heap.end(), ScoreBefore);
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(sym.size()); ++i) try_pair(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), ScoreBefore);
    const BpeScratch::ScoreEntry top = heap.back();
    heap.pop_back();
    BpeScratch::Symbol& left = sym[top.left];
    BpeScratch::Symbol& right = sym[top.right];
    if (!left.alive || !right.alive || left.next != top.right ||
        left.length + right.length != top.length) {
      continue;
    }
    left.length += right.length;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) sym[right.next].prev = top.left;
    try_pair(left.prev);
    try_pair(top.left);
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next)
    out->push_back(text.substr(sym[i].offset, sym[i].length));
}

}  // namespace tripod::tok
