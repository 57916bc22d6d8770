// Whether a draft model can stand in for a target: its token ids must mean the same texts, since
// the draft's lookahead tokens and kept positions are read in the target's vocabulary. Compared
// token by token (GGUF's tokenizer.ggml.tokens), which also covers the vocabulary's size.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "common/model/gguf.h"

namespace tripod {

// OK when both files list the same tokens in the same order; else InvalidArgument naming both
// files, their sizes and the first token id that differs.
absl::Status CheckSameVocabulary(const GgufFile& draft, const std::string& draft_name,
                                 const GgufFile& target, const std::string& target_name);

// The same, opening the two files (only their metadata is read).
absl::Status CheckSameVocabulary(const std::string& draft_path, const std::string& target_path);

}  // namespace tripod
