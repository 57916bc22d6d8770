// Structured-output fields of a completion body -> one checked regex: each field's shape, the
// key order of a schema kept, at most one field, and 400s naming the field.
#include "scheduler/structured_output.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/structured/byte_dfa.h"
#include "scheduler/openai_request.h"

namespace tripod::scheduler {
namespace {

using OJson = nlohmann::ordered_json;

std::string RegexOf(const std::string& body) {
  ApiResult<std::string> r = ParseStructuredOutput(OJson::parse(body));
  EXPECT_TRUE(std::holds_alternative<std::string>(r)) << std::get<ApiError>(r).message;
  return std::holds_alternative<std::string>(r) ? std::get<std::string>(r) : "";
}

bool Matches(const std::string& regex, const std::string& text) {
  auto d = structured::CompileRegex(regex);
  return d.ok() && d->FullMatch(text);
}

TEST(StructuredOutputTest, EachFieldBecomesItsPattern) {
  EXPECT_EQ(RegexOf(R"({"response_format": {"type": "text"}})"), "");
  EXPECT_EQ(RegexOf(R"({})"), "");
  const std::string obj = RegexOf(R"({"response_format": {"type": "json_object"}})");
  EXPECT_TRUE(Matches(obj, R"({"a": [1, {"b": null}], "c": "d"})"));
  EXPECT_FALSE(Matches(obj, R"([1])"));
  const std::string schema = RegexOf(
      R"({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "strict": true,
          "schema": {"type": "object", "properties": {"z": {"type": "integer"},
          "a": {"type": "boolean"}}, "required": ["z", "a"], "additionalProperties": false}}}})");
  EXPECT_TRUE(Matches(schema, R"({"z": 1, "a": true})"));
  EXPECT_FALSE(Matches(schema, R"({"a": true, "z": 1})"));  // the schema's order, kept
  EXPECT_TRUE(Matches(RegexOf(R"({"guided_json": "{\"type\": \"boolean\"}"})"), "false"));
  EXPECT_TRUE(Matches(RegexOf(R"({"guided_json": {"type": "null"}})"), "null"));
  EXPECT_TRUE(Matches(RegexOf(R"({"guided_regex": "a[0-9]+"})"), "a12"));
  const std::string choice = RegexOf(R"({"guided_choice": ["a.b", "c|d"]})");
  EXPECT_TRUE(Matches(choice, "a.b"));
  EXPECT_TRUE(Matches(choice, "c|d"));
  EXPECT_FALSE(Matches(choice, "axb"));
  EXPECT_TRUE(Matches(RegexOf(R"({"structured_outputs": {"choice": ["x"]}})"), "x"));
  EXPECT_TRUE(Matches(RegexOf(R"({"structured_outputs": {"regex": "y+"}})"), "yy"));
  EXPECT_TRUE(Matches(RegexOf(R"({"structured_outputs": {"json": {"type": "integer"}}})"), "-3"));
  EXPECT_TRUE(Matches(RegexOf(R"({"structured_outputs": {"json_object": true}})"), "{}"));
  EXPECT_EQ(RegexOf(R"({"guided_decoding_backend": "xgrammar"})"), "");
}

TEST(StructuredOutputTest, RefusalsNameTheField) {
  struct Case {
    const char* body;
    const char* param;
    const char* words;
  };
  for (const Case& c : std::vector<Case>{
           {R"({"guided_regex": "(a"})", "guided_regex", "invalid regex"},
           {R"({"guided_regex": "\\bx"})", "guided_regex", "word boundary"},
           {R"({"guided_regex": 5})", "guided_regex", "string"},
           {R"({"guided_regex": "[^\\x00-\\x{10FFFF}]"})", "guided_regex", "invalid"},
           {R"({"guided_choice": "a"})", "guided_choice", "list"},
           {R"({"guided_choice": [""]})", "guided_choice", "non-empty"},
           {R"({"guided_json": {"type": "string", "format": "uri"}})", "guided_json", "format"},
           {R"({"guided_json": 3})", "guided_json", "schema"},
           {R"({"response_format": {"type": "json_schema"}})", "response_format.json_schema",
            "object"},
           {R"({"response_format": "json"})", "response_format", "type"},
           {R"({"structured_outputs": {}})", "structured_outputs", "exactly one"},
           {R"({"structured_outputs": {"regex": "a", "choice": ["b"]}})", "structured_outputs",
            "exactly one"},
           {R"({"structured_outputs": {"structural_tag": {}}})",
            "structured_outputs.structural_tag", "not supported"},
           {R"({"guided_whitespace_pattern": " "})", "guided_whitespace_pattern", "not supported"},
           {R"({"guided_json": {"type": "integer"}, "response_format": {"type": "json_object"}})",
            "guided_json", "give one"},
       }) {
    ApiResult<std::string> r = ParseStructuredOutput(OJson::parse(c.body));
    ASSERT_TRUE(std::holds_alternative<ApiError>(r)) << c.body;
    const ApiError& e = std::get<ApiError>(r);
    EXPECT_EQ(e.http_status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body;
    EXPECT_NE(e.message.find(c.words), std::string::npos) << c.body << ": " << e.message;
  }
}

TEST(StructuredOutputTest, ParsedIntoTheRequestOnBothEndpoints) {
  for (ApiKind kind : {ApiKind::kCompletion, ApiKind::kChatCompletion}) {
    const std::string input = kind == ApiKind::kCompletion
                                  ? R"("prompt": "x")"
                                  : R"("messages": [{"role": "user", "content": "x"}])";
    auto r = ParseCompletionBody(
        absl::StrCat(R"({"model": "m", )", input, R"(, "guided_choice": ["yes", "no"]})"), kind);
    ASSERT_TRUE(std::holds_alternative<CompletionRequest>(r)) << std::get<ApiError>(r).message;
    EXPECT_TRUE(Matches(std::get<CompletionRequest>(r).output_regex, "yes"));
    auto none = ParseCompletionBody(absl::StrCat(R"({"model": "m", )", input, "}"), kind);
    ASSERT_TRUE(std::holds_alternative<CompletionRequest>(none));
    EXPECT_EQ(std::get<CompletionRequest>(none).output_regex, "");
  }
}

}  // namespace
}  // namespace tripod::scheduler
