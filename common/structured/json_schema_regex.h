// JSON Schema -> a regular expression (regex_parser.h) whose every match is a JSON text that
// validates against the schema. The constraint then runs as any regex does (token_constraint.h).
// Hand-written, as the rest of the engine.
//
// The subset (the one OpenAI's strict mode and vLLM's guided_json users write):
//   type: object (properties, required, additionalProperties false / absent / true / a schema
//         when there are no properties), array (items, minItems, maxItems), string (enum,
//         const, pattern, minLength, maxLength), integer, number, boolean, null, or a list of
//         types; enum and const of any JSON values; anyOf / oneOf of these (oneOf as anyOf:
//         branches that overlap are the schema's own ambiguity); allOf of one schema; $ref to
//         "#/$defs/..." or "#/definitions/..." (not recursive); nested objects. Annotations
//         (title, description, default, examples, $schema, ...) are ignored.
// Refused (Unimplemented, the message names the keyword): the rest of the keywords that
// constrain a value (minimum, maximum, multipleOf, format, uniqueItems, prefixItems,
// patternProperties, not, if/then/else, minProperties, ...), recursive $refs.
//
// The generated text's shape:
//   - Properties come in the schema's order; optional ones may be left out. Properties the
//     schema does not name are never generated, whatever additionalProperties says (the output
//     is valid either way).
//   - Whitespace: none, except one optional space after each ':' and ',' (so both the compact
//     form and Python's json.dumps default form match). Bounded on purpose: a small model given
//     free whitespace can spend its whole budget on newlines.
//   - Numbers: at most 16 integer digits, 16 fraction digits and 3 exponent digits; strings as
//     JSON spells them (escapes included, no raw control characters). A "pattern" applies to
//     the string's JSON text between the quotes; where it is not anchored (^, $) any string
//     characters may come before or after it, as JSON Schema's search semantics allow.
//   - An object or array with no schema for its values ("type": "object" alone,
//     response_format json_object) holds any JSON values nested up to kMaxAnyDepth levels.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tripod::structured {

inline constexpr int kMaxAnyDepth = 3;

absl::StatusOr<std::string> JsonSchemaToRegex(const nlohmann::ordered_json& schema);

// Any JSON object (response_format {"type": "json_object"}).
std::string JsonObjectRegex();

// Exactly one of the strings (vLLM's guided_choice).
std::string ChoiceRegex(const std::vector<std::string>& choices);

}  // namespace tripod::structured
