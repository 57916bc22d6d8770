#include "scheduler/api_keys.h"

#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "openssl/crypto.h"

namespace tripod::scheduler {

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

absl::StatusOr<ApiKeys> ApiKeys::Load(const std::string& key, const std::string& file) {
  ApiKeys k;
  if (!key.empty()) k.keys_.push_back(key);
  if (!file.empty()) {
    std::ifstream in(file);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot read the API key file ", file));
    std::string line;
    size_t found = 0;
    while (std::getline(in, line)) {
      std::string t(absl::StripAsciiWhitespace(line));
      if (t.empty() || t[0] == '#') continue;
      k.keys_.push_back(std::move(t));
      ++found;
    }
    if (found == 0) {
      return absl::InvalidArgumentError(absl::StrCat("the API key file ", file, " holds no key"));
    }
  }
  return k;
}

std::optional<ApiError> ApiKeys::Check(const std::string* authorization) const {
  if (keys_.empty()) return std::nullopt;
  ApiError e{401, "", "authentication_error", "", "invalid_api_key"};
  if (authorization == nullptr) {
    e.message = "an API key is required: send it as 'Authorization: Bearer KEY'";
    return e;
  }
  absl::string_view v = *authorization;
  if (v.size() < 7 || !absl::EqualsIgnoreCase(v.substr(0, 7), "bearer ")) {
    e.message = "the Authorization header must be 'Bearer KEY'";
    return e;
  }
  v = absl::StripAsciiWhitespace(v.substr(7));
  const std::string_view presented(v.data(), v.size());
  bool ok = false;
  for (const std::string& key : keys_) ok |= ConstantTimeEquals(presented, key);  // try all
  if (ok) return std::nullopt;
  e.message = "the API key is not valid";
  return e;
}

}  // namespace tripod::scheduler
