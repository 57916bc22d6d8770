// Structured-output fields -> one checked regex; see structured_output.h.
#include "scheduler/structured_output.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/structured/byte_dfa.h"
#include "common/structured/json_schema_regex.h"
#include "scheduler/checked_regexes.h"

namespace tripod::scheduler {
namespace {

using OJson = nlohmann::ordered_json;

bool Given(const OJson& body, const char* key) {
  auto it = body.find(key);
  return it != body.end() && !it->is_null();
}

ApiError Refused(const absl::Status& s, const std::string& param) {
  return InvalidRequest(absl::StrCat("'", param, "': ", s.message()), std::string(param));
}

ApiResult<std::string> FromSchema(const OJson& schema, const std::string& param) {
  OJson parsed = schema;
  if (schema.is_string()) {
    // As deep as a body may nest (the text escaped that check, being a string in it).
    if (JsonTooDeep(schema.get<std::string>())) {
      return InvalidRequest(
          absl::StrCat("'", param, "' nests lists/objects deeper than ", kMaxJsonDepth, " levels"),
          std::string(param));
    }
    parsed = OJson::parse(schema.get<std::string>(), nullptr, /*allow_exceptions=*/false);
    if (parsed.is_discarded()) {
      return InvalidRequest(absl::StrCat("'", param, "' is not valid JSON"), std::string(param));
    }
  }
  if (!parsed.is_object() && !parsed.is_boolean()) {
    return InvalidRequest(absl::StrCat("'", param, "' must be a JSON schema (an object)"),
                          std::string(param));
  }
  absl::StatusOr<std::string> r = structured::JsonSchemaToRegex(parsed);
  if (!r.ok()) return Refused(r.status(), param);
  return CheckOutputRegex(*r, param);
}

ApiResult<std::string> FromChoice(const OJson& choice, const std::string& param) {
  if (!choice.is_array() || choice.empty()) {
    return InvalidRequest(absl::StrCat("'", param, "' must be a non-empty list of strings"),
                          std::string(param));
  }
  std::vector<std::string> options;
  for (const OJson& c : choice) {
    if (!c.is_string() || c.get<std::string>().empty()) {
      return InvalidRequest(absl::StrCat("'", param, "' must hold non-empty strings"),
                            std::string(param));
    }
    options.push_back(c.get<std::string>());
  }
  return CheckOutputRegex(structured::ChoiceRegex(options), param);
}

ApiResult<std::string> FromRegex(const OJson& regex, const std::string& param) {
  if (!regex.is_string()) {
    return InvalidRequest(absl::StrCat("'", param, "' must be a string"), std::string(param));
  }
  return CheckOutputRegex(regex.get<std::string>(), param);
}

ApiResult<std::string> FromResponseFormat(const OJson& rf) {
  if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string()) {
    return InvalidRequest("'response_format' must be an object with a 'type'", "response_format");
  }
  const std::string type = rf["type"];
  if (type == "text") return std::string();
  if (type == "json_object")
    return CheckOutputRegex(structured::JsonObjectRegex(), "response_format");
  if (type == "json_schema") {
    auto js = rf.find("json_schema");
    if (js == rf.end() || !js->is_object()) {
      return InvalidRequest("'response_format.json_schema' must be an object",
                            "response_format.json_schema");
    }
    auto schema = js->find("schema");
    if (schema == js->end() || schema->is_null()) {  // OpenAI's default: no schema
      return CheckOutputRegex(structured::JsonObjectRegex(), "response_format");
    }
    return FromSchema(*schema, "response_format.json_schema.schema");
  }
  return InvalidRequest(absl::StrCat("'response_format.type' must be \"text\", \"json_object\" or "
                                     "\"json_schema\", got \"",
                                     type.substr(0, 64), "\""),
                        "response_format.type");
}

ApiResult<std::string> FromStructuredOutputs(const OJson& so) {
  if (!so.is_object()) {
    return InvalidRequest("'structured_outputs' must be an object", "structured_outputs");
  }
  for (const char* key : {"grammar", "structural_tag", "whitespace_pattern"}) {
    if (Given(so, key)) {
      return InvalidRequest(absl::StrCat("'structured_outputs.", key, "' is not supported"),
                            absl::StrCat("structured_outputs.", key));
    }
  }
  int given = 0;
  for (const char* key : {"json", "regex", "choice"}) given += Given(so, key) ? 1 : 0;
  const bool json_object =
      so.contains("json_object") && so["json_object"].is_boolean() && so["json_object"].get<bool>();
  given += json_object ? 1 : 0;
  if (given != 1) {
    return InvalidRequest(
        "'structured_outputs' must hold exactly one of 'json', 'regex', 'choice', 'json_object'",
        "structured_outputs");
  }
  if (Given(so, "json")) return FromSchema(so["json"], "structured_outputs.json");
  if (Given(so, "regex")) return FromRegex(so["regex"], "structured_outputs.regex");
  if (Given(so, "choice")) return FromChoice(so["choice"], "structured_outputs.choice");
  return CheckOutputRegex(structured::JsonObjectRegex(), "structured_outputs.json_object");
}

}  // namespace

bool HasStructuredOutput(const nlohmann::json& body) {
  for (const char* key : {"response_format", "guided_json", "guided_regex", "guided_choice",
                          "guided_grammar", "guided_whitespace_pattern", "structured_outputs"}) {
    auto it = body.find(key);
    if (it == body.end() || it->is_null()) continue;
    if (std::string_view(key) == "response_format" && it->is_object() && it->contains("type") &&
        (*it)["type"] == "text" && it->size() == 1) {
      continue;
    }
    return true;
  }
  return false;
}

ApiResult<std::string> CheckOutputRegex(std::string_view regex, const std::string& param) {
  static CheckedRegexes* const checked = new CheckedRegexes(size_t{4} << 20);
  if (checked->Contains(regex)) return std::string(regex);
  absl::StatusOr<structured::ByteDfa> dfa = structured::CompileRegex(regex);
  if (!dfa.ok()) return Refused(dfa.status(), param);
  if (dfa->start == structured::ByteDfa::kDead) {
    return InvalidRequest(absl::StrCat("'", param, "' matches no text at all"), std::string(param));
  }
  checked->Add(regex);
  return std::string(regex);
}

ApiResult<std::string> ParseStructuredOutput(const nlohmann::ordered_json& body) {
  for (const char* key : {"guided_grammar", "guided_whitespace_pattern"}) {
    if (Given(body, key)) {
      return InvalidRequest(absl::StrCat("'", key, "' is not supported by this server"), key);
    }
  }
  std::vector<const char*> given;
  for (const char* key :
       {"response_format", "guided_json", "guided_regex", "guided_choice", "structured_outputs"}) {
    if (!Given(body, key)) continue;
    if (std::string_view(key) == "response_format") {
      const OJson& rf = body["response_format"];
      if (rf.is_object() && rf.contains("type") && rf["type"] == "text") continue;
    }
    given.push_back(key);
  }
  if (given.empty()) {
    if (Given(body, "response_format")) return FromResponseFormat(body["response_format"]);
    return std::string();
  }
  if (given.size() > 1) {
    return InvalidRequest(absl::StrCat("'", given[0], "' and '", given[1],
                                       "' both ask for a structured output; give one"),
                          given[1]);
  }
  const std::string_view key = given[0];
  if (key == "response_format") return FromResponseFormat(body["response_format"]);
  if (key == "guided_json") return FromSchema(body["guided_json"], "guided_json");
  if (key == "guided_regex") return FromRegex(body["guided_regex"], "guided_regex");
  if (key == "guided_choice") return FromChoice(body["guided_choice"], "guided_choice");
  return FromStructuredOutputs(body["structured_outputs"]);
}

}  // namespace tripod::scheduler
