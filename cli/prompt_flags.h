// The prompt of the one-shot commands (`tripod prefill`, `tripod draft`): --ids or --prompt.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tripod {

// "1,2,3" -> ids; empty text -> none. `what` names an element in the error ("token id").
absl::StatusOr<std::vector<int32_t>> ParseIdList(const std::string& text, const char* command,
                                                 const char* what);

// --ids if given, else --prompt tokenized by the model at `model_path` (special tokens parsed,
// BOS as the model wants); neither: an error naming `command`.
absl::StatusOr<std::vector<int32_t>> PromptFromFlags(const std::string& model_path,
                                                     const char* command);

}  // namespace tripod
