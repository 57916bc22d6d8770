// The vocabulary trie and the per-state token masks; see token_constraint.h.
#include "common/structured/token_constraint.h"

#include <algorithm>
#include <numeric>

namespace tripod::structured {

std::shared_ptr<const VocabularyTrie> BuildVocabularyTrie(const Tokenizer& tokenizer) {
  auto trie = std::make_shared<VocabularyTrie>();
  const int32_t n = tokenizer.vocab_size();
  trie->vocab_size = n;
  trie->token_bytes.resize(n);
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < n; ++id) {
    if (tokenizer.IsEndOfGeneration(id)) {  // allowed by state, never by text
      trie->end_ids.push_back(id);
      continue;
    }
    const TokenType t = tokenizer.token_type(id);
    if (t == TokenType::kControl || t == TokenType::kUnknown || t == TokenType::kUnused) continue;
    std::string_view piece = tokenizer.DecodedPiece(id);
    if (piece.empty()) continue;
    trie->token_bytes[id] = std::string(piece);
    ids.push_back(id);
  }
  // In byte order, the trie's depth-first order: each token adds the nodes past its common
  // prefix with the previous one.
  std::sort(ids.begin(), ids.end(),
            [&](int32_t a, int32_t b) { return trie->token_bytes[a] < trie->token_bytes[b]; });
  std::vector<int32_t> open;  // the nodes of the previous token's path, by depth - 1
  std::string_view prev;
  std::vector<std::pair<int32_t, int32_t>> node_tokens;  // (node, token)
  for (int32_t id : ids) {
    const std::string& s = trie->token_bytes[id];
    size_t common = 0;
    while (common < prev.size() && common < s.size() && prev[common] == s[common]) ++common;
    // Nodes deeper than the common prefix are closed: their subtrees end here.
    const int32_t next_node = static_cast<int32_t>(trie->byte.size());
    for (size_t d = common; d < open.size(); ++d) trie->subtree_end[open[d]] = next_node;
    open.resize(common);
    for (size_t d = common; d < s.size(); ++d) {
      open.push_back(static_cast<int32_t>(trie->byte.size()));
      trie->byte.push_back(static_cast<uint8_t>(s[d]));
      trie->depth.push_back(static_cast<uint16_t>(std::min<size_t>(d + 1, 65535)));
      trie->subtree_end.push_back(-1);
    }
    node_tokens.push_back({open.back(), id});
    trie->max_depth = std::max(trie->max_depth, s.size());
    prev = s;
  }
  const int32_t total = static_cast<int32_t>(trie->byte.size());
  for (int32_t node : open) trie->subtree_end[node] = total;
  // Tokens by node (CSR); node_tokens is already in node order.
  trie->first_token.assign(total + 1, 0);
  for (auto [node, id] : node_tokens) ++trie->first_token[node + 1];
  std::partial_sum(trie->first_token.begin(), trie->first_token.end(), trie->first_token.begin());
  trie->tokens.reserve(node_tokens.size());
  for (auto [node, id] : node_tokens) trie->tokens.push_back(id);
  return trie;
}

void WalkTrie(const VocabularyTrie& trie, const ByteDfa& dfa, int32_t state, TokenMask* mask) {
  mask->bits.assign((static_cast<size_t>(trie.vocab_size) + 63) / 64, 0);
  mask->allowed = 0;
  if (state < 0) return;
  std::vector<int32_t> at(trie.max_depth + 1);  // the DFA state after each depth's byte
  at[0] = state;
  const int32_t n = static_cast<int32_t>(trie.byte.size());
  const int32_t* next = dfa.next.data();
  const int k = dfa.num_classes;
  int allowed = 0;
  for (int32_t i = 0; i < n;) {
    const int d = trie.depth[i];
    const int32_t s = next[static_cast<size_t>(at[d - 1]) * k + dfa.byte_class[trie.byte[i]]];
    if (s < 0) {
      i = trie.subtree_end[i];
      continue;
    }
    at[d] = s;
    for (int32_t t = trie.first_token[i]; t < trie.first_token[i + 1]; ++t) {
      const int32_t id = trie.tokens[t];
      mask->bits[id / 64] |= uint64_t{1} << (id % 64);
      ++allowed;
    }
    ++i;
  }
  mask->allowed = allowed;
}

absl::StatusOr<std::shared_ptr<TokenConstraint>> TokenConstraint::Compile(
    std::string_view regex, std::shared_ptr<const VocabularyTrie> trie, const DfaLimits& limits) {
  absl::StatusOr<ByteDfa> dfa = CompileRegex(regex, limits);
  if (!dfa.ok()) return dfa.status();
  std::shared_ptr<TokenConstraint> c(new TokenConstraint());
  c->regex_ = std::string(regex);
  c->dfa_ = *std::move(dfa);
  c->trie_ = std::move(trie);
  MutexLock lock(&c->mu_);
  c->masks_.resize(c->dfa_.num_states() + 1);
  return c;
}

int32_t TokenConstraint::Advance(int32_t state, int32_t token) const {
  if (token < 0 || token >= trie_->vocab_size) return ByteDfa::kDead;
  const std::string& bytes = trie_->token_bytes[token];
  if (bytes.empty()) return ByteDfa::kDead;
  return dfa_.Walk(state, bytes);
}

const TokenMask& TokenConstraint::Mask(int32_t state) {
  const size_t slot = state < 0 ? dfa_.num_states() : static_cast<size_t>(state);
  MutexLock lock(&mu_);
  std::unique_ptr<TokenMask>& cached = masks_[slot];
  if (cached != nullptr) return *cached;
  // Computed under the lock: a state's first visit, once per constraint; sequences that need
  // the same state would compute the same mask. Past the cap the mask is computed each time
  // into this thread's scratch (valid until its next call), so memory stays bounded.
  thread_local TokenMask scratch;
  TokenMask* m = &scratch;
  if (cached_masks_ < kMaxCachedMasks) {
    cached = std::make_unique<TokenMask>();
    m = cached.get();
    ++cached_masks_;
  }
  WalkTrie(*trie_, dfa_, state, m);
  const bool ends_only = m->allowed == 0;
  if (ends_only || accepting(state)) {
    for (int32_t id : trie_->end_ids) {
      if (!m->Allows(id)) ++m->allowed;
      m->bits[id / 64] |= uint64_t{1} << (id % 64);
    }
  }
  m->ends_only = ends_only;
  return *m;
}

}  // namespace tripod::structured
