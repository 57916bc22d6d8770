#include "cli/prompt_flags.h"

#include <memory>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/model/gguf.h"
#include "common/model/tokenizer.h"
#include "common/util/status_macros.h"

ABSL_DECLARE_FLAG(std::string, prompt);
ABSL_DECLARE_FLAG(std::string, ids);

namespace tripod {

absl::StatusOr<std::vector<int32_t>> ParseIdList(const std::string& text, const char* command,
                                                 const char* what) {
  std::vector<int32_t> ids;
  if (text.empty()) return ids;
  for (absl::string_view s : absl::StrSplit(text, ',')) {
    int32_t id;
    if (!absl::SimpleAtoi(s, &id)) {
      return absl::InvalidArgumentError(absl::StrCat(command, ": bad ", what, " '", s, "'"));
    }
    ids.push_back(id);
  }
  return ids;
}

absl::StatusOr<std::vector<int32_t>> PromptFromFlags(const std::string& model_path,
                                                     const char* command) {
  if (!absl::GetFlag(FLAGS_ids).empty()) {
    return ParseIdList(absl::GetFlag(FLAGS_ids), command, "token id");
  }
  if (absl::GetFlag(FLAGS_prompt).empty()) {
    return absl::InvalidArgumentError(absl::StrCat(command, " needs --prompt TEXT or --ids 1,2,3"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::Open(model_path));
  ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, Tokenizer::FromGguf(*gguf));
  return tok->Encode(absl::GetFlag(FLAGS_prompt), true);
}

}  // namespace tripod
