// A structured-output constraint at the level of tokens: a ByteDfa (byte_dfa.h) over the
// model's vocabulary. At each decode step the sequence's DFA state gives the set of tokens whose
// bytes keep the output on a path to a match: a bitmask over the vocabulary, computed once per
// DFA state by walking the vocabulary's byte trie from that state (tokens sharing a prefix share
// the walk; a dead prefix prunes its whole subtree) and cached with the constraint.
//
// The end-of-generation tokens are allowed only in accepting states, and are the only tokens
// allowed where nothing else can continue. Control and other special tokens (no text) are never
// allowed otherwise.
//
// Hand-written, as the regex engine is: no packaged C++ library does this.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/tokenizer.h"
#include "common/structured/byte_dfa.h"
#include "common/util/mutex.h"

namespace tripod::structured {

// The vocabulary as a byte trie laid out in depth-first order, so that a walk is one forward
// pass that skips pruned subtrees: node i spells its parent's bytes plus byte[i].
struct VocabularyTrie {
  int32_t vocab_size = 0;
  std::vector<uint8_t> byte;         // per node
  std::vector<uint16_t> depth;       // per node, 1 = a child of the root
  std::vector<int32_t> subtree_end;  // per node: the first node after its subtree
  std::vector<int32_t> first_token;  // per node + 1 sentinel: tokens ending here, in `tokens`
  std::vector<int32_t> tokens;
  std::vector<std::string> token_bytes;  // per id: the bytes its text adds ("" for specials)
  std::vector<int32_t> end_ids;          // end-of-generation tokens, sorted
  size_t max_depth = 0;
};

// Tokens with text (normal, user-defined, byte tokens); control, unknown and unused tokens are
// left out.
std::shared_ptr<const VocabularyTrie> BuildVocabularyTrie(const Tokenizer& tokenizer);

// The tokens allowed in one DFA state.
struct TokenMask {
  std::vector<uint64_t> bits;  // bit id % 64 of word id / 64
  int allowed = 0;             // how many tokens, the end tokens included
  bool ends_only = false;      // nothing but an end token may follow

  bool Allows(int32_t id) const {
    return id >= 0 && static_cast<size_t>(id) / 64 < bits.size() &&
           ((bits[id / 64] >> (id % 64)) & 1);
  }
};

// The tokens of `trie` that the DFA accepts from `state`, without end tokens.
void WalkTrie(const VocabularyTrie& trie, const ByteDfa& dfa, int32_t state, TokenMask* mask);

// One compiled constraint, shared by every sequence that uses it (thread-safe).
class TokenConstraint {
 public:
  // regex: the pattern the whole output must fullmatch.
  static absl::StatusOr<std::shared_ptr<TokenConstraint>> Compile(
      std::string_view regex, std::shared_ptr<const VocabularyTrie> trie,
      const DfaLimits& limits = {});

  int32_t start() const { return dfa_.start; }
  bool accepting(int32_t state) const { return state >= 0 && dfa_.accepting[state]; }
  // The state after `token`; ByteDfa::kDead if its bytes leave the language (or it is an end
  // token: nothing follows an end).
  int32_t Advance(int32_t state, int32_t token) const;
  // Computed on first use of the state, then cached (up to kMaxCachedMasks states: a mask is
  // vocab/8 bytes, 19 KiB for a 151k vocabulary); the reference stays valid as long as the
  // constraint, or, past the cap, until this thread's next Mask call. A dead state allows the
  // end tokens only.
  const TokenMask& Mask(int32_t state);
  static constexpr int kMaxCachedMasks = 1024;

  const ByteDfa& dfa() const { return dfa_; }
  const VocabularyTrie& trie() const { return *trie_; }
  const std::string& regex() const { return regex_; }

 private:
  TokenConstraint() = default;

  std::string regex_;
  ByteDfa dfa_;
  std::shared_ptr<const VocabularyTrie> trie_;
  Mutex mu_;
  std::vector<std::unique_ptr<TokenMask>> masks_ ABSL_GUARDED_BY(mu_);  // per state, +1: dead
  int cached_masks_ ABSL_GUARDED_BY(mu_) = 0;
};

// Per-sequence progress through a constraint.
struct ConstraintCursor {
  std::shared_ptr<TokenConstraint> constraint;
  int32_t state = ByteDfa::kDead;

  explicit operator bool() const { return constraint != nullptr; }
};

}  // namespace tripod::structured
