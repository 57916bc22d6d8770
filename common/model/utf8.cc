#include "common/model/utf8.h"

#include "common/model/tokenizer_bpe.h"

namespace tripod {

std::string ToValidUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    const size_t n = tok::NextUtf8(s, i, &cp);
    if (cp == 0xFFFFFFFFu) {
      out += "\xEF\xBF\xBD";
    } else {
      out.append(s.substr(i, n));
    }
    i += n;
  }
  return out;
}

}  // namespace tripod
