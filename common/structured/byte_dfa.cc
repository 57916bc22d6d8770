// ByteDfa: regex -> Thompson NFA over UTF-8 byte ranges -> subset construction; see byte_dfa.h.
#include "common/structured/byte_dfa.h"

#include <algorithm>
#include <chrono>
#include <deque>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tripod::structured {
namespace {

// A sequence of byte ranges that together spell the code points of one range of one UTF-8
// length: [lo0..hi0][lo1..hi1]...
using ByteSeq = std::vector<std::pair<uint8_t, uint8_t>>;

int Utf8Encode(uint32_t cp, uint8_t* out) {
  if (cp < 0x80) {
    out[0] = static_cast<uint8_t>(cp);
    return 1;
  }
  if (cp < 0x800) {
    out[0] = static_cast<uint8_t>(0xC0 | (cp >> 6));
    out[1] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = static_cast<uint8_t>(0xE0 | (cp >> 12));
    out[1] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
    out[2] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    return 3;
  }
  out[0] = static_cast<uint8_t>(0xF0 | (cp >> 18));
  out[1] = static_cast<uint8_t>(0x80 | ((cp >> 12) & 0x3F));
  out[2] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
  out[3] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
  return 4;
}

// Splits [lo, hi] until each piece's encodings differ only in ranges of whole trailing bytes:
// then the piece is the product of per-byte ranges, one ByteSeq.
void Utf8Sequences(uint32_t lo, uint32_t hi, std::vector<ByteSeq>* out) {
  if (lo > hi) return;
  for (uint32_t edge : {0x7Fu, 0x7FFu, 0xFFFFu}) {  // the last code point of each length
    if (lo <= edge && hi > edge) {
      Utf8Sequences(lo, edge, out);
      Utf8Sequences(edge + 1, hi, out);
      return;
    }
  }
  if (hi < 0x80) {
    out->push_back({{static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)}});
    return;
  }
  for (int i = 1; i < 4; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;  // the low i continuation bytes' payload
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        Utf8Sequences(lo, lo | m, out);
        Utf8Sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        Utf8Sequences(lo, (hi & ~m) - 1, out);
        Utf8Sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  uint8_t a[4], b[4];
  const int n = Utf8Encode(lo, a);
  Utf8Encode(hi, b);
  ByteSeq seq;
  for (int i = 0; i < n; ++i) seq.push_back({a[i], b[i]});
  out->push_back(std::move(seq));
}

struct NfaState {
  enum class Kind : uint8_t { kByte, kEpsilon, kMatch };
  Kind kind = Kind::kEpsilon;
  uint8_t lo = 0, hi = 0;  // kByte
  int32_t out = -1;
  int32_t out2 = -1;  // kEpsilon only
};

struct Fragment {
  int32_t start;
  int32_t end;  // a kEpsilon state whose out is still unset
};

// ASSIGN_OR_RETURN for StatusOr<int32_t> inside functions returning StatusOr<Fragment>.
#define ASSIGN_OR_RETURN_STATE(var, expr) \
  int32_t var;                            \
  {                                       \
    absl::StatusOr<int32_t> r_ = (expr);  \
    if (!r_.ok()) return r_.status();     \
    var = *r_;                            \
  }

class NfaBuilder {
 public:
  explicit NfaBuilder(int max_states) : max_states_(max_states) {}

  absl::StatusOr<Fragment> Build(const RegexNode& n) {
    switch (n.kind) {
      case RegexNode::Kind::kEmpty: {
        ASSIGN_OR_RETURN_STATE(s, Add({}));
        return Fragment{s, s};
      }
      case RegexNode::Kind::kClass:
        return Class(n.ranges);
      case RegexNode::Kind::kConcat: {
        absl::StatusOr<Fragment> first = Build(n.children[0]);
        if (!first.ok()) return first;
        Fragment f = *first;
        for (size_t i = 1; i < n.children.size(); ++i) {
          absl::StatusOr<Fragment> c = Build(n.children[i]);
          if (!c.ok()) return c;
          states_[f.end].out = c->start;
          f.end = c->end;
        }
        return f;
      }
      case RegexNode::Kind::kAlternate: {
        ASSIGN_OR_RETURN_STATE(end, Add({}));
        int32_t start = -1, last_split = -1;
        for (const RegexNode& child : n.children) {
          absl::StatusOr<Fragment> c = Build(child);
          if (!c.ok()) return c;
          states_[c->end].out = end;
          ASSIGN_OR_RETURN_STATE(split, Add({}));
          states_[split].out = c->start;
          if (start < 0) start = split;
          if (last_split >= 0) states_[last_split].out2 = split;
          last_split = split;
        }
        return Fragment{start, end};
      }
      case RegexNode::Kind::kRepeat:
        return Repeat(n);
    }
    return absl::InternalError("unknown regex node");
  }

  absl::StatusOr<int32_t> Add(NfaState s) {
    if (static_cast<int>(states_.size()) >= max_states_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the pattern is too large: its automaton passes ", max_states_, " NFA states"));
    }
    states_.push_back(s);
    return static_cast<int32_t>(states_.size() - 1);
  }

  std::vector<NfaState>& states() { return states_; }

 private:
  absl::StatusOr<Fragment> Class(const std::vector<std::pair<uint32_t, uint32_t>>& ranges) {
    ASSIGN_OR_RETURN_STATE(end, Add({}));
    std::vector<ByteSeq> seqs;
    for (auto [lo, hi] : ranges) Utf8Sequences(lo, hi, &seqs);
    if (seqs.empty()) {  // an empty class matches nothing: a start with no way out
      ASSIGN_OR_RETURN_STATE(stuck, Add({}));
      return Fragment{stuck, end};
    }
    int32_t start = -1, last_split = -1;
    for (const ByteSeq& seq : seqs) {
      int32_t next = end;
      for (size_t i = seq.size(); i-- > 0;) {
        NfaState b;
        b.kind = NfaState::Kind::kByte;
        b.lo = seq[i].first;
        b.hi = seq[i].second;
        b.out = next;
        ASSIGN_OR_RETURN_STATE(id, Add(b));
        next = id;
      }
      ASSIGN_OR_RETURN_STATE(split, Add({}));
      states_[split].out = next;
      if (start < 0) start = split;
      if (last_split >= 0) states_[last_split].out2 = split;
      last_split = split;
    }
    return Fragment{start, end};
  }

  absl::StatusOr<Fragment> Repeat(const RegexNode& n) {
    const RegexNode& child = n.children[0];
    ASSIGN_OR_RETURN_STATE(start, Add({}));
    Fragment f{start, start};
    for (int i = 0; i < n.min; ++i) {
      absl::StatusOr<Fragment> c = Build(child);
      if (!c.ok()) return c;
      states_[f.end].out = c->start;
      f.end = c->end;
    }
    if (n.max < 0) {
      ASSIGN_OR_RETURN_STATE(loop, Add({}));
      ASSIGN_OR_RETURN_STATE(exit, Add({}));
      absl::StatusOr<Fragment> c = Build(child);
      if (!c.ok()) return c;
      states_[f.end].out = loop;
      states_[loop].out = c->start;
      states_[loop].out2 = exit;
      states_[c->end].out = loop;
      f.end = exit;
      return f;
    }
    if (n.max > n.min) {
      ASSIGN_OR_RETURN_STATE(exit, Add({}));
      for (int i = n.min; i < n.max; ++i) {
        ASSIGN_OR_RETURN_STATE(split, Add({}));
        absl::StatusOr<Fragment> c = Build(child);
        if (!c.ok()) return c;
        states_[f.end].out = split;
        states_[split].out = c->start;
        states_[split].out2 = exit;
        f.end = c->end;
      }
      states_[f.end].out = exit;
      f.end = exit;
    }
    return f;
  }
#undef ASSIGN_OR_RETURN_STATE

  int max_states_;
  std::vector<NfaState> states_;
};

// The subset construction over the built NFA.
class SubsetBuilder {
 public:
  SubsetBuilder(const std::vector<NfaState>& nfa, const DfaLimits& limits)
      : nfa_(nfa), limits_(limits), mark_(nfa.size(), 0) {}

  absl::StatusOr<ByteDfa> Run(int32_t nfa_start) {
    const auto t0 = std::chrono::steady_clock::now();
    ClassifyBytes();
    std::vector<int32_t> set;
    Closure({nfa_start}, &set);
    dfa_.start = Intern(std::move(set));
    std::vector<int32_t> moved;
    for (size_t s = 0; s < sets_.size(); ++s) {
      // Checked at every state: one state's classes can cost a closure over the whole NFA each.
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() >
          limits_.max_seconds) {
        return absl::ResourceExhaustedError(
            absl::StrCat("the pattern is too complex: its automaton took over ",
                         limits_.max_seconds, " s to build"));
      }
      for (int c = 0; c < dfa_.num_classes; ++c) {
        const uint8_t b = representative_[c];
        moved.clear();
        for (int32_t q : sets_[s]) {
          const NfaState& st = nfa_[q];
          if (st.kind == NfaState::Kind::kByte && st.lo <= b && b <= st.hi) moved.push_back(st.out);
        }
        int32_t target = ByteDfa::kDead;
        if (!moved.empty()) {
          std::vector<int32_t> closed;
          Closure(moved, &closed);
          if (!closed.empty()) target = Intern(std::move(closed));
        }
        if (static_cast<int>(sets_.size()) > limits_.max_dfa_states) {
          return absl::ResourceExhaustedError(
              absl::StrCat("the pattern is too large: its automaton passes ",
                           limits_.max_dfa_states, " DFA states"));
        }
        dfa_.next[s * dfa_.num_classes + c] = target;
      }
    }
    PruneHopeless();
    return std::move(dfa_);
  }

 private:
  void ClassifyBytes() {
    std::array<bool, 257> edge{};
    edge[0] = true;
    for (const NfaState& s : nfa_) {
      if (s.kind != NfaState::Kind::kByte) continue;
      edge[s.lo] = true;
      edge[s.hi + 1] = true;
    }
    int c = -1;
    for (int b = 0; b < 256; ++b) {
      if (edge[b]) {
        ++c;
        representative_.push_back(static_cast<uint8_t>(b));
      }
      dfa_.byte_class[b] = static_cast<uint8_t>(c);
    }
    dfa_.num_classes = c + 1;
  }

  // The byte and match states reachable from `from` through epsilons, sorted.
  void Closure(const std::vector<int32_t>& from, std::vector<int32_t>* out) {
    ++epoch_;
    stack_.assign(from.begin(), from.end());
    out->clear();
    while (!stack_.empty()) {
      const int32_t q = stack_.back();
      stack_.pop_back();
      if (q < 0 || mark_[q] == epoch_) continue;
      mark_[q] = epoch_;
      const NfaState& s = nfa_[q];
      if (s.kind == NfaState::Kind::kEpsilon) {
        if (s.out < 0 && s.out2 < 0) continue;  // a dead end (an empty class)
        stack_.push_back(s.out2);
        stack_.push_back(s.out);
      } else {
        out->push_back(q);
      }
    }
    std::sort(out->begin(), out->end());
  }

  int32_t Intern(std::vector<int32_t> set) {
    auto [it, inserted] = ids_.try_emplace(set, static_cast<int32_t>(sets_.size()));
    if (inserted) {
      bool match = false;
      for (int32_t q : set) match |= nfa_[q].kind == NfaState::Kind::kMatch;
      sets_.push_back(std::move(set));
      dfa_.accepting.push_back(match ? 1 : 0);
      dfa_.next.resize(sets_.size() * dfa_.num_classes, ByteDfa::kDead);
    }
    return it->second;
  }

  // States from which no accepting state can be reached become the dead state, so that a walk
  // is dead as soon as the output can no longer complete.
  void PruneHopeless() {
    const int n = static_cast<int>(sets_.size());
    const int k = dfa_.num_classes;
    std::vector<std::vector<int32_t>> preds(n);
    for (int s = 0; s < n; ++s) {
      for (int c = 0; c < k; ++c) {
        const int32_t t = dfa_.next[s * k + c];
        if (t >= 0) preds[t].push_back(s);
      }
    }
    std::vector<uint8_t> alive(n, 0);
    std::deque<int32_t> queue;
    for (int s = 0; s < n; ++s) {
      if (dfa_.accepting[s]) {
        alive[s] = 1;
        queue.push_back(s);
      }
    }
    while (!queue.empty()) {
      const int32_t s = queue.front();
      queue.pop_front();
      for (int32_t p : preds[s]) {
        if (!alive[p]) {
          alive[p] = 1;
          queue.push_back(p);
        }
      }
    }
    for (int32_t& t : dfa_.next) {
      if (t >= 0 && !alive[t]) t = ByteDfa::kDead;
    }
    if (!alive[dfa_.start]) dfa_.start = ByteDfa::kDead;
  }

  const std::vector<NfaState>& nfa_;
  DfaLimits limits_;
  ByteDfa dfa_;
  std::vector<uint8_t> representative_;  // per class: its first byte
  std::vector<std::vector<int32_t>> sets_;
  absl::flat_hash_map<std::vector<int32_t>, int32_t> ids_;
  std::vector<uint32_t> mark_;
  uint32_t epoch_ = 0;
  std::vector<int32_t> stack_;
};

}  // namespace

int32_t ByteDfa::Walk(int32_t state, std::string_view bytes) const {
  for (char c : bytes) {
    if (state < 0) return kDead;
    state = Step(state, static_cast<uint8_t>(c));
  }
  return state;
}

bool ByteDfa::FullMatch(std::string_view text) const {
  const int32_t s = Walk(start, text);
  return s >= 0 && accepting[s];
}

absl::StatusOr<ByteDfa> CompileDfa(const RegexNode& regex, const DfaLimits& limits) {
  NfaBuilder nfa(limits.max_nfa_states);
  absl::StatusOr<Fragment> f = nfa.Build(regex);
  if (!f.ok()) return f.status();
  NfaState match;
  match.kind = NfaState::Kind::kMatch;
  absl::StatusOr<int32_t> m = nfa.Add(match);
  if (!m.ok()) return m.status();
  nfa.states()[f->end].out = *m;
  return SubsetBuilder(nfa.states(), limits).Run(f->start);
}

absl::StatusOr<ByteDfa> CompileRegex(std::string_view pattern, const DfaLimits& limits) {
  absl::StatusOr<RegexNode> n = ParseRegex(pattern);
  if (!n.ok()) return n.status();
  return CompileDfa(*n, limits);
}

}  // namespace tripod::structured
