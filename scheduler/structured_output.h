// Structured outputs in a completion request: OpenAI's response_format ({"type": "json_object"},
// {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}), vLLM's guided_json
// (a schema, or its JSON text), guided_regex, guided_choice, and vLLM's newer
// structured_outputs object ({"json"}, {"regex"}, {"choice"}, {"json_object": true}), for
// completions and chat completions alike. At most one may be given.
//
// Each becomes the one regex the whole output must match (common/structured), checked here by
// compiling its automaton: an invalid pattern, a schema feature outside the subset, or an
// automaton over the bounds is a 400 naming the field (`param`) and what is wrong; a pattern found
// good once is not compiled again (checked_regexes.h). The decode worker compiles the same text
// again against its vocabulary (proto OutputConstraint).
// Refused, not ignored: guided_grammar, structured_outputs.grammar / structural_tag,
// guided_whitespace_pattern. guided_decoding_backend is accepted and ignored (it names an
// implementation; there is one).
#pragma once

#include <string>
#include <string_view>

#include "nlohmann/json.hpp"
#include "scheduler/completion_request.h"
#include "scheduler/openai_json.h"

namespace tripod::scheduler {

// The request names a structured output (any of the fields above, not null; response_format
// "text" counts as none).
bool HasStructuredOutput(const nlohmann::json& body);

// The regex of the body's structured output; "" when there is none. The body is parsed
// keeping its objects' key order: a schema's properties are generated in the order written.
ApiResult<std::string> ParseStructuredOutput(const nlohmann::ordered_json& body);

// A pattern given directly (vLLM's guided_regex, gRPC): checked as the HTTP fields are.
ApiResult<std::string> CheckOutputRegex(std::string_view regex, const std::string& param);

}  // namespace tripod::scheduler
