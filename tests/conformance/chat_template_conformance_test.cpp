// pico's chat prompts against the models' own Jinja templates.
//
// The templates are llama.cpp's models/templates (read from node-llama-cpp's git bundle
// of llama.cpp's source); chat_template_reference.mjs renders them through
// @huggingface/jinja, node-llama-cpp's template engine, after adapting the messages as
// llama.cpp does. pico recognises each template (ChatTemplate::from_text: its format
// and default system message) and renders the same request through its HTTP API's
// parser (/apply-template's); the prompts must be equal, byte for byte.
//
// Fails, never skips, when node, git or the bundle is missing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fake_stage_test.hpp"  // tiny_tokenizer: the parser needs one; the prompt text is compared
#include "http/request_parsing.hpp"
#include "tokenizer/chat_template.hpp"
#include "tokenizer/tokenizer.hpp"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;  // the request as a client writes it, in its order
using namespace pico;

// Runs `command` with `input` on its standard input; its standard output.
std::string run(const std::string& command, const std::string& input = {}) {
  const fs::path in = fs::temp_directory_path() / ("pico-chat-template-" + std::to_string(getpid()) + ".json");
  std::ofstream(in, std::ios::binary) << input;
  std::string out;
  FILE* pipe = popen((command + " < '" + in.string() + "'").c_str(), "r");
  if (!pipe) {
    ADD_FAILURE() << "cannot run: " << command;
    return out;
  }
  char buffer[1 << 16];
  size_t n = 0;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  EXPECT_EQ(pclose(pipe), 0) << "command failed: " << command;
  fs::remove(in);
  return out;
}

// llama.cpp's models/templates/<name>.jinja, from a clone of the bundle made once.
std::string llama_cpp_template(const std::string& name) {
  static const fs::path clone = [] {
    const fs::path dir = fs::temp_directory_path() / ("pico-llama-cpp-" + std::to_string(getpid()));
    fs::remove_all(dir);
    run("git clone -q --no-checkout '" PICO_LLAMA_CPP_BUNDLE "' '" + dir.string() + "' 2>&1");
    return dir;
  }();
  return run("git -C '" + clone.string() + "' show HEAD:models/templates/" + name + ".jinja");
}

// The parameters' keys in sorted order: pico reads requests into sorted JSON objects
// (llama.cpp keeps a schema's keys in the request's order), so only a schema written
// sorted renders the same in both. The second tool has neither description nor
// parameters: llama.cpp writes "" and {} for them.
const json kTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
    "parameters": {"properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"], "type": "object"}}},
  {"type": "function", "function": {"name": "get_time"}}])");

json message(const std::string& role, const std::string& content) { return {{"role", role}, {"content", content}}; }

// A tool loop as OpenAI clients send it (user and assistant turns alternate, calls and
// results aside, as every template here accepts), with or without a system message.
json tool_loop(bool system, bool reasoning) {
  json messages = json::array();
  if (system) messages.push_back(message("system", "Be brief."));
  messages.push_back(message("user", "Weather in Paris?"));
  messages.push_back({{"role", "assistant"},
                      {"content", ""},
                      {"tool_calls", json::array({{{"id", "a1b2c3d4e"},
                                                   {"type", "function"},
                                                   {"function", {{"name", "get_weather"},
                                                                 {"arguments", R"({"city": "Paris", "days": 2})"}}}}})}});
  messages.push_back({{"role", "tool"}, {"tool_call_id", "a1b2c3d4e"}, {"content", "sunny"}});
  json answer = message("assistant", "Sunny in Paris.");
  if (reasoning) answer["reasoning_content"] = "The tool said sunny.";
  messages.push_back(answer);
  messages.push_back(message("user", "Thanks. And the time?"));
  return messages;
}

json chat(bool system) {
  json messages = json::array();
  if (system) messages.push_back(message("system", "You are terse."));
  messages.push_back(message("user", "Hello"));
  messages.push_back(message("assistant", "Hi there"));
  messages.push_back(message("user", "How are you?"));
  return messages;
}

struct Case {
  std::string template_name;
  std::string what;
  json messages;
  bool tools = false;
  bool object_arguments = false;  // llama.cpp hands this template call arguments as objects
  bool thinking_blocks = false;   // ... and reasoning as thinking blocks
};

std::vector<Case> cases() {
  std::vector<Case> out;
  // Mistral Small 3.2: calls with [CALL_ID], results with theirs; its default system
  // message (with today's date) when a request has none.
  const std::string small = "Mistral-Small-3.2-24B-Instruct-2506";
  out.push_back({small, "tool loop", tool_loop(true, false), true, true});
  out.push_back({small, "tool loop, default system", tool_loop(false, false), true, true});
  out.push_back({small, "chat", chat(true), false, true});
  out.push_back({small, "chat, default system", chat(false), false, true});
  // Devstral Small 2507 and Ministral 3 (reasoning): name[ARGS]{...}.
  const std::string devstral = "unsloth-mistral-Devstral-Small-2507";
  out.push_back({devstral, "tool loop", tool_loop(true, false), true});
  out.push_back({devstral, "tool loop, default system", tool_loop(false, false), true});
  out.push_back({devstral, "chat", chat(true)});
  const std::string ministral = "mistralai-Ministral-3-14B-Reasoning-2512";
  out.push_back({ministral, "tool loop", tool_loop(true, true), true, false, true});
  out.push_back({ministral, "tool loop, default system", tool_loop(false, true), true, false, true});
  out.push_back({ministral, "chat", chat(true), false, false, true});
  out.push_back({ministral, "chat, default system", chat(false), false, false, true});
  // The formats pico had already, on the same conversations.
  const std::string nemo = "mistralai-Mistral-Nemo-Instruct-2407";
  out.push_back({nemo, "tool loop", tool_loop(true, false), true, true});
  out.push_back({nemo, "chat", chat(true)});
  const std::string qwen25 = "Qwen-Qwen2.5-7B-Instruct";
  out.push_back({qwen25, "tool loop", tool_loop(true, false), true, true});
  out.push_back({qwen25, "chat", chat(true)});
  out.push_back({qwen25, "chat, default system", chat(false)});
  const std::string qwen3 = "Qwen-Qwen3-0.6B";
  out.push_back({qwen3, "tool loop", tool_loop(true, true), true, true});
  out.push_back({qwen3, "chat", chat(false)});
  const std::string qwen35 = "Qwen3.5-4B";
  out.push_back({qwen35, "tool loop", tool_loop(true, true), true, true});
  out.push_back({qwen35, "chat", chat(true)});
  const std::string llama31 = "meta-llama-Llama-3.1-8B-Instruct";
  out.push_back({llama31, "tool loop", tool_loop(true, false), true, true});
  out.push_back({llama31, "chat", chat(true)});
  out.push_back({"google-gemma-2-2b-it", "chat", chat(false)});
  out.push_back({"microsoft-Phi-3.5-mini-instruct", "chat", chat(true)});
  return out;
}

TEST(ChatTemplateConformance, PromptsEqualTheTemplatesOwn) {
  const auto tok = coordinator::testing::tiny_tokenizer();
  json requests = json::array();
  const std::vector<Case> all = cases();
  for (const Case& c : all) {
    json r = {{"template", llama_cpp_template(c.template_name)},
              {"messages", c.messages},
              {"object_arguments", c.object_arguments},
              {"thinking_blocks", c.thinking_blocks}};
    if (c.tools) r["tools"] = kTools;
    requests.push_back(std::move(r));
  }
  const std::string output = run("'" PICO_NODE_EXECUTABLE "' '" PICO_CHAT_TEMPLATE_REFERENCE_SCRIPT "'", requests.dump());
  const json reference = json::parse(output, nullptr, false);
  ASSERT_TRUE(reference.is_array() && reference.size() == all.size()) << output.substr(0, 2000);
  for (size_t i = 0; i < all.size(); ++i) {
    const Case& c = all[i];
    SCOPED_TRACE(c.template_name + ": " + c.what);
    ASSERT_TRUE(reference[i].contains("prompt")) << reference[i].dump();
    const tokenizer::ChatTemplate chat = tokenizer::ChatTemplate::from_text(requests[i]["template"].get<std::string>());
    coordinator::http_api::ParseContext ctx{*tok, &chat, 4096, "M", "/models/M.gguf"};
    json body = {{"messages", c.messages}};
    if (c.tools) body["tools"] = kTools;
    EXPECT_EQ(coordinator::http_api::parse_apply_template_request(ctx, nlohmann::json(body)),
              reference[i]["prompt"].get<std::string>())
        << "format " << chat.name();
  }
}

}  // namespace
