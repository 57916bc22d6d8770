// The KV links' credentials (TCP and IPC links): a per-link key the decode worker draws from
// OpenSSL's CSPRNG and hands out in the Decode.OpenKvLink reply, so that the link is trusted as
// far as the gRPC channel is (mutual TLS when it is on). The key proves the joining connection
// (an HMAC over the listener's random challenge) and signs each payload: link_mac is the
// HMAC-SHA256 of the chunk's identity (transfer, seq, link id and seq, ranges, type, size) and
// the payload's SHA-256, so a payload altered, replayed from an earlier chunk or moved to another
// transfer fails. The bytes are not encrypted.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tripod/v1/kv_chunk.pb.h"

namespace tripod {

inline constexpr size_t kKvLinkKeyBytes = 32;
inline constexpr size_t kKvLinkNonceBytes = 16;
inline constexpr size_t kKvLinkMacBytes = 32;

using KvLinkDigest = std::array<uint8_t, 32>;  // SHA-256

// n bytes from OpenSSL's RAND_bytes: a link's key, a join's challenge.
absl::StatusOr<std::string> KvLinkRandomBytes(size_t n);
// A key's shape as the prefill worker checks it on receipt.
absl::Status CheckKvLinkKey(std::string_view key);

KvLinkDigest KvLinkPayloadDigest(const uint8_t* host, size_t n);

// The payload's MAC for a chunk header whose transfer_id, seq and link fields are set.
std::string KvLinkPayloadMac(std::string_view key, const v1::KvChunk& header,
                             const KvLinkDigest& digest);
// DATA_LOSS, saying so, when header.link_mac is not the payload's MAC (compared in constant
// time).
absl::Status VerifyKvLinkPayloadMac(std::string_view key, const v1::KvChunk& header,
                                    const KvLinkDigest& digest);

// What a connection joining link `link_id` answers to the listener's challenge `nonce`.
std::string KvLinkJoinProof(std::string_view key, uint64_t link_id, std::string_view nonce);
// Constant-time equality of two MACs (false for different sizes).
bool KvLinkMacEqual(std::string_view a, std::string_view b);

}  // namespace tripod
