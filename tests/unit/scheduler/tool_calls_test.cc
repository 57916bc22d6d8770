#include "scheduler/tool_calls.h"

#include <string>
#include <vector>

#include "common/model/python_json.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tripod::scheduler {
namespace {

using nlohmann::ordered_json;

TEST(PythonJsonTest, WritesWhatJsonDumpsWrites) {
  // json.dumps({"b": [1, 2.5, None, True], "a": {"é": "x\"y\\\n\t\u0001"}}, ensure_ascii=False)
  const ordered_json v = ordered_json::parse(
      R"({"b": [1, 2.5, null, true], "a": {"é": "x\"y\\\n\t\u0001"}, "c": [], "d": {}})");
  EXPECT_EQ(PythonJsonDumps(v),
            "{\"b\": [1, 2.5, null, true], \"a\": {\"é\": \"x\\\"y\\\\\\n\\t\\u0001\"}, \"c\": [], "
            "\"d\": {}}");
  EXPECT_EQ(PythonJsonDumps(ordered_json::parse("-3")), "-3");
  EXPECT_EQ(PythonJsonDumps(ordered_json::parse("\"\"")), "\"\"");
}

TEST(ToolCallOutputTest, ReadsCallsAndTheContentBeforeThem) {
  const std::string text =
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Oslo\", \"unit\": \"C\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": "
      "{\"b\": 2, \"a\": 1}}\n</tool_call>";
  ParsedOutput p = ParseToolCallOutput(text, 16);
  ASSERT_TRUE(p.content.has_value());
  EXPECT_EQ(*p.content, "Let me check.\n");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, "{\"city\": \"Oslo\", \"unit\": \"C\"}");
  EXPECT_EQ(p.calls[1].name, "add");
  EXPECT_EQ(p.calls[1].arguments, "{\"b\": 2, \"a\": 1}");  // the model's key order
  EXPECT_TRUE(p.calls[0].id.starts_with("call_") && p.calls[0].id.size() == 29);
  EXPECT_NE(p.calls[0].id, p.calls[1].id);

  ParsedOutput first = ParseToolCallOutput(text, 1);  // parallel_tool_calls false
  ASSERT_EQ(first.calls.size(), 1u);
  EXPECT_EQ(first.calls[0].name, "get_weather");
}

TEST(ToolCallOutputTest, PlainTextAndBrokenCallsAreContent) {
  ParsedOutput plain = ParseToolCallOutput("It is sunny.", 16);
  EXPECT_EQ(plain.content, "It is sunny.");
  EXPECT_TRUE(plain.calls.empty());
  EXPECT_FALSE(ParseToolCallOutput("", 16).content.has_value());

  for (const std::string broken : {
           "<tool_call>\n{\"name\": \"f\", \"arguments\": {\n</tool_call>",        // not JSON
           "<tool_call>\n{\"arguments\": {}}\n</tool_call>",                       // no name
           "<tool_call>\n[1, 2]\n</tool_call>",                                    // not an object
           "<tool_call>{\"name\": \"f\"}</tool_call><tool_call>oops</tool_call>",  // one of two
       }) {
    ParsedOutput p = ParseToolCallOutput(broken, 16);
    EXPECT_TRUE(p.calls.empty()) << broken;
    EXPECT_EQ(p.content, broken);
  }
  // Only white space before the call: no content. A call cut at the end still parses.
  ParsedOutput cut = ParseToolCallOutput("\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}", 16);
  EXPECT_FALSE(cut.content.has_value());
  ASSERT_EQ(cut.calls.size(), 1u);
  EXPECT_EQ(cut.calls[0].arguments, "{}");
  // Arguments written as a JSON string are read as the object they hold.
  ParsedOutput str =
      ParseToolCallOutput("<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"x\\\":1}\"}", 16);
  ASSERT_EQ(str.calls.size(), 1u);
  EXPECT_EQ(str.calls[0].arguments, "{\"x\": 1}");
}

// Feeds `text` to a stream in pieces of `step` bytes and gathers what comes out.
ToolCallStream::Output Streamed(const std::string& text, size_t step, int max_calls = 16) {
  ToolCallStream s(max_calls);
  ToolCallStream::Output all;
  auto add = [&all](ToolCallStream::Output o) {
    all.content += o.content;
    for (ToolCall& c : o.calls) all.calls.push_back(std::move(c));
  };
  for (size_t i = 0; i < text.size(); i += step) add(s.Feed(text.substr(i, step)));
  add(s.Finish());
  return all;
}

TEST(ToolCallStreamTest, AnyCutGivesWhatTheWholeTextGives) {
  const std::vector<std::string> texts = {
      "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\n",
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"s\": \"<tool_call>?\"}}\n</tool_call>",
      "No call here, though 1 < 2 and <tool is a word.",
      "\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1, 2]}}",  // cut at the end
  };
  for (const std::string& text : texts) {
    const ParsedOutput whole = ParseToolCallOutput(text, 16);
    for (size_t step : {1, 2, 3, 7, 11, 1000}) {
      const ToolCallStream::Output got = Streamed(text, step);
      EXPECT_EQ(got.content, whole.content.value_or("")) << text << " step " << step;
      ASSERT_EQ(got.calls.size(), whole.calls.size()) << text << " step " << step;
      for (size_t i = 0; i < got.calls.size(); ++i) {
        EXPECT_EQ(got.calls[i].name, whole.calls[i].name);
        EXPECT_EQ(got.calls[i].arguments, whole.calls[i].arguments);
      }
    }
  }
}

TEST(ToolCallStreamTest, ABrokenCallIsSentAsContentAndOnlyTheFirstCallWhenNotParallel) {
  const ToolCallStream::Output broken = Streamed("<tool_call>{oops}</tool_call> after", 4);
  EXPECT_TRUE(broken.calls.empty());
  EXPECT_EQ(broken.content, "<tool_call>{oops}</tool_call> after");
  const ToolCallStream::Output one = Streamed(
      "<tool_call>{\"name\": \"a\"}</tool_call><tool_call>{\"name\": \"b\"}</tool_call>", 5, 1);
  ASSERT_EQ(one.calls.size(), 1u);
  EXPECT_EQ(one.calls[0].name, "a");
}

TEST(ToolsTest, ParsesToolsInTheirOrderAndRefusesBadOnes) {
  CompletionRequest r;
  r.kind = ApiKind::kChatCompletion;
  const ordered_json tools = ordered_json::parse(
      R"([{"type": "function", "function": {"name": "b_tool", "parameters": {"type": "object"}}},
          {"function": {"name": "a-tool"}, "type": "function"}])");
  EXPECT_FALSE(ParseTools(tools, &r).has_value());
  EXPECT_EQ(r.tool_names, (std::vector<std::string>{"b_tool", "a-tool"}));
  ASSERT_EQ(r.tools_json.size(), 2u);
  EXPECT_EQ(r.tools_json[1], "{\"function\": {\"name\": \"a-tool\"}, \"type\": \"function\"}");

  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"({"type": "function"})", "tools"},
      {R"([{"type": "code_interpreter"}])", "tools[0].type"},
      {R"([{"type": "function", "function": {"name": ""}}])", "tools[0].function.name"},
      {R"([{"type": "function", "function": {"name": "a b"}}])", "tools[0].function.name"},
      {R"([{"type": "function", "function": {"name": "f", "parameters": 3}}])",
       "tools[0].function.parameters"},
      {R"([{"type": "function", "function": {"name": "f"}},
           {"type": "function", "function": {"name": "f"}}])",
       "tools[1].function.name"},
  };
  for (const auto& [text, param] : bad) {
    CompletionRequest q;
    std::optional<ApiError> e = ParseTools(ordered_json::parse(text), &q);
    ASSERT_TRUE(e.has_value()) << text;
    EXPECT_EQ(e->http_status, 400);
    EXPECT_EQ(e->param, param) << text;
  }
}

TEST(ToolsTest, ToolChoiceMustNameATool) {
  CompletionRequest r;
  ASSERT_FALSE(
      ParseTools(ordered_json::parse(R"([{"type": "function", "function": {"name": "f"}}])"), &r)
          .has_value());
  EXPECT_FALSE(ParseToolChoice(nlohmann::json("none"), &r).has_value());
  EXPECT_FALSE(r.ParsesToolCalls());
  EXPECT_FALSE(ParseToolChoice(nlohmann::json("auto"), &r).has_value());
  EXPECT_TRUE(r.ParsesToolCalls());
  EXPECT_FALSE(ParseToolChoice(
                   nlohmann::json::parse(R"({"type": "function", "function": {"name": "f"}})"), &r)
                   .has_value());
  EXPECT_EQ(r.tool_choice, ToolChoice::kNamed);
  EXPECT_TRUE(ParseToolChoice(
                  nlohmann::json::parse(R"({"type": "function", "function": {"name": "g"}})"), &r)
                  .has_value());
  EXPECT_TRUE(ParseToolChoice(nlohmann::json("always"), &r).has_value());
  CompletionRequest none;
  EXPECT_TRUE(ParseToolChoice(nlohmann::json("required"), &none).has_value());  // no tools
}

}  // namespace
}  // namespace tripod::scheduler
