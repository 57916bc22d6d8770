// Text that must be valid UTF-8 on the wire (protobuf `string` fields are checked when parsed:
// an ill-formed byte makes the receiver drop the message). Token text is bytes: a byte-level
// token can split a character, and a model can emit bytes that never form one.
#pragma once

#include <string>
#include <string_view>

namespace tripod {

// `s` with every ill-formed or truncated sequence replaced by U+FFFD (one per bad byte, as
// Python's errors="replace" does for most inputs). Valid input comes back unchanged.
std::string ToValidUtf8(std::string_view s);

}  // namespace tripod
