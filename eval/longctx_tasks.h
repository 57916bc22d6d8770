// RULER-style long-context tasks (Hsieh et al. 2024, "RULER: What's the Real Context Size of
// Your Long-Context Language Models?") generated from the repository's corpus as the haystack, at
// a target length in tokens, for `tripod eval-longctx`:
//   niah_single     one pass key hidden in the text; recall it
//   niah_multikey   four keys, each with its own number; recall the one asked for
//   niah_multivalue one key with four numbers; recall all of them (score: the share found)
//   vt              variable tracking: a chain of four assignments of one value hidden in the
//                   text; name every variable that holds it (the share named)
//   cwe             common-word extraction: a numbered list of corpus words, ten of them frequent;
//                   name the ten (the share named)
// Each sample is the model's chat template around the context and question, followed by the
// start of the answer (as RULER's answer prefixes), so that greedy decoding continues with the
// answer itself.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/chat_template.h"
#include "common/model/tokenizer.h"

namespace tripod {

// Every task's name, in the order above.
const std::vector<std::string>& LongCtxTaskNames();

struct LongCtxSample {
  std::string task;
  int target_tokens = 0;
  std::vector<int32_t> prompt;       // chat-rendered, then the answer prefix
  std::vector<std::string> answers;  // what the output must contain
  bool recall = false;               // score: share of answers found (else all-or-nothing on one)
  int max_tokens = 16;               // greedy tokens enough for the answer
};

// The corpus tokenized once; samples take their haystack from it.
struct LongCtxCorpus {
  std::vector<int32_t> ids;
  std::vector<std::string> words;  // distinct lowercase words of 4-10 letters, in corpus order
};
LongCtxCorpus MakeLongCtxCorpus(const std::string& text, const Tokenizer& tokenizer);

// Sample `index` of `task` at about `target_tokens` tokens (within 1%, or an error saying why),
// reproducible from (task, target_tokens, index, seed).
absl::StatusOr<LongCtxSample> MakeLongCtxSample(const std::string& task, int target_tokens,
                                                int index, uint64_t seed,
                                                const LongCtxCorpus& corpus,
                                                const Tokenizer& tokenizer,
                                                const ChatTemplate& chat);

// 1 when the output holds the answer (or, for recall tasks, the share of answers it holds);
// case-insensitive.
double ScoreLongCtxOutput(const LongCtxSample& sample, const std::string& output);

}  // namespace tripod
