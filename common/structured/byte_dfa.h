// A deterministic automaton over bytes compiled from a regex (regex_parser.h): Thompson's NFA
// over UTF-8 byte ranges, then the subset construction over byte equivalence classes, with the
// states that can no longer reach a match folded into the dead state. Hand-written (no packaged
// C++ library exposes a DFA to walk; regex_parser.h).
//
// The whole automaton is built at compile time, bounded by DfaLimits (NFA states, DFA states,
// wall time): a pattern too large is refused up front, never found out mid-stream. Once built it
// is immutable and shared by every sequence that uses it.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/structured/regex_parser.h"

namespace tripod::structured {

struct DfaLimits {
  int max_nfa_states = 250000;
  int max_dfa_states = 20000;
  double max_seconds = 2.0;
};

struct ByteDfa {
  static constexpr int32_t kDead = -1;

  int32_t start = 0;  // kDead when the pattern matches nothing at all
  int num_classes = 1;
  std::array<uint8_t, 256> byte_class{};  // byte -> its equivalence class
  std::vector<int32_t> next;              // [state * num_classes + class] -> state or kDead
  std::vector<uint8_t> accepting;         // per state

  int32_t Step(int32_t state, uint8_t byte) const {
    return next[static_cast<size_t>(state) * num_classes + byte_class[byte]];
  }
  // kDead as soon as a byte leads nowhere.
  int32_t Walk(int32_t state, std::string_view bytes) const;
  bool FullMatch(std::string_view text) const;
  int num_states() const { return static_cast<int>(accepting.size()); }
};

// Errors: those of ParseRegex, and ResourceExhausted (the message says which bound) when the
// automaton would pass a limit.
absl::StatusOr<ByteDfa> CompileDfa(const RegexNode& regex, const DfaLimits& limits = {});
absl::StatusOr<ByteDfa> CompileRegex(std::string_view pattern, const DfaLimits& limits = {});

}  // namespace tripod::structured
