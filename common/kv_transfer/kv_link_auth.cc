// The KV links' credentials; see kv_link_auth.h.
#include "common/kv_transfer/kv_link_auth.h"

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "absl/strings/str_cat.h"

namespace tripod {
namespace {

// Domain strings: a MAC of one kind never passes for the other.
constexpr std::string_view kPayloadDomain = "tripod kv-link payload v1";
constexpr std::string_view kJoinDomain = "tripod kv-link join v1";

void Append(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::string HmacSha256(std::string_view key, std::string_view message) {
  std::string mac(EVP_MAX_MD_SIZE, '\0');
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(),
       reinterpret_cast<unsigned char*>(mac.data()), &len);
  mac.resize(len);
  return mac;
}

}  // namespace

absl::StatusOr<std::string> KvLinkRandomBytes(size_t n) {
  std::string out(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) != 1) {
    return absl::InternalError(
        absl::StrCat("KV link: OpenSSL's RAND_bytes failed (error ", ERR_get_error(), ")"));
  }
  return out;
}

absl::Status CheckKvLinkKey(std::string_view key) {
  if (key.size() != kKvLinkKeyBytes) {
    return absl::FailedPreconditionError(absl::StrCat("the decode worker handed out a link key of ",
                                                      key.size(), " bytes, not ", kKvLinkKeyBytes,
                                                      " (an older build?)"));
  }
  return absl::OkStatus();
}

KvLinkDigest KvLinkPayloadDigest(const uint8_t* host, size_t n) {
  KvLinkDigest d{};
  unsigned int len = 0;
  EVP_Digest(host, n, d.data(), &len, EVP_sha256(), nullptr);
  return d;
}

std::string KvLinkPayloadMac(std::string_view key, const v1::KvChunk& h,
                             const KvLinkDigest& digest) {
  std::string m(kPayloadDomain);
  for (uint64_t v : {uint64_t{h.transfer_id()}, uint64_t{h.seq()}, h.link_id(), h.link_seq(),
                     h.link_bytes(), static_cast<uint64_t>(static_cast<uint32_t>(h.layer_begin())),
                     static_cast<uint64_t>(static_cast<uint32_t>(h.layer_end())),
                     static_cast<uint64_t>(static_cast<uint32_t>(h.slot_begin())),
                     static_cast<uint64_t>(static_cast<uint32_t>(h.slot_end())),
                     static_cast<uint64_t>(h.dtype())}) {
    Append(m, v);
  }
  m.append(reinterpret_cast<const char*>(digest.data()), digest.size());
  return HmacSha256(key, m);
}

absl::Status VerifyKvLinkPayloadMac(std::string_view key, const v1::KvChunk& h,
                                    const KvLinkDigest& digest) {
  if (!KvLinkMacEqual(KvLinkPayloadMac(key, h, digest), h.link_mac())) {
    return absl::DataLossError(absl::StrCat(
        "transfer ", h.transfer_id(), " chunk ", h.seq(), ": the link payload fails its ",
        h.link_mac().empty() ? "HMAC-SHA256 (the header carries none)" : "HMAC-SHA256",
        " (altered, replayed from another chunk or transfer, or signed with another key)"));
  }
  return absl::OkStatus();
}

std::string KvLinkJoinProof(std::string_view key, uint64_t link_id, std::string_view nonce) {
  std::string m(kJoinDomain);
  Append(m, link_id);
  m.append(nonce);
  return HmacSha256(key, m);
}

bool KvLinkMacEqual(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace tripod
