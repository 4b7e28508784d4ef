#include "http/tool_calls.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "http/grammar_testing.hpp"
#include "sample/grammar.hpp"

namespace pico::coordinator::http_api {
namespace {

using json = nlohmann::json;
using tokenizer::ChatFormat;

ToolCalling weather_tools(ToolStyle style = ToolStyle::Hermes) {
  ToolCalling calling;
  calling.style = style;
  const json parameters = json::parse(R"({"type": "object", "properties": {"city": {"type": "string"},
      "days": {"type": "integer"}}, "required": ["city"]})");
  calling.tools.push_back({"get_weather", "Weather of a city", parameters});
  calling.tools.push_back({"get_time", "", json::object()});
  return calling;
}

// system, user, an assistant turn of one call, its result, and the next question.
std::vector<RequestMessage> tool_loop() {
  std::vector<RequestMessage> m(5);
  m[0].message = {"system", "Be brief."};
  m[1].message = {"user", "Weather in Paris?"};
  m[2].message = {"assistant", ""};
  m[2].tool_calls = {{"call_1", "get_weather", R"({"city":"Paris","days":2})"}};
  m[3].message = {"tool", "sunny"};
  m[3].tool_call_id = "call_1";
  m[4].message = {"user", "Thanks"};
  return m;
}

const std::string kHermesTools =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function "
    "signatures within <tools></tools> XML tags:\n<tools>\n"
    R"({"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", "parameters": )"
    R"({"properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"], "type": "object"}}})"
    "\n"
    R"({"type": "function", "function": {"name": "get_time", "description": "", "parameters": {}}})"
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call>";

// The prompts below are what the Qwen2.5 / Qwen3 / Qwen3.5 / Llama 3.1 templates
// (llama.cpp's models/templates) write for the same conversation, worked out by hand.
TEST(ToolCalls, ChatmlRendersTheHermesTemplate) {
  const tokenizer::ChatTemplate chat(ChatFormat::ChatML);
  const std::string prompt = chat.apply(render_tool_messages(ChatFormat::ChatML, weather_tools(), tool_loop()), true);
  const std::string expected = "<|im_start|>system\nBe brief.\n\n" + kHermesTools +
                               "<|im_end|>\n"
                               "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
                               "<|im_start|>assistant\n<tool_call>\n"
                               R"({"name": "get_weather", "arguments": {"city": "Paris", "days": 2}})"
                               "\n</tool_call><|im_end|>\n"
                               "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
                               "<|im_start|>user\nThanks<|im_end|>\n<|im_start|>assistant\n";
  EXPECT_EQ(prompt, expected);
}

TEST(ToolCalls, Qwen3RendersItsToolTurnsAndConsecutiveResultsShareOne) {
  auto messages = tool_loop();
  messages[2].message.content = "Let me look.";
  messages[2].tool_calls.push_back({"call_2", "get_time", "{}"});
  RequestMessage second;
  second.message = {"tool", "12:00"};
  second.tool_call_id = "call_2";
  messages.insert(messages.begin() + 4, second);
  messages.pop_back();  // the tool results end the conversation: a tool loop
  const tokenizer::ChatTemplate chat(ChatFormat::Qwen3);
  const std::string prompt = chat.apply(render_tool_messages(ChatFormat::Qwen3, weather_tools(), messages), true);
  const std::string expected = "<|im_start|>system\nBe brief.\n\n" + kHermesTools +
                               "<|im_end|>\n"
                               "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
                               // after the last query: the think block, empty
                               "<|im_start|>assistant\nLet me look.\n<tool_call>\n"
                               R"({"name": "get_weather", "arguments": {"city": "Paris", "days": 2}})"
                               "\n</tool_call>\n<tool_call>\n"
                               R"({"name": "get_time", "arguments": {}})"
                               "\n</tool_call><|im_end|>\n"
                               "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\n12:00\n"
                               "</tool_response><|im_end|>\n"
                               "<|im_start|>assistant\n";
  EXPECT_EQ(prompt, expected);
}

TEST(ToolCalls, Qwen35WritesItsXmlCallsAndToolsFirst) {
  const tokenizer::ChatTemplate chat(ChatFormat::Qwen35);
  const std::string prompt = chat.apply(render_tool_messages(ChatFormat::Qwen35, weather_tools(), tool_loop()), true);
  EXPECT_TRUE(prompt.starts_with("<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n"))
      << prompt;
  EXPECT_NE(prompt.find("</tool_call>\n\n<IMPORTANT>\nReminder:\n"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("</IMPORTANT>\n\nBe brief.<|im_end|>\n"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("<|im_start|>assistant\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
                        "</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
                        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"),
            std::string::npos)
      << prompt;
}

TEST(ToolCalls, Llama3PutsTheToolsInTheFirstUserMessage) {
  const tokenizer::ChatTemplate chat(ChatFormat::Llama3);
  const std::string prompt = chat.apply(render_tool_messages(ChatFormat::Llama3, weather_tools(), tool_loop()), true);
  const std::string expected =
      "<|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nCutting Knowledge Date: December 2023\n"
      "Today Date: 26 Jul 2024\n\nBe brief.<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON for a "
      "function call with its proper arguments that best answers the given prompt.\n\nRespond in the format "
      "{\"name\": function name, \"parameters\": dictionary of argument name and its value}.Do not use variables.\n\n"
      "{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"get_weather\",\n"
      "        \"description\": \"Weather of a city\",\n        \"parameters\": {\n            \"properties\": {\n"
      "                \"city\": {\n                    \"type\": \"string\"\n                },\n"
      "                \"days\": {\n                    \"type\": \"integer\"\n                }\n            },\n"
      "            \"required\": [\n                \"city\"\n            ],\n            \"type\": \"object\"\n"
      "        }\n    }\n}\n\n"
      "{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"get_time\",\n"
      "        \"description\": \"\",\n        \"parameters\": {}\n    }\n}"
      "\n\nWeather in Paris?<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n"
      R"({"name": "get_weather", "parameters": {"city": "Paris", "days": 2}})"
      "<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\nsunny<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nThanks<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";
  EXPECT_EQ(prompt, expected);
}

TEST(ToolCalls, MistralWritesToolsBeforeTheLastUserTurn) {
  const std::string tools =
      R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", "parameters": )"
      R"({"properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"], )"
      R"("type": "object"}}}, {"type": "function", "function": {"name": "get_time", "description": "", "parameters": {}}}])";
  const auto v3 = render_tool_prompt(ChatFormat::MistralV3, weather_tools(ToolStyle::Mistral), tool_loop());
  ASSERT_TRUE(v3);
  EXPECT_EQ(*v3, "[INST] Weather in Paris?[/INST]"
                 R"([TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}, "id": "call_1"}]</s>)"
                 R"([TOOL_RESULTS] {"content": sunny, "call_id": "call_1"}[/TOOL_RESULTS])"
                 "[AVAILABLE_TOOLS] " + tools + "[/AVAILABLE_TOOLS][INST] Be brief.\n\nThanks[/INST]");
  const auto nemo = render_tool_prompt(ChatFormat::MistralV3Tekken, weather_tools(ToolStyle::Mistral), tool_loop());
  ASSERT_TRUE(nemo);
  EXPECT_EQ(*nemo, "[INST]Weather in Paris?[/INST]"
                   R"([TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}, "id": "call_1"}]</s>)"
                   R"([TOOL_RESULTS]{"content": sunny, "call_id": "call_1"}[/TOOL_RESULTS])"
                   "[AVAILABLE_TOOLS]" + tools + "[/AVAILABLE_TOOLS][INST]Be brief.\n\nThanks[/INST]");
  const auto v7 = render_tool_prompt(ChatFormat::MistralV7, weather_tools(ToolStyle::Mistral), tool_loop());
  ASSERT_TRUE(v7);
  EXPECT_TRUE(v7->starts_with("[SYSTEM_PROMPT] Be brief.[/SYSTEM_PROMPT][INST] Weather in Paris?[/INST]")) << *v7;
  EXPECT_TRUE(v7->ends_with("[/AVAILABLE_TOOLS][INST] Thanks[/INST]")) << *v7;
  // Without tools or a history of them, and in other formats: the plain renderers.
  ToolCalling none = weather_tools(ToolStyle::Mistral);
  none.choice = ToolChoice::None;
  std::vector<RequestMessage> plain(1);
  plain[0].message = {"user", "Hi"};
  EXPECT_FALSE(render_tool_prompt(ChatFormat::MistralV3, none, plain));
  EXPECT_FALSE(render_tool_prompt(ChatFormat::ChatML, weather_tools(), tool_loop()));
  const std::string id = tool_call_id(ToolStyle::Mistral);
  EXPECT_EQ(id.size(), 9u);
  EXPECT_TRUE(std::all_of(id.begin(), id.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; }));
  EXPECT_TRUE(tool_call_id(ToolStyle::Hermes).starts_with("call_"));
}

// A loop in the shape the Ministral 3 and Mistral Small 3.2 templates accept (user and
// assistant turns alternate, calls and results aside).
std::vector<RequestMessage> alternating_tool_loop() {
  std::vector<RequestMessage> m = tool_loop();
  m[2].tool_calls[0].id = "a1b2c3d4e";
  m[3].tool_call_id = "a1b2c3d4e";
  RequestMessage answer;
  answer.message = {"assistant", "Sunny.", std::string("It said sunny.")};
  m.insert(m.begin() + 4, answer);
  return m;
}

// What the templates (llama.cpp's models/templates: Mistral-Small-3.2-24B-Instruct-2506,
// mistralai-Ministral-3-14B-Reasoning-2512) write for it, rendered by their Jinja
// (tests/conformance's chat_template_conformance_test checks these renderers against it).
TEST(ToolCalls, MistralArgsTemplatesWriteTheirCallsAndResults) {
  const std::string tools =
      R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", "parameters": )"
      R"({"properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"], )"
      R"("type": "object"}}}, {"type": "function", "function": {"name": "get_time", "description": "", "parameters": {}}}])";
  const auto small = render_tool_prompt(ChatFormat::MistralSmall32, weather_tools(ToolStyle::MistralArgs),
                                        alternating_tool_loop());
  ASSERT_TRUE(small);
  EXPECT_EQ(*small, "[SYSTEM_PROMPT]Be brief.[/SYSTEM_PROMPT][INST]Weather in Paris?[/INST]"
                    R"([TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Paris", "days": 2}</s>)"
                    "[TOOL_RESULTS]a1b2c3d4e[TOOL_CONTENT]sunny[/TOOL_RESULTS]Sunny.</s>"
                    "[AVAILABLE_TOOLS]" + tools + "[/AVAILABLE_TOOLS][INST]Thanks[/INST]");
  const auto ministral = render_tool_prompt(ChatFormat::Ministral3, weather_tools(ToolStyle::MistralArgs),
                                            alternating_tool_loop());
  ASSERT_TRUE(ministral);
  EXPECT_EQ(*ministral, "[SYSTEM_PROMPT]Be brief.[/SYSTEM_PROMPT][AVAILABLE_TOOLS]" + tools +
                            "[/AVAILABLE_TOOLS][INST]Weather in Paris?[/INST]"
                            R"([TOOL_CALLS]get_weather[ARGS]{"city":"Paris","days":2}</s>)"
                            "[TOOL_RESULTS]sunny[/TOOL_RESULTS][THINK]It said sunny.[/THINK]Sunny.</s>[INST]Thanks[/INST]");
  EXPECT_EQ(tool_call_id(ToolStyle::MistralArgs).size(), 9u);
  EXPECT_EQ(tool_style(ChatFormat::MistralSmall32), ToolStyle::MistralArgs);
  EXPECT_EQ(tool_style(ChatFormat::Ministral3), ToolStyle::MistralArgs);
}

TEST(ToolCalls, WithoutActiveToolsOnlyTheHistoryIsRendered) {
  ToolCalling none = weather_tools();
  none.choice = ToolChoice::None;
  const tokenizer::ChatTemplate chat(ChatFormat::ChatML);
  const std::string prompt = chat.apply(render_tool_messages(ChatFormat::ChatML, none, tool_loop()), true);
  EXPECT_EQ(prompt.find("# Tools"), std::string::npos);
  EXPECT_NE(prompt.find("<tool_response>\nsunny\n</tool_response>"), std::string::npos);
}

TEST(ToolCalls, PythonJsonSeparators) {
  EXPECT_EQ(python_json(json::parse(R"({"b": [1, 2.5, true, null], "a": {"x": "\"q\""}, "e": {}, "f": []})")),
            R"({"a": {"x": "\"q\""}, "b": [1, 2.5, true, null], "e": {}, "f": []})");
}

// The split of `text` fed in pieces of `size` bytes (with last_to_finish, the last
// piece given to finish()).
ToolCallSplitter::Part split(const ToolCalling& calling, const std::string& text, size_t size,
                             bool last_to_finish = false) {
  int next = 0;
  ToolCallSplitter splitter(calling, [&] { return "call_" + std::to_string(next++); });
  ToolCallSplitter::Part all;
  auto add = [&](ToolCallSplitter::Part part) {
    all.content += part.content;
    for (auto& p : part.pieces) all.pieces.push_back(std::move(p));
    for (auto& c : part.calls) all.calls.push_back(std::move(c));
  };
  size_t i = 0;
  for (; i < text.size() && !(last_to_finish && i + size >= text.size()); i += size) {
    add(splitter.feed(std::string_view(text).substr(i, size)));
  }
  add(splitter.finish(i < text.size() ? std::string_view(text).substr(i) : std::string_view()));
  return all;
}

// Every piece size gives the same split, the last piece fed or given to finish().
ToolCallSplitter::Part split_all_ways(const ToolCalling& calling, const std::string& text) {
  const ToolCallSplitter::Part whole = split(calling, text, text.size() + 1);
  for (const auto& [size, last_to_finish] : std::vector<std::pair<size_t, bool>>{
           {1, false}, {2, false}, {3, false}, {7, false}, {1, true}, {7, true}, {text.size() + 1, true}}) {
    const ToolCallSplitter::Part part = split(calling, text, size, last_to_finish);
    EXPECT_EQ(part.content, whole.content) << "pieces of " << size;
    EXPECT_EQ(part.calls.size(), whole.calls.size()) << "pieces of " << size;
    for (size_t i = 0; i < std::min(part.calls.size(), whole.calls.size()); ++i) {
      EXPECT_EQ(part.calls[i].name, whole.calls[i].name);
      EXPECT_EQ(part.calls[i].arguments, whole.calls[i].arguments);
      EXPECT_EQ(part.calls[i].streamed, whole.calls[i].streamed);
    }
    // A streamed call's pieces: one header (its id and name) first, then pieces of its
    // arguments that make up the call's arguments.
    for (size_t i = 0; i < part.calls.size(); ++i) {
      std::string id, name, arguments;
      int headers = 0;
      for (const auto& piece : part.pieces) {
        if (piece.index != i) continue;
        if (!piece.id.empty() || !piece.name.empty()) {
          ++headers;
          EXPECT_TRUE(arguments.empty()) << "the header comes first";
          id = piece.id;
          name = piece.name;
        }
        arguments += piece.arguments;
      }
      if (!part.calls[i].streamed) continue;
      EXPECT_EQ(headers, 1) << "pieces of " << size;
      EXPECT_EQ(id, part.calls[i].id);
      EXPECT_EQ(name, part.calls[i].name);
      EXPECT_EQ(arguments, part.calls[i].arguments) << "pieces of " << size;
    }
  }
  return whole;
}

// A Hermes call streams as it comes: its header once the name is known, its arguments
// piece by piece (whitespace outside strings dropped, inside kept), before the block
// closes; arguments given as a string, an unknown tool or another order do not stream.
TEST(ToolCalls, HermesCallsStreamTheirArgumentsAsTheyCome) {
  ToolCalling calling = weather_tools();
  int next = 0;
  ToolCallSplitter splitter(calling, [&] { return "call_" + std::to_string(next++); });
  auto part = splitter.feed("Sure.\n<tool_call>\n{\"name\": \"get_weather\", ");
  EXPECT_EQ(part.content, "Sure.");
  EXPECT_TRUE(part.pieces.empty());
  part = splitter.feed("\"arguments\": {\"city\": \"Los ");
  ASSERT_EQ(part.pieces.size(), 2u);
  EXPECT_EQ(part.pieces[0].index, 0u);
  EXPECT_EQ(part.pieces[0].id, "call_0");
  EXPECT_EQ(part.pieces[0].name, "get_weather");
  EXPECT_EQ(part.pieces[1].arguments, "{\"city\":\"Los ");
  EXPECT_TRUE(part.calls.empty());
  part = splitter.feed("Angeles\",\n  \"days\": 3}}\n</tool_call>");
  ASSERT_EQ(part.pieces.size(), 1u);
  EXPECT_EQ(part.pieces[0].arguments, "Angeles\",\"days\":3}");
  ASSERT_EQ(part.calls.size(), 1u);
  EXPECT_TRUE(part.calls[0].streamed);
  EXPECT_EQ(part.calls[0].id, "call_0");
  EXPECT_EQ(part.calls[0].arguments, "{\"city\":\"Los Angeles\",\"days\":3}");
  for (const std::string text : {"<tool_call>{\"name\": \"get_time\", \"arguments\": \"{}\"}</tool_call>",
                                 "<tool_call>{\"arguments\": {}, \"name\": \"get_time\"}</tool_call>"}) {
    const auto r = split_all_ways(calling, text);
    ASSERT_EQ(r.calls.size(), 1u) << text;
    EXPECT_FALSE(r.calls[0].streamed) << text;
    EXPECT_TRUE(r.pieces.empty()) << text;
  }
  const auto unknown = split_all_ways(calling, "<tool_call>{\"name\": \"rm\", \"arguments\": {}}</tool_call>");
  EXPECT_TRUE(unknown.pieces.empty() && unknown.calls.empty());
  // Parallel calls: each its own index.
  calling.parallel = true;
  const auto two = split_all_ways(calling,
                                  "<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>\n"
                                  "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}</tool_call>");
  ASSERT_EQ(two.calls.size(), 2u);
  EXPECT_TRUE(two.calls[0].streamed && two.calls[1].streamed);
  EXPECT_EQ(two.pieces.front().index, 0u);
  EXPECT_EQ(two.pieces.back().index, 1u);
}

TEST(ToolCalls, HermesRepliesSplitIntoContentAndCalls) {
  ToolCalling calling = weather_tools();
  auto r = split_all_ways(calling, "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>");
  EXPECT_EQ(r.content, "Checking.");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].id, "call_0");
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, R"({"city":"Oslo"})");
  // The closing tag inside an argument is the argument's.
  r = split_all_ways(calling, "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"</tool_call>\\\"\"}}</tool_call>");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"city":"</tool_call>\""})");
  // Arguments given as JSON text, and a block the reply never closed.
  r = split_all_ways(calling, "<tool_call>{\"name\": \"get_time\", \"arguments\": \"{}\"}");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "{}");
  // Not calls: an unknown tool, arguments that are no object, JSON that does not parse,
  // a tag that never comes: all content, as written.
  for (const std::string& text :
       {std::string("<tool_call>\n{\"name\": \"rm\", \"arguments\": {}}\n</tool_call>"),
        std::string("<tool_call>{\"name\": \"get_time\", \"arguments\": 3}</tool_call>"),
        std::string("a <tool_call>{\"name\": \"get_time\"</tool_call> b"), std::string("x < y <tool_ca")}) {
    r = split_all_ways(calling, text);
    EXPECT_EQ(r.content, text);
    EXPECT_TRUE(r.calls.empty()) << text;
  }
  // Two calls: both with parallel_tool_calls, else the second is content.
  const std::string two =
      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", "
      "\"arguments\": {\"city\": \"Rome\"}}\n</tool_call>\n";
  r = split_all_ways(calling, two);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.content, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>");
  calling.parallel = true;
  r = split_all_ways(calling, two);
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[1].name, "get_weather");
  EXPECT_EQ(r.content, "");
  // A named choice takes only that tool.
  calling.choice = ToolChoice::Named;
  calling.named = "get_weather";
  r = split_all_ways(calling, two);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  // Inactive: everything is content.
  calling.choice = ToolChoice::None;
  EXPECT_EQ(split_all_ways(calling, two).content, two);
}

TEST(ToolCalls, QwenXmlParametersFollowTheirSchemaTypes) {
  const ToolCalling calling = weather_tools(ToolStyle::QwenXml);
  const auto r = split_all_ways(
      calling,
      "Sure.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n<parameter=days>\n3\n"
      "</parameter>\n</function>\n</tool_call>");
  EXPECT_EQ(r.content, "Sure.");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"city":"42","days":3})");  // city is a string, days a number
  EXPECT_TRUE(split_all_ways(calling, "<tool_call>\n<function=get_weather>\n<parameter=city>\nx\n</function>\n</tool_call>")
                  .calls.empty());
}

TEST(ToolCalls, MistralRepliesOpenWithToolCalls) {
  ToolCalling calling = weather_tools(ToolStyle::Mistral);
  auto r = split_all_ways(calling, R"(Let me see. [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Oslo"}, "id": "a1b2c3d4e"}, )"
                                   R"({"name": "get_time", "arguments": {}}])");
  EXPECT_EQ(r.content, "Let me see.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].arguments, R"({"city":"Oslo"})");
  EXPECT_TRUE(r.calls[0].streamed);  // the list's first call streams as it comes
  EXPECT_FALSE(r.calls[1].streamed);
  EXPECT_EQ(r.calls[1].name, "get_time");
  r = split_all_ways(calling, "[TOOL_CALLS] [{\"name\": \"nope\", \"arguments\": {}}]");
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, "[TOOL_CALLS] [{\"name\": \"nope\", \"arguments\": {}}]");
  EXPECT_EQ(split_all_ways(calling, "No [TOOL_CALL here").content, "No [TOOL_CALL here");
}

TEST(ToolCalls, MistralArgsCallsNameTheFunctionBeforeTheirArguments) {
  ToolCalling calling = weather_tools(ToolStyle::MistralArgs);
  calling.parallel = true;
  // Mistral Small 3.2's (a call id) and Ministral 3's (none) in one reply; the
  // arguments may hold the tags' text.
  auto r = split_all_ways(calling, "Let me see. [TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{\"city\": \"[ARGS]}\"}"
                                   "[TOOL_CALLS]get_time[ARGS]{} ");
  EXPECT_EQ(r.content, "Let me see.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, R"({"city":"[ARGS]}"})");
  EXPECT_TRUE(r.calls[0].streamed);  // every such call streams as it comes
  EXPECT_EQ(r.calls[1].name, "get_time");
  EXPECT_EQ(r.calls[1].arguments, "{}");
  EXPECT_TRUE(r.calls[1].streamed);
  // Without parallel calls, what follows the first is content.
  calling.parallel = false;
  r = split_all_ways(calling, "[TOOL_CALLS]get_time[ARGS]{}[TOOL_CALLS]get_time[ARGS]{}");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.content, "[TOOL_CALLS]get_time[ARGS]{}");
  // Not calls: an unknown tool, arguments that are not an object, a reply cut inside one.
  for (const std::string text : {"[TOOL_CALLS]nope[ARGS]{}", "[TOOL_CALLS]get_time[ARGS][1]",
                                 "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Os", "[TOOL_CALLS]get_time"}) {
    r = split_all_ways(calling, text);
    EXPECT_TRUE(r.calls.empty()) << text;
    EXPECT_EQ(r.content, text);
  }
}

TEST(ToolCalls, Llama3RepliesThatAreJsonAreCalls) {
  const ToolCalling calling = weather_tools(ToolStyle::Llama3);
  auto r = split_all_ways(calling, " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Lima\"}}");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"city":"Lima"})");
  EXPECT_TRUE(r.calls[0].streamed);
  EXPECT_EQ(r.content, "");
  r = split_all_ways(calling, "It is {sunny} today.");
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, "It is {sunny} today.");
  r = split_all_ways(calling, "{\"name\": \"get_weather\", \"parameters\": {\"city\": ");
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, "{\"name\": \"get_weather\", \"parameters\": {\"city\": ");
}

using testing::byte_vocabulary;
bool accepts(const std::string& grammar, const std::string& text) {
  return testing::grammar_accepts(grammar, text, kToolCallsRule);
}

// A random text the grammar allows: at each byte, one of those it allows (the end of
// generation when it may, with some chance).
std::string random_walk(const std::string& grammar, std::mt19937& rng) {
  sample::GrammarMatcher matcher(sample::Grammar::parse(grammar, kToolCallsRule), byte_vocabulary());
  std::string text;
  while (text.size() < 1500) {
    std::vector<int> allowed;
    for (int b = 0; b < 256; ++b) {
      if ((b >= 32 && b < 127) || b == '\n' ? matcher.allows(b) : false) allowed.push_back(b);
    }
    if (matcher.allows(256) && (allowed.empty() || rng() % 2 == 0)) return text;
    if (allowed.empty()) return text + "<stuck>";
    // Prefer the quote and the closing characters so that strings and numbers end.
    int pick = allowed[rng() % allowed.size()];
    for (int c : {'"', '}', ']', '<'}) {
      if (std::find(allowed.begin(), allowed.end(), c) != allowed.end() && rng() % 2 == 0) pick = c;
    }
    matcher.accept(pick);
    text += static_cast<char>(pick);
  }
  return text;
}

TEST(ToolCalls, ForcedGrammarsAcceptCallsAndOnlyCalls) {
  for (const ToolStyle style :
       {ToolStyle::Hermes, ToolStyle::Llama3, ToolStyle::QwenXml, ToolStyle::Mistral, ToolStyle::MistralArgs}) {
    ToolCalling calling = weather_tools(style);
    calling.choice = ToolChoice::Required;
    const std::string grammar = tool_call_grammar(calling);
    const std::string call =
        style == ToolStyle::Hermes    ? "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"
        : style == ToolStyle::Llama3  ? "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}"
        : style == ToolStyle::Mistral ? "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]"
        : style == ToolStyle::MistralArgs ? "[TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS]{\"city\": \"Oslo\"}"
                                      : "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>";
    EXPECT_TRUE(accepts(grammar, call)) << grammar;
    EXPECT_FALSE(accepts(grammar, "Hello")) << grammar;
    const std::string two = style == ToolStyle::Mistral
                                ? "[TOOL_CALLS] [{\"name\": \"get_time\", \"arguments\": {}}, {\"name\": \"get_time\", \"arguments\": {}}]"
                            : style == ToolStyle::MistralArgs ? call + "[TOOL_CALLS]get_time[ARGS]{}"
                                                              : call + "\n" + call;
    if (style == ToolStyle::MistralArgs) {
      EXPECT_TRUE(accepts(grammar, "[TOOL_CALLS]get_time[ARGS]{}")) << "without a call id";
      EXPECT_FALSE(accepts(grammar, "[TOOL_CALLS]get_time[CALL_ID]short[ARGS]{}")) << "ids are 9 letters and digits";
    }
    EXPECT_FALSE(accepts(grammar, two)) << "one call without parallel_tool_calls";
    calling.choice = ToolChoice::Named;
    calling.named = "get_time";
    EXPECT_FALSE(accepts(tool_call_grammar(calling), call)) << "only the named tool";
    if (style != ToolStyle::QwenXml) {
      calling.choice = ToolChoice::Required;
      EXPECT_FALSE(accepts(tool_call_grammar(calling),
                           style == ToolStyle::Hermes   ? "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>"
                           : style == ToolStyle::Llama3 ? "{\"name\": \"get_weather\", \"parameters\": {}}"
                           : style == ToolStyle::MistralArgs ? "[TOOL_CALLS]get_weather[ARGS]{}"
                                                        : "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {}}]"))
          << "city is required";
    }
    if (style != ToolStyle::Llama3) {
      calling.choice = ToolChoice::Required;
      calling.parallel = true;
      EXPECT_TRUE(accepts(tool_call_grammar(calling), two));
    }
  }
}

// What a constrained reply can be, it parses into calls of the allowed tools whose
// arguments hold what the schema requires.
TEST(ToolCalls, EveryTextAForcedGrammarAllowsParsesIntoCalls) {
  std::mt19937 rng(7);
  for (const ToolStyle style :
       {ToolStyle::Hermes, ToolStyle::Llama3, ToolStyle::QwenXml, ToolStyle::Mistral, ToolStyle::MistralArgs}) {
    for (const bool parallel : {false, true}) {
      ToolCalling calling = weather_tools(style);
      calling.choice = ToolChoice::Required;
      calling.parallel = parallel && style != ToolStyle::Llama3;
      const std::string grammar = tool_call_grammar(calling);
      int walks = 0;
      for (int i = 0; i < 25; ++i) {
        const std::string text = random_walk(grammar, rng);
        if (text.size() >= 1500) continue;  // a walk that did not end
        ASSERT_EQ(text.find("<stuck>"), std::string::npos) << text;
        ++walks;
        const auto r = split(calling, text, 5);
        ASSERT_FALSE(r.calls.empty()) << "style " << static_cast<int>(style) << ": " << text;
        EXPECT_EQ(r.content, "") << text;
        for (const ToolCall& call : r.calls) {
          const json arguments = json::parse(call.arguments);
          EXPECT_TRUE(arguments.is_object());
          if (call.name == "get_weather") {
            EXPECT_TRUE(arguments.contains("city")) << text;
            if (style != ToolStyle::QwenXml) {
              EXPECT_TRUE(arguments["city"].is_string()) << text;
              if (arguments.contains("days")) {
                EXPECT_TRUE(arguments["days"].is_number_integer()) << text;
              }
            }
          } else {
            EXPECT_EQ(call.name, "get_time");
          }
        }
      }
      EXPECT_GT(walks, 12);
    }
  }
}

}  // namespace
}  // namespace pico::coordinator::http_api
