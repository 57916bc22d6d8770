// A regular-expression parser for structured outputs: the common subset of Python's `re` syntax,
// read as a pattern the whole output must match (re.fullmatch), over Unicode code points that
// the automaton later spells as UTF-8 bytes.
//
// Hand-written: Debian packages no C++ library that turns a regex into a byte-level DFA a
// token mask can walk (RE2 and PCRE2 match text; they expose no automaton).
//
// Accepted: literals (UTF-8), `.` (any code point but \n), classes `[...]` / `[^...]` with
// ranges and escapes, \d \w \s \D \W \S with ASCII meanings (as re.ASCII), \n \t \r \f \v \a,
// \xHH \uHHHH \UHHHHHHHH, escaped punctuation; quantifiers * + ? {m} {m,} {,n} {m,n} and their
// lazy forms (the same language); alternation; groups (...) (?:...) (?P<name>...); `^` as the
// first and `$` as the last character (fullmatch anchors them anyway).
// Refused with a message naming the feature: backreferences, lookaround, \b \B \A \Z, inline
// flags, possessive quantifiers, anchors elsewhere, repetition counts over kMaxRepeat.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace tripod::structured {

inline constexpr int kMaxRepeat = 1000;  // the largest m or n of {m,n}
inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;

struct RegexNode {
  enum class Kind : uint8_t { kEmpty, kClass, kConcat, kAlternate, kRepeat };
  Kind kind = Kind::kEmpty;
  // kClass: sorted, disjoint, non-adjacent code point ranges (inclusive); surrogates excluded.
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
  std::vector<RegexNode> children;  // kConcat, kAlternate; kRepeat: exactly one
  int min = 0;
  int max = -1;  // kRepeat: -1 = unbounded
};

// InvalidArgument for a malformed pattern, Unimplemented for a feature outside the subset; the
// message says which and where.
absl::StatusOr<RegexNode> ParseRegex(std::string_view pattern);

// Escapes text so that it matches itself literally (for enum and const values).
std::string RegexEscape(std::string_view text);

}  // namespace tripod::structured
