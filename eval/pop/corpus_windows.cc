// Corpus windows; see corpus_windows.h.
#include "eval/pop/corpus_windows.h"

#include <algorithm>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace tripod {

std::vector<int> SpreadLengths(int n, int min_tokens, int max_tokens, uint64_t seed) {
  std::vector<int> out;
  if (n <= 0) return out;
  for (int i = 0; i < n; ++i) {
    const double f = n == 1 ? 0.0 : static_cast<double>(i) / (n - 1);
    out.push_back(min_tokens + static_cast<int>(f * (max_tokens - min_tokens) + 0.5));
  }
  std::mt19937_64 rng(seed);
  std::shuffle(out.begin(), out.end(), rng);
  return out;
}

absl::StatusOr<std::vector<CorpusWindow>> CutWindows(const Tokenizer& tok, const std::string& text,
                                                     const std::vector<int>& prompt_lengths,
                                                     int continuation) {
  const bool bos = tok.add_bos() && tok.bos_id() >= 0;
  for (int len : prompt_lengths) {
    if (len < 2 + (bos ? 1 : 0)) {
      return absl::InvalidArgumentError(absl::StrCat("prompt length ", len, " is too short"));
    }
  }
  if (continuation < 0) return absl::InvalidArgumentError("negative continuation length");
  // Plain text: special-token syntax in it is text, not control tokens.
  const std::vector<int32_t> ids = tok.Encode(text, /*parse_special=*/false);
  std::vector<CorpusWindow> out;
  size_t at = 0;
  for (int len : prompt_lengths) {
    const size_t body = static_cast<size_t>(len - (bos ? 1 : 0));
    if (at + body + continuation > ids.size()) {
      return absl::OutOfRangeError(
          absl::StrCat("the corpus has ", ids.size(), " tokens: too short for ",
                       prompt_lengths.size(), " windows (ran out at window ", out.size() + 1, ")"));
    }
    CorpusWindow w;
    if (bos) w.prompt.push_back(tok.bos_id());
    w.prompt.insert(w.prompt.end(), ids.begin() + at, ids.begin() + at + body);
    w.continuation.assign(ids.begin() + at + body, ids.begin() + at + body + continuation);
    at += body + continuation;
    out.push_back(std::move(w));
  }
  return out;
}

absl::StatusOr<std::string> ReadTextFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream ss;
  ss << f.rdbuf();
  if (ss.str().empty()) return absl::InvalidArgumentError(absl::StrCat(path, " is empty"));
  return ss.str();
}

}  // namespace tripod
