// The regex parser: recursive descent over code points; see regex_parser.h.
#include "common/structured/regex_parser.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tripod::structured {
namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

constexpr uint32_t kSurrogateFirst = 0xD800, kSurrogateLast = 0xDFFF;
constexpr int kMaxDepth = 200;  // nested groups: bounds the recursion

// Sorts, merges overlapping and adjacent ranges, and removes the surrogates (UTF-8 has none).
Ranges Normalize(Ranges r) {
  Ranges cut;
  for (auto [lo, hi] : r) {
    if (lo > hi) continue;
    if (lo < kSurrogateFirst && hi > kSurrogateLast) {
      cut.push_back({lo, kSurrogateFirst - 1});
      cut.push_back({kSurrogateLast + 1, hi});
    } else if (lo >= kSurrogateFirst && hi <= kSurrogateLast) {
      continue;
    } else if (lo >= kSurrogateFirst && lo <= kSurrogateLast) {
      cut.push_back({kSurrogateLast + 1, hi});
    } else if (hi >= kSurrogateFirst && hi <= kSurrogateLast) {
      cut.push_back({lo, kSurrogateFirst - 1});
    } else {
      cut.push_back({lo, hi});
    }
  }
  std::sort(cut.begin(), cut.end());
  Ranges out;
  for (auto [lo, hi] : cut) {
    if (!out.empty() && lo <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, hi);
    } else {
      out.push_back({lo, hi});
    }
  }
  return out;
}

Ranges Complement(const Ranges& r) {
  Ranges n = Normalize(r);
  Ranges out;
  uint32_t next = 0;
  for (auto [lo, hi] : n) {
    if (lo > next) out.push_back({next, lo - 1});
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return Normalize(out);
}

RegexNode ClassNode(Ranges r) {
  RegexNode n;
  n.kind = RegexNode::Kind::kClass;
  n.ranges = Normalize(std::move(r));
  return n;
}

const Ranges kDigit = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const Ranges kSpace = {{'\t', '\r'}, {' ', ' '}};  // \t \n \v \f \r and space

class Parser {
 public:
  explicit Parser(std::string_view p) : p_(p) {}

  absl::StatusOr<RegexNode> Parse() {
    if (!p_.empty() && p_.front() == '^') pos_ = 1;
    absl::StatusOr<RegexNode> n = Alternation(0);
    if (!n.ok()) return n;
    if (pos_ < p_.size()) {
      // Only an unmatched ')' stops the top level early.
      return Invalid("unbalanced parenthesis");
    }
    return n;
  }

 private:
  absl::Status Invalid(absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrFormat("invalid regex: %s at position %d", what, pos_));
  }
  absl::Status Unsupported(absl::string_view what) const {
    return absl::UnimplementedError(
        absl::StrFormat("unsupported regex feature: %s at position %d", what, pos_));
  }

  bool AtEnd() const { return pos_ >= p_.size(); }
  char Peek() const { return p_[pos_]; }
  // The pattern's last character is a '$' that anchors the end.
  bool AtFinalDollar() const { return pos_ + 1 == p_.size() && p_[pos_] == '$'; }

  // One UTF-8 code point of the pattern.
  absl::StatusOr<uint32_t> NextCodePoint() {
    const auto b0 = static_cast<unsigned char>(p_[pos_]);
    int len = b0 < 0x80 ? 1 : (b0 >> 5) == 6 ? 2 : (b0 >> 4) == 14 ? 3 : (b0 >> 3) == 30 ? 4 : 0;
    if (len == 0 || pos_ + len > p_.size()) return Invalid("malformed UTF-8");
    uint32_t cp = len == 1 ? b0 : b0 & (0x7F >> len);
    for (int i = 1; i < len; ++i) {
      const auto b = static_cast<unsigned char>(p_[pos_ + i]);
      if ((b & 0xC0) != 0x80) return Invalid("malformed UTF-8");
      cp = (cp << 6) | (b & 0x3F);
    }
    pos_ += len;
    return cp;
  }

  absl::StatusOr<RegexNode> Alternation(int depth) {
    if (depth > kMaxDepth) return Unsupported("groups nested this deep");
    RegexNode alt;
    alt.kind = RegexNode::Kind::kAlternate;
    while (true) {
      absl::StatusOr<RegexNode> c = Concatenation(depth);
      if (!c.ok()) return c;
      alt.children.push_back(*std::move(c));
      if (AtEnd() || Peek() != '|') break;
      ++pos_;
    }
    if (alt.children.size() == 1) return std::move(alt.children[0]);
    return alt;
  }

  absl::StatusOr<RegexNode> Concatenation(int depth) {
    RegexNode cat;
    cat.kind = RegexNode::Kind::kConcat;
    while (!AtEnd() && Peek() != '|' && Peek() != ')') {
      if (AtFinalDollar()) {
        ++pos_;
        break;
      }
      absl::StatusOr<RegexNode> r = Repetition(depth);
      if (!r.ok()) return r;
      cat.children.push_back(*std::move(r));
    }
    if (cat.children.empty()) return RegexNode{};
    if (cat.children.size() == 1) return std::move(cat.children[0]);
    return cat;
  }

  // {m}, {m,}, {,n}, {m,n} at pos_ (on the '{'); false (pos_ unchanged) when it is not one, in
  // which case Python reads the '{' as a literal.
  bool Counted(int* min, int* max, bool* too_large) {
    size_t i = pos_ + 1;
    auto number = [&](int* out) {
      size_t start = i;
      long long v = 0;
      while (i < p_.size() && p_[i] >= '0' && p_[i] <= '9') {
        v = std::min<long long>(v * 10 + (p_[i] - '0'), 1LL << 40);
        ++i;
      }
      if (i == start) return false;
      if (v > kMaxRepeat) *too_large = true;
      *out = static_cast<int>(std::min<long long>(v, kMaxRepeat + 1));
      return true;
    };
    int lo = 0, hi = -1;
    const bool has_lo = number(&lo);
    if (i < p_.size() && p_[i] == '}') {
      if (!has_lo) return false;
      *min = *max = lo;
      pos_ = i + 1;
      return true;
    }
    if (i >= p_.size() || p_[i] != ',') return false;
    ++i;
    const bool has_hi = number(&hi);
    if (i >= p_.size() || p_[i] != '}') return false;
    *min = has_lo ? lo : 0;
    *max = has_hi ? hi : -1;
    pos_ = i + 1;
    return true;
  }

  absl::StatusOr<RegexNode> Repetition(int depth) {
    absl::StatusOr<RegexNode> atom = Atom(depth);
    if (!atom.ok()) return atom;
    RegexNode node = *std::move(atom);
    bool repeated = false;
    while (!AtEnd()) {
      int min = 0, max = -1;
      const char c = Peek();
      if (c == '*') {
        ++pos_;
      } else if (c == '+') {
        min = 1;
        ++pos_;
      } else if (c == '?') {
        max = 1;
        ++pos_;
      } else if (c == '{') {
        bool too_large = false;
        if (!Counted(&min, &max, &too_large)) break;
        if (too_large) {
          return Unsupported(absl::StrCat("a repetition count over ", kMaxRepeat));
        }
        if (max >= 0 && min > max) return Invalid("min repeat greater than max repeat");
      } else {
        break;
      }
      if (repeated) return Invalid("multiple repeat");
      repeated = true;
      if (!AtEnd() && Peek() == '?') {
        ++pos_;  // lazy: the same language
      } else if (!AtEnd() && Peek() == '+') {
        return Unsupported("a possessive quantifier");
      }
      RegexNode rep;
      rep.kind = RegexNode::Kind::kRepeat;
      rep.min = min;
      rep.max = max;
      rep.children.push_back(std::move(node));
      node = std::move(rep);
    }
    return node;
  }

  absl::StatusOr<RegexNode> Group(int depth) {
    ++pos_;  // '('
    if (!AtEnd() && Peek() == '?') {
      ++pos_;
      if (AtEnd()) return Invalid("unexpected end of pattern");
      const char c = Peek();
      if (c == ':') {
        ++pos_;
      } else if (c == 'P' || c == '<') {
        if (c == 'P') ++pos_;
        if (AtEnd()) return Invalid("unexpected end of pattern");
        if (Peek() == '=') return Unsupported("a named backreference");
        if (Peek() != '<') return Invalid("unknown extension");
        if (c == '<' && pos_ + 1 < p_.size() && (p_[pos_ + 1] == '=' || p_[pos_ + 1] == '!')) {
          return Unsupported("a lookbehind assertion");
        }
        const size_t close = p_.find('>', pos_);
        if (close == std::string_view::npos || close == pos_ + 1) {
          return Invalid("bad group name");
        }
        for (size_t i = pos_ + 1; i < close; ++i) {
          const char g = p_[i];
          const bool ok = (g >= 'a' && g <= 'z') || (g >= 'A' && g <= 'Z') || g == '_' ||
                          (i > pos_ + 1 && g >= '0' && g <= '9');
          if (!ok) return Invalid("bad group name");
        }
        pos_ = close + 1;
      } else if (c == '=' || c == '!') {
        return Unsupported("a lookahead assertion");
      } else if (c == '#') {
        return Unsupported("a comment group");
      } else if (c == '(') {
        return Unsupported("a conditional group");
      } else if (c == '>') {
        return Unsupported("an atomic group");
      } else {
        return Unsupported("inline flags");
      }
    }
    absl::StatusOr<RegexNode> inner = Alternation(depth + 1);
    if (!inner.ok()) return inner;
    if (AtEnd() || Peek() != ')') return Invalid("missing ), unterminated subpattern");
    ++pos_;
    return inner;
  }

  // An escape after '\' (pos_ on the character after it). Sets *ranges; in_class allows what
  // only a class may hold (\b is a backspace there).
  absl::Status Escape(bool in_class, Ranges* ranges) {
    if (AtEnd()) return Invalid("bad escape (end of pattern)");
    const char c = Peek();
    auto hex = [&](int digits) -> absl::Status {
      uint32_t v = 0;
      for (int i = 0; i < digits; ++i) {
        if (pos_ + 1 + i >= p_.size()) return Invalid("incomplete escape");
        const char h = p_[pos_ + 1 + i];
        int d = h >= '0' && h <= '9'   ? h - '0'
                : h >= 'a' && h <= 'f' ? h - 'a' + 10
                : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                       : -1;
        if (d < 0) return Invalid("incomplete escape");
        v = v * 16 + static_cast<uint32_t>(d);
      }
      if (v > kMaxCodePoint) return Invalid("bad escape (code point out of range)");
      pos_ += 1 + digits;
      *ranges = {{v, v}};
      return absl::OkStatus();
    };
    auto one = [&](uint32_t v) {
      ++pos_;
      *ranges = {{v, v}};
      return absl::OkStatus();
    };
    // \d \w \s and their complements \D \W \S.
    const Ranges* base = c == 'd' || c == 'D'   ? &kDigit
                         : c == 'w' || c == 'W' ? &kWord
                         : c == 's' || c == 'S' ? &kSpace
                                                : nullptr;
    if (base != nullptr) {
      ++pos_;
      *ranges = c >= 'a' ? *base : Complement(*base);
      return absl::OkStatus();
    }
    constexpr std::string_view kControls = "n\nt\tr\rf\fv\va\a";  // letter, character
    for (size_t i = 0; i < kControls.size(); i += 2) {
      if (kControls[i] == c) return one(static_cast<unsigned char>(kControls[i + 1]));
    }
    switch (c) {
      case 'x':
        return hex(2);
      case 'u':
        return hex(4);
      case 'U':
        return hex(8);
      case 'b':
        if (in_class) return one('\b');
        return Unsupported("a word boundary (\\b)");
      case 'B':
        return Unsupported("\\B");
      case 'A':
      case 'Z':
        return Unsupported("the \\A and \\Z anchors");
      case 'N':
        return Unsupported("named characters (\\N{...})");
      default:
        break;
    }
    if (c >= '0' && c <= '9') return Unsupported("backreferences and octal escapes");
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
      return Invalid(absl::StrCat("bad escape \\", std::string(1, c)));
    }
    absl::StatusOr<uint32_t> cp = NextCodePoint();  // escaped punctuation or any non-letter
    if (!cp.ok()) return cp.status();
    *ranges = {{*cp, *cp}};
    return absl::OkStatus();
  }

  absl::StatusOr<RegexNode> Class() {
    ++pos_;  // '['
    bool negate = false;
    if (!AtEnd() && Peek() == '^') {
      negate = true;
      ++pos_;
    }
    Ranges all;
    bool first = true;
    while (true) {
      if (AtEnd()) return Invalid("unterminated character set");
      if (Peek() == ']' && !first) {
        ++pos_;
        break;
      }
      first = false;
      // One item: a code point, or an escape that may stand for a set.
      auto item = [&](Ranges* r) -> absl::Status {
        if (Peek() == '\\') {
          ++pos_;
          return Escape(/*in_class=*/true, r);
        }
        absl::StatusOr<uint32_t> cp = NextCodePoint();
        if (!cp.ok()) return cp.status();
        *r = {{*cp, *cp}};
        return absl::OkStatus();
      };
      Ranges lo;
      if (absl::Status s = item(&lo); !s.ok()) return s;
      if (pos_ + 1 < p_.size() && Peek() == '-' && p_[pos_ + 1] != ']') {
        ++pos_;
        Ranges hi;
        if (absl::Status s = item(&hi); !s.ok()) return s;
        if (lo.size() != 1 || hi.size() != 1 || lo[0].first != lo[0].second ||
            hi[0].first != hi[0].second) {
          return Invalid("bad character range");
        }
        if (hi[0].first < lo[0].first) return Invalid("bad character range");
        all.push_back({lo[0].first, hi[0].first});
      } else {
        all.insert(all.end(), lo.begin(), lo.end());
      }
    }
    return ClassNode(negate ? Complement(all) : all);
  }

  absl::StatusOr<RegexNode> Atom(int depth) {
    const char c = Peek();
    switch (c) {
      case '(':
        return Group(depth);
      case '[':
        return Class();
      case '.':
        ++pos_;
        return ClassNode(Complement({{'\n', '\n'}}));
      case '^':
        return Unsupported("'^' anywhere but at the start");
      case '$':
        return Unsupported("'$' anywhere but at the end");
      case '*':
      case '+':
      case '?':
        return Invalid("nothing to repeat");
      case '{': {
        int mn, mx;
        bool too_large = false;
        if (Counted(&mn, &mx, &too_large)) return Invalid("nothing to repeat");
        ++pos_;
        return ClassNode({{'{', '{'}});
      }
      case '\\': {
        ++pos_;
        Ranges r;
        if (absl::Status s = Escape(/*in_class=*/false, &r); !s.ok()) return s;
        return ClassNode(std::move(r));
      }
      default: {
        absl::StatusOr<uint32_t> cp = NextCodePoint();
        if (!cp.ok()) return cp.status();
        return ClassNode({{*cp, *cp}});
      }
    }
  }

  std::string_view p_;
  size_t pos_ = 0;
};

}  // namespace

absl::StatusOr<RegexNode> ParseRegex(std::string_view pattern) { return Parser(pattern).Parse(); }

std::string RegexEscape(std::string_view text) {
  std::string out;
  for (char c : text) {
    const bool special =
        std::string_view("\\.^$|?*+()[]{}-/#&~ \t\n\r\v\f").find(c) != std::string_view::npos;
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\v') {
      out += "\\v";
    } else if (c == '\f') {
      out += "\\f";
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\x%02x", static_cast<unsigned char>(c));
    } else {
      if (special) out += '\\';
      out += c;
    }
  }
  return out;
}

}  // namespace tripod::structured
