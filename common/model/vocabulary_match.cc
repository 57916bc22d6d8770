// A draft's vocabulary against its target's; see vocabulary_match.h.
#include "common/model/vocabulary_match.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/util/status_macros.h"

namespace tripod {

absl::Status CheckSameVocabulary(const GgufFile& draft, const std::string& draft_name,
                                 const GgufFile& target, const std::string& target_name) {
  ASSIGN_OR_RETURN(const std::vector<std::string>* mine,
                   draft.GetStringArray("tokenizer.ggml.tokens"));
  ASSIGN_OR_RETURN(const std::vector<std::string>* theirs,
                   target.GetStringArray("tokenizer.ggml.tokens"));
  if (*mine == *theirs) return absl::OkStatus();
  const size_t common = std::min(mine->size(), theirs->size());
  const size_t first =
      std::mismatch(mine->begin(), mine->begin() + common, theirs->begin()).first - mine->begin();
  std::string where;
  if (first < common) {
    where = absl::StrFormat("; token %d is %s in the draft, %s in the target", first,
                            absl::CHexEscape((*mine)[first]), absl::CHexEscape((*theirs)[first]));
  } else {
    where = absl::StrCat("; the first ", common, " tokens agree");
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "draft model ", draft_name, " cannot serve target ", target_name,
      ": their vocabularies differ (", mine->size(), " tokens against ", theirs->size(), where,
      "); a draft must share the target's vocabulary (e.g. the same model family)"));
}

absl::Status CheckSameVocabulary(const std::string& draft_path, const std::string& target_path) {
  ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> draft, GgufFile::Open(draft_path));
  ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> target, GgufFile::Open(target_path));
  return CheckSameVocabulary(*draft, draft_path, *target, target_path);
}

}  // namespace tripod
