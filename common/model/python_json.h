// JSON text as Python's json.dumps(value, ensure_ascii=False) writes it: ", " and ": " between
// items, keys in the order given, non-ASCII characters kept, control characters escaped. Chat
// templates' `tojson` filter writes this (Hugging Face's Jinja environment), so a rendered prompt
// that holds tool definitions or tool-call arguments matches the model's own template byte for
// byte; vLLM writes tool-call arguments in responses the same way.
#pragma once

#include <string>

#include "nlohmann/json.hpp"

namespace tripod {

// Numbers: integers as they are; floats as nlohmann's shortest round-trip form, which is Python's
// repr for the values a tool schema holds (0.5, 1e-05, 1e+16; Python writes 1e+16 as 1e+16 too).
std::string PythonJsonDumps(const nlohmann::ordered_json& value);

}  // namespace tripod
