#include "http/tool_calls.hpp"

#include <algorithm>
#include <cctype>
#include <utility>

#include "http/json_schema_grammar.hpp"
#include "http/random_id.hpp"

namespace pico::coordinator::http_api {

using json = nlohmann::json;
using tokenizer::ChatFormat;
using tokenizer::ChatMessage;

namespace {

constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";
constexpr std::string_view kMistralCalls = "[TOOL_CALLS]";
constexpr std::string_view kMistralArgs = "[ARGS]";
constexpr std::string_view kMistralCallId = "[CALL_ID]";

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// The longest suffix of `text` that is a proper prefix of `tag` (it may become the tag).
size_t partial_tag_suffix(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n) {
    if (tag.starts_with(text.substr(text.size() - n))) return n;
  }
  return 0;
}

// JSON text followed byte by byte: inside a string or not, and the nesting outside them.
struct JsonScan {
  bool in_string = false, escaped = false;
  int depth = 0;
  // True when `c` is outside every string (the quotes themselves are not).
  bool structural(char c) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      return false;
    }
    if (c == '"') {
      in_string = true;
      return false;
    }
    if (c == '{' || c == '[') ++depth;
    if (c == '}' || c == ']') --depth;
    return true;
  }
};

// Where the call's closing tag is: in a JSON call, outside its strings (an argument may
// hold the tag's text); npos while it has not come.
size_t find_close_tag(std::string_view text, bool json_body) {
  if (!json_body) return text.find(kCallClose);
  JsonScan scan;
  for (size_t i = 0; i < text.size(); ++i) {
    if (scan.structural(text[i]) && text[i] == '<' && text.substr(i).starts_with(kCallClose)) return i;
  }
  return std::string_view::npos;
}

// The head of a JSON call as it streams: {"name": "N", "arguments": (Llama 3:
// "parameters":) then the value; a Mistral list's first call after its '['.
// Wait: not all of it has come; Other: the body is not shaped so (it does not stream).
struct CallHead {
  enum Kind { Wait, Other, Head } kind = Wait;
  std::string name;
  size_t value_at = 0;
};
CallHead json_call_head(std::string_view body, bool in_list) {
  size_t i = 0;
  const auto skip = [&] {
    while (i < body.size() && is_space(body[i])) ++i;
    return i < body.size();
  };
  const auto literal = [&](char c) -> std::optional<bool> {
    if (!skip()) return std::nullopt;
    if (body[i] != c) return false;
    ++i;
    return true;
  };
  // A JSON string's text (its escapes decoded by the JSON parser).
  const auto string = [&]() -> std::optional<std::string> {
    if (!skip()) return std::nullopt;
    if (body[i] != '"') return std::string("\x01");  // not a string
    size_t end = i + 1;
    bool escaped = false;
    for (; end < body.size(); ++end) {
      if (escaped) escaped = false;
      else if (body[end] == '\\') escaped = true;
      else if (body[end] == '"') break;
    }
    if (end >= body.size()) return std::nullopt;
    const json value = json::parse(body.substr(i, end + 1 - i), nullptr, false);
    i = end + 1;
    return value.is_string() ? value.get<std::string>() : std::string("\x01");
  };
  CallHead head, other;
  other.kind = CallHead::Other;
  const auto step = [&](std::optional<bool> ok) {
    if (!ok) return false;
    if (!*ok) head.kind = CallHead::Other;
    return *ok;
  };
  if (in_list && !step(literal('['))) return head;
  if (!step(literal('{'))) return head;
  auto key = string();
  if (!key) return head;
  if (*key != "name") return other;
  if (!step(literal(':'))) return head;
  auto name = string();
  if (!name) return head;
  if (*name == "\x01") return other;
  if (!step(literal(','))) return head;
  key = string();
  if (!key) return head;
  if (*key != "arguments" && *key != "parameters") return other;
  if (!step(literal(':'))) return head;
  if (!skip()) return head;
  head.kind = CallHead::Head;
  head.name = std::move(*name);
  head.value_at = i;
  return head;
}

// A call of Mistral Small 3.2's or Ministral 3's templates after its [TOOL_CALLS]:
// name[CALL_ID]id[ARGS]{...} (Small 3.2) or name[ARGS]{...}. nullopt before [ARGS] came.
struct ArgsCall {
  std::string_view name, id;
  size_t value_at = 0;  // where the text after [ARGS] begins
};
std::optional<ArgsCall> args_call(std::string_view body) {
  const size_t args = body.find(kMistralArgs);
  if (args == std::string_view::npos) return std::nullopt;
  const std::string_view head = body.substr(0, args);
  const size_t id_at = head.find(kMistralCallId);
  ArgsCall call;
  call.name = trim(head.substr(0, id_at));
  if (id_at != std::string_view::npos) call.id = trim(head.substr(id_at + kMistralCallId.size()));
  call.value_at = args + kMistralArgs.size();
  return call;
}

// Where such a call ends: one past its arguments' closing '}' (outside strings); npos
// while it has not come, or when the arguments are not an object (the reply's end decides).
size_t args_call_end(std::string_view body) {
  const auto call = args_call(body);
  if (!call) return std::string_view::npos;
  size_t i = call->value_at;
  while (i < body.size() && is_space(body[i])) ++i;
  if (i == body.size() || body[i] != '{') return std::string_view::npos;
  JsonScan scan;
  for (; i < body.size(); ++i) {
    if (scan.structural(body[i]) && body[i] == '}' && scan.depth == 0) return i + 1;
  }
  return std::string_view::npos;
}

// Its head as it streams: the name once [ARGS] and the first byte after it came.
CallHead args_call_head(std::string_view body) {
  CallHead head;
  const auto call = args_call(body);
  if (!call) return head;
  size_t i = call->value_at;
  while (i < body.size() && is_space(body[i])) ++i;
  if (i == body.size()) return head;
  head.kind = CallHead::Head;
  head.name = std::string(call->name);
  head.value_at = i;
  return head;
}

std::string hermes_tools_block(const ToolCalling& calling) {
  std::string out =
      "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
      "function signatures within <tools></tools> XML tags:\n<tools>";
  for (const ToolFunction& t : calling.tools) out += "\n" + python_json(tool_definition(t));
  out +=
      "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
      "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
      "<args-json-object>}\n</tool_call>";
  return out;
}

std::string qwen_xml_tools_block(const ToolCalling& calling) {
  std::string out = "# Tools\n\nYou have access to the following functions:\n\n<tools>";
  for (const ToolFunction& t : calling.tools) out += "\n" + python_json(tool_definition(t));
  out +=
      "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
      "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
      "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
      "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified "
      "format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n- "
      "Required parameters MUST be specified\n- You may provide optional reasoning for your function call in natural "
      "language BEFORE the function call, but NOT after\n- If there is no function call available, answer the "
      "question like normal with your current knowledge and do not tell the user about function calls\n</IMPORTANT>";
  return out;
}

std::string llama3_tools_preamble(const ToolCalling& calling) {
  std::string out =
      "Given the following functions, please respond with a JSON for a function call with its proper arguments "
      "that best answers the given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": "
      "dictionary of argument name and its value}.Do not use variables.\n\n";
  for (const ToolFunction& t : calling.tools) out += tool_definition(t).dump(4) + "\n\n";
  return out;
}

json arguments_of(const ToolCall& call) {
  json args = json::parse(call.arguments, nullptr, false);
  return args.is_discarded() ? json(call.arguments) : args;
}

// Python's str() of a JSON scalar, as the Qwen3.5 template's `| string` writes it.
std::string python_str(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  if (v.is_null()) return "None";
  return v.dump();
}

// An assistant turn's calls appended to its content, in the format's syntax.
std::string with_calls(ToolStyle style, const std::string& content, const std::vector<ToolCall>& calls) {
  std::string out = content;
  for (size_t i = 0; i < calls.size(); ++i) {
    const ToolCall& c = calls[i];
    if (style == ToolStyle::Hermes || style == ToolStyle::Mistral) {
      if (i > 0 || !out.empty()) out += "\n";
      out += "<tool_call>\n{\"name\": \"" + c.name + "\", \"arguments\": " + python_json(arguments_of(c)) + "}\n" +
             std::string(kCallClose);
    } else if (style == ToolStyle::QwenXml) {
      if (i == 0) {
        out = std::string(trim(out));
        if (!out.empty()) out += "\n\n";
      } else {
        out += "\n";
      }
      out += "<tool_call>\n<function=" + c.name + ">\n";
      const json args = arguments_of(c);
      if (args.is_object()) {
        for (const auto& [key, value] : args.items()) {
          out += "<parameter=" + key + ">\n" + (value.is_structured() ? python_json(value) : python_str(value)) +
                 "\n</parameter>\n";
        }
      }
      out += "</function>\n" + std::string(kCallClose);
    } else {  // Llama 3: one call is the turn
      out = "{\"name\": \"" + c.name + "\", \"parameters\": " + python_json(arguments_of(c)) + "}";
    }
  }
  return out;
}

// Formats whose renderer writes `tool` turns itself (the Qwen templates).
bool renders_tool_turns(ChatFormat format) { return format == ChatFormat::Qwen3 || format == ChatFormat::Qwen35; }

// The request's tools as the Mistral templates' tojson writes them.
std::string mistral_tools(const ToolCalling& calling) {
  std::string out = "[";
  for (size_t t = 0; t < calling.tools.size(); ++t) out += (t ? ", " : "") + python_json(tool_definition(calling.tools[t]));
  return out + "]";
}

// Mistral Small 3.2's template (calls with [CALL_ID], results with theirs, the tools
// before the last user turn) and Ministral 3's / Devstral's (the tools after the system
// prompt, results without ids, an assistant's thinking before its text).
std::string mistral_args_prompt(ChatFormat format, const ToolCalling& calling, const std::vector<RequestMessage>& messages) {
  const bool small32 = format == ChatFormat::MistralSmall32;
  const std::string tools = calling.active() ? "[AVAILABLE_TOOLS]" + mistral_tools(calling) + "[/AVAILABLE_TOOLS]" : "";
  std::string out;
  size_t first = 0;
  if (!messages.empty() && messages[0].message.role == "system") {
    out += "[SYSTEM_PROMPT]" + messages[0].message.content + "[/SYSTEM_PROMPT]";
    first = 1;
  }
  if (!small32) out += tools;
  size_t last_user = messages.size();
  for (size_t i = first; i < messages.size(); ++i) {
    if (messages[i].message.role == "user") last_user = i;
  }
  for (size_t i = first; i < messages.size(); ++i) {
    const RequestMessage& m = messages[i];
    const std::string& role = m.message.role;
    if (role == "user") {
      if (small32 && i == last_user) out += tools;
      out += "[INST]" + m.message.content + "[/INST]";
    } else if (role == "assistant") {
      if (small32 && !m.tool_calls.empty()) {  // the calls are the turn: its text is not written
        for (const ToolCall& call : m.tool_calls) {
          out += std::string(kMistralCalls) + call.name + std::string(kMistralCallId) + call.id +
                 std::string(kMistralArgs) + python_json(arguments_of(call));
        }
      } else {
        const auto& reasoning = m.message.reasoning_content;
        if (!small32 && reasoning && !reasoning->empty()) out += "[THINK]" + *reasoning + "[/THINK]";
        out += m.message.content;
        for (const ToolCall& call : m.tool_calls) {  // arguments as given, as the template writes them
          out += std::string(kMistralCalls) + call.name + std::string(kMistralArgs) +
                 (call.arguments.empty() ? std::string("{}") : call.arguments);
        }
      }
      out += "</s>";
    } else if (role == "tool") {
      out += small32 ? "[TOOL_RESULTS]" + m.tool_call_id + "[TOOL_CONTENT]" + m.message.content + "[/TOOL_RESULTS]"
                     : "[TOOL_RESULTS]" + m.message.content + "[/TOOL_RESULTS]";
    } else {
      out += "[SYSTEM_PROMPT]" + m.message.content + "[/SYSTEM_PROMPT]";
    }
  }
  return out;
}

}  // namespace

ToolStyle tool_style(ChatFormat format) {
  switch (format) {
    case ChatFormat::Qwen35: return ToolStyle::QwenXml;
    case ChatFormat::Llama3:
    case ChatFormat::Llama31: return ToolStyle::Llama3;
    case ChatFormat::MistralV3:
    case ChatFormat::MistralV3Tekken:
    case ChatFormat::MistralV7:
    case ChatFormat::MistralV7Tekken: return ToolStyle::Mistral;
    case ChatFormat::MistralSmall32:
    case ChatFormat::Ministral3: return ToolStyle::MistralArgs;
    default: return ToolStyle::Hermes;
  }
}

std::string tool_call_id(ToolStyle style) {
  return style == ToolStyle::Mistral || style == ToolStyle::MistralArgs ? random_id("", 9) : random_id("call_");
}

std::optional<std::string> render_tool_prompt(ChatFormat format, const ToolCalling& calling,
                                              const std::vector<RequestMessage>& messages) {
  const ToolStyle style = tool_style(format);
  if (style != ToolStyle::Mistral && style != ToolStyle::MistralArgs) return std::nullopt;
  const bool history = std::any_of(messages.begin(), messages.end(), [](const RequestMessage& m) {
    return !m.tool_calls.empty() || m.message.role == "tool";
  });
  if (!calling.active() && !history) return std::nullopt;
  if (style == ToolStyle::MistralArgs) return mistral_args_prompt(format, calling, messages);
  // mistral-v3 and -v7 put a space after each tag, the tekken ones none.
  const bool spaced = format == ChatFormat::MistralV3 || format == ChatFormat::MistralV7;
  const bool system_prompt_tag = format == ChatFormat::MistralV7 || format == ChatFormat::MistralV7Tekken;
  const std::string space = spaced ? " " : "";
  size_t first = 0;
  std::string system;
  if (!messages.empty() && messages[0].message.role == "system") {
    system = messages[0].message.content;
    first = 1;
  }
  size_t last_user = messages.size();
  for (size_t i = first; i < messages.size(); ++i) {
    if (messages[i].message.role == "user") last_user = i;
  }
  std::string out;
  if (system_prompt_tag && first == 1) out += "[SYSTEM_PROMPT]" + space + system + "[/SYSTEM_PROMPT]";
  for (size_t i = first; i < messages.size(); ++i) {
    const RequestMessage& m = messages[i];
    const std::string& role = m.message.role;
    if (role == "user") {
      if (calling.active() && i == last_user) out += "[AVAILABLE_TOOLS]" + space + mistral_tools(calling) + "[/AVAILABLE_TOOLS]";
      // The v3 templates give the system message to the last turn when it is the user's.
      const bool with_system = !system_prompt_tag && first == 1 && i + 1 == messages.size();
      out += "[INST]" + space + (with_system ? system + "\n\n" : "") + m.message.content + "[/INST]";
    } else if (!m.tool_calls.empty()) {
      out += "[TOOL_CALLS]" + space + "[";
      for (size_t c = 0; c < m.tool_calls.size(); ++c) {
        const ToolCall& call = m.tool_calls[c];
        out += (c ? ", " : "") + std::string("{\"name\": ") + json(call.name).dump() +
               ", \"arguments\": " + python_json(arguments_of(call)) + ", \"id\": " + json(call.id).dump() + "}";
      }
      out += "]</s>";
    } else if (role == "assistant") {
      out += space + m.message.content + "</s>";
    } else if (role == "tool") {
      out += "[TOOL_RESULTS]" + space + "{\"content\": " + m.message.content + ", \"call_id\": " +
             json(m.tool_call_id).dump() + "}[/TOOL_RESULTS]";
    } else {
      // A system message after the first, as the plain renderer: a turn's instructions.
      out += "[INST]" + space + m.message.content + "[/INST]";
    }
  }
  return out;
}

const ToolFunction* ToolCalling::find(std::string_view name) const {
  for (const ToolFunction& t : tools) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

namespace {
template <class Json>
std::string python_json_of(const Json& value) {
  if (value.is_object()) {
    std::string out = "{";
    bool first = true;
    for (const auto& [key, v] : value.items()) {
      if (!first) out += ", ";
      first = false;
      out += Json(key).dump() + ": " + python_json_of(v);
    }
    return out + "}";
  }
  if (value.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < value.size(); ++i) out += (i ? ", " : "") + python_json_of(value[i]);
    return out + "]";
  }
  return value.dump(-1, ' ', false, Json::error_handler_t::replace);
}
}  // namespace

std::string python_json(const json& value) { return python_json_of(value); }
std::string python_json(const nlohmann::ordered_json& value) { return python_json_of(value); }

nlohmann::ordered_json tool_definition(const ToolFunction& tool) {
  nlohmann::ordered_json function = nlohmann::ordered_json::object();
  function["name"] = tool.name;
  function["description"] = tool.description;
  function["parameters"] = nlohmann::ordered_json::parse(tool.parameters.dump());
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  out["type"] = "function";
  out["function"] = std::move(function);
  return out;
}

std::vector<ChatMessage> render_tool_messages(ChatFormat format, const ToolCalling& calling,
                                              const std::vector<RequestMessage>& messages) {
  const ToolStyle style = tool_style(format);
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const RequestMessage& m = messages[i];
    ChatMessage rendered = m.message;
    if (!m.tool_calls.empty()) rendered.content = with_calls(style, rendered.content, m.tool_calls);
    if (rendered.role == "tool") {
      if (style == ToolStyle::Llama3) {
        rendered.role = "ipython";
      } else if (!renders_tool_turns(format)) {
        // Consecutive results share one user turn, as the Qwen2.5 / Hermes templates write them.
        const std::string response = "<tool_response>\n" + rendered.content + "\n</tool_response>";
        if (i > 0 && messages[i - 1].message.role == "tool") {
          out.back().content += "\n" + response;
          continue;
        }
        rendered.role = "user";
        rendered.content = response;
      }
    }
    out.push_back(std::move(rendered));
  }
  if (!calling.active()) return out;
  const bool has_system = !out.empty() && out.front().role == "system";
  if (style == ToolStyle::Llama3) {
    // The tools in the first user message; Llama 3.1's renderer writes its system block
    // for tools itself, for Llama 3.0 (no tool template) the same block is written here.
    if (format == ChatFormat::Llama3) {
      const std::string environment =
          "Environment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n";
      if (has_system) {
        out.front().content = environment + std::string(trim(out.front().content));
      } else {
        out.insert(out.begin(), ChatMessage{"system", environment});
      }
    }
    for (ChatMessage& m : out) {
      if (m.role == "user") {
        m.content = llama3_tools_preamble(calling) + std::string(trim(m.content));
        break;
      }
    }
    return out;
  }
  if (style == ToolStyle::QwenXml) {
    const std::string system = has_system ? std::string(trim(out.front().content)) : "";
    const std::string text = qwen_xml_tools_block(calling) + (system.empty() ? "" : "\n\n" + system);
    if (has_system) {
      out.front().content = text;
    } else {
      out.insert(out.begin(), ChatMessage{"system", text});
    }
    return out;
  }
  if (has_system) {
    out.front().content += "\n\n" + hermes_tools_block(calling);
  } else {
    out.insert(out.begin(), ChatMessage{"system", hermes_tools_block(calling)});
  }
  return out;
}

namespace {

std::string gbnf_literal(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// The schema of one call's JSON object, its name fixed: {"name": ..., key: arguments}.
nlohmann::ordered_json call_schema(const ToolFunction& tool, const char* arguments_key) {
  nlohmann::ordered_json parameters = nlohmann::ordered_json::parse(tool.parameters.dump());
  if (!parameters.is_object() || parameters.empty()) parameters = {{"type", "object"}};
  nlohmann::ordered_json schema = nlohmann::ordered_json::object();
  schema["type"] = "object";
  schema["properties"] = nlohmann::ordered_json::object();
  schema["properties"]["name"] = {{"const", tool.name}};
  schema["properties"][arguments_key] = parameters;
  schema["required"] = {"name", arguments_key};
  schema["additionalProperties"] = false;
  return schema;
}

std::vector<const ToolFunction*> allowed_tools(const ToolCalling& calling) {
  std::vector<const ToolFunction*> out;
  for (const ToolFunction& t : calling.tools) {
    if (calling.choice != ToolChoice::Named || t.name == calling.named) out.push_back(&t);
  }
  return out;
}

std::string qwen_xml_grammar(const ToolCalling& calling) {
  std::string rules;
  std::string functions;
  const auto tools = allowed_tools(calling);
  for (size_t i = 0; i < tools.size(); ++i) {
    const ToolFunction& t = *tools[i];
    const std::string rule = "pico-function-" + std::to_string(i);
    functions += (i ? " | " : "") + rule;
    rules += rule + " ::= " + gbnf_literal(t.name + ">\n");
    const json* required = t.parameters.contains("required") ? &t.parameters["required"] : nullptr;
    if (required && required->is_array()) {
      for (const json& key : *required) {
        if (!key.is_string()) continue;
        rules += " " + gbnf_literal("<parameter=" + key.get<std::string>() + ">\n") + " pico-value " +
                 gbnf_literal("\n</parameter>\n");
      }
    }
    rules += "\n";
  }
  const std::string block = "pico-block ::= " + gbnf_literal("<tool_call>\n<function=") + " (" + functions + ") " +
                            gbnf_literal("</function>\n</tool_call>") + "\n";
  const std::string root = calling.parallel ? "pico-tool-calls ::= pico-block (\"\\n\" pico-block)*\n"
                                            : "pico-tool-calls ::= pico-block\n";
  // A value runs to the next tag: no '<' in it.
  return root + block + rules + "pico-value ::= [^<]*\n";
}

// GBNF text with every rule name prefixed (references too), so that several converted
// schemas live in one grammar: names are words outside literals, classes and {m,n}.
std::string prefixed_rules(std::string_view gbnf, const std::string& prefix) {
  const auto is_word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_'; };
  std::string out;
  for (size_t i = 0; i < gbnf.size();) {
    const char c = gbnf[i];
    if (c == '"' || c == '[') {  // a literal or a class, escapes included
      const char close = c == '"' ? '"' : ']';
      size_t end = i + 1;
      while (end < gbnf.size() && gbnf[end] != close) end += gbnf[end] == '\\' ? 2 : 1;
      end = std::min(end + 1, gbnf.size());
      out.append(gbnf.substr(i, end - i));
      i = end;
    } else if (c == '{' || c == '#') {  // a repetition count, a comment
      const size_t end = std::min(gbnf.find(c == '{' ? '}' : '\n', i), gbnf.size());
      out.append(gbnf.substr(i, end - i));
      i = end;
    } else if (is_word(c)) {
      size_t end = i;
      while (end < gbnf.size() && is_word(gbnf[end])) ++end;
      out += prefix;
      out.append(gbnf.substr(i, end - i));
      i = end;
    } else {
      out += c;
      ++i;
    }
  }
  return out;
}

// [TOOL_CALLS]name[ARGS]{...} calls (Mistral Small 3.2's with an optional [CALL_ID]):
// each tool's arguments by its own converted schema, its rules under their own prefix.
std::string mistral_args_grammar(const ToolCalling& calling) {
  std::string rules, functions;
  const auto tools = allowed_tools(calling);
  for (size_t i = 0; i < tools.size(); ++i) {
    nlohmann::ordered_json parameters = nlohmann::ordered_json::parse(tools[i]->parameters.dump());
    if (!parameters.is_object() || parameters.empty()) parameters = {{"type", "object"}};
    const std::string prefix = "pico-args-" + std::to_string(i) + "-";
    rules += prefixed_rules(json_schema_to_grammar(parameters), prefix);
    if (!rules.ends_with('\n')) rules += '\n';
    functions += (i ? " | " : "") + gbnf_literal(tools[i]->name) + " pico-call-id? " +
                 gbnf_literal(std::string(kMistralArgs)) + " " + prefix + "root";
  }
  std::string start = calling.parallel ? "pico-tool-calls ::= pico-call+\n" : "pico-tool-calls ::= pico-call\n";
  start += "pico-call ::= " + gbnf_literal(std::string(kMistralCalls)) + " (" + functions + ")\n";
  start += "pico-call-id ::= " + gbnf_literal(std::string(kMistralCallId)) + " [a-zA-Z0-9]{9}\n";
  return start + rules;
}

}  // namespace

std::string tool_call_grammar(const ToolCalling& calling) {
  if (calling.style == ToolStyle::QwenXml) return qwen_xml_grammar(calling);
  if (calling.style == ToolStyle::MistralArgs) return mistral_args_grammar(calling);
  const char* arguments_key = calling.style == ToolStyle::Llama3 ? "parameters" : "arguments";
  const auto tools = allowed_tools(calling);
  nlohmann::ordered_json schema;
  if (tools.size() == 1) {
    schema = call_schema(*tools[0], arguments_key);
  } else {
    schema = {{"anyOf", nlohmann::ordered_json::array()}};
    for (const ToolFunction* t : tools) schema["anyOf"].push_back(call_schema(*t, arguments_key));
  }
  if (calling.style == ToolStyle::Mistral) {  // one array of calls
    nlohmann::ordered_json array = {{"type", "array"}, {"items", schema}, {"minItems", 1}};
    if (!calling.parallel) array["maxItems"] = 1;
    schema = array;
  }
  // The converter's start rule is "root": rename it by writing ours around it.
  std::string call = json_schema_to_grammar(schema);
  std::string start;
  if (calling.style == ToolStyle::Mistral) {
    start = "pico-tool-calls ::= " + gbnf_literal(std::string(kMistralCalls)) + " \" \"? root\n";
  } else if (calling.style == ToolStyle::Llama3) {
    start = "pico-tool-calls ::= root\n";  // Llama 3.1's template takes one call a turn
  } else {
    start = "pico-tool-call ::= " + gbnf_literal("<tool_call>\n") + " root " + gbnf_literal("\n</tool_call>") + "\n";
    start += calling.parallel ? "pico-tool-calls ::= pico-tool-call (\"\\n\" pico-tool-call)*\n"
                              : "pico-tool-calls ::= pico-tool-call\n";
  }
  return start + call;
}

std::vector<std::string> tool_syntax_tags(ToolStyle style) {
  switch (style) {
    case ToolStyle::Llama3: return {};
    case ToolStyle::Mistral: return {std::string(kMistralCalls)};
    case ToolStyle::MistralArgs: return {std::string(kMistralCalls), std::string(kMistralCallId), std::string(kMistralArgs)};
    default: return {std::string(kCallOpen), std::string(kCallClose)};
  }
}

std::vector<std::string> tool_call_triggers(ToolStyle style) {
  if (style == ToolStyle::Llama3) return {"{\"name\""};
  if (style == ToolStyle::Mistral || style == ToolStyle::MistralArgs) return {std::string(kMistralCalls)};
  return {std::string(kCallOpen)};
}

ToolCallSplitter::ToolCallSplitter(ToolCalling calling, std::function<std::string()> make_id)
    : calling_(std::move(calling)), make_id_(std::move(make_id)), active_(calling_.active()) {
  if (active_ && calling_.style == ToolStyle::Llama3) state_ = State::Llama3Start;
}

size_t ToolCallSplitter::find_close(std::string_view text) const {
  return find_close_tag(text, calling_.style == ToolStyle::Hermes);
}

void ToolCallSplitter::emit_content(Part& out, std::string_view text) {
  // Whitespace is held: if a call follows it, it goes; so does the whitespace after a call.
  if (after_call_) {
    while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
    if (!text.empty()) after_call_ = false;
  }
  if (text.empty()) return;
  size_t end = text.size();
  while (end > 0 && is_space(text[end - 1])) --end;
  if (end > 0) {
    out.content += held_space_;
    held_space_.clear();
    out.content.append(text.substr(0, end));
  }
  held_space_.append(text.substr(end));
}

bool ToolCallSplitter::take_call(Part& out, std::string_view body) {
  std::vector<ToolCall> calls;
  auto add = [&](const std::string& name, const json& arguments) {
    if (!calling_.find(name) || !arguments.is_object()) return false;
    if (calling_.choice == ToolChoice::Named && name != calling_.named) return false;
    calls.push_back({make_id_ ? make_id_() : std::string(), name, arguments.dump(-1, ' ', false, json::error_handler_t::replace)});
    return true;
  };
  // {"name": ..., "arguments" | "parameters": {...}}; arguments may come as JSON text.
  auto json_call = [&](const json& call) {
    if (!call.is_object() || !call.contains("name") || !call["name"].is_string()) return false;
    json arguments = call.contains("arguments") ? call["arguments"] : call.value("parameters", json());
    if (arguments.is_string()) arguments = json::parse(arguments.get<std::string>(), nullptr, false);
    return add(call["name"].get<std::string>(), arguments);
  };
  const std::string_view text = trim(body);
  if (calling_.style == ToolStyle::QwenXml) {
    constexpr std::string_view kFunction = "<function=", kFunctionEnd = "</function>";
    constexpr std::string_view kParameter = "<parameter=", kParameterEnd = "</parameter>";
    if (!text.starts_with(kFunction) || !text.ends_with(kFunctionEnd)) return false;
    std::string_view rest = text.substr(kFunction.size(), text.size() - kFunction.size() - kFunctionEnd.size());
    const size_t name_end = rest.find('>');
    if (name_end == std::string_view::npos) return false;
    const std::string name(rest.substr(0, name_end));
    const ToolFunction* tool = calling_.find(name);
    if (!tool) return false;
    rest = trim(rest.substr(name_end + 1));
    json arguments = json::object();
    while (!rest.empty()) {
      if (!rest.starts_with(kParameter)) return false;
      const size_t key_end = rest.find('>');
      const size_t value_end = rest.find(kParameterEnd);
      if (key_end == std::string_view::npos || value_end == std::string_view::npos || value_end < key_end) return false;
      const std::string key(rest.substr(kParameter.size(), key_end - kParameter.size()));
      std::string_view value = rest.substr(key_end + 1, value_end - key_end - 1);
      if (value.starts_with('\n')) value.remove_prefix(1);
      if (value.ends_with('\n')) value.remove_suffix(1);
      // A string parameter is the text as it stands; any other is JSON where it parses.
      const json* schema = tool->parameters.contains("properties") && tool->parameters["properties"].contains(key)
                               ? &tool->parameters["properties"][key]
                               : nullptr;
      const bool is_string = schema && schema->is_object() && schema->value("type", json()) == "string";
      const json parsed = is_string ? json(json::value_t::discarded) : json::parse(value, nullptr, false);
      arguments[key] = parsed.is_discarded() ? json(std::string(value)) : parsed;
      rest = trim(rest.substr(value_end + kParameterEnd.size()));
    }
    if (!add(name, arguments)) return false;
  } else if (calling_.style == ToolStyle::Mistral) {
    const json list = json::parse(text, nullptr, false);
    if (!list.is_array() || list.empty()) return false;
    for (const json& call : list) {
      if (!json_call(call)) return false;
    }
  } else if (calling_.style == ToolStyle::MistralArgs) {
    const auto call = args_call(text);
    if (!call || !add(std::string(call->name), json::parse(text.substr(call->value_at), nullptr, false))) return false;
  } else if (calling_.style == ToolStyle::Llama3) {
    // One object, or several separated by ';' or whitespace.
    std::string_view rest = text;
    while (!rest.empty()) {
      size_t end = 0;
      JsonScan scan;
      while (end < rest.size()) {
        const char c = rest[end++];
        if (scan.structural(c) && (c == '}' || c == ']') && scan.depth == 0) break;
      }
      const json call = json::parse(rest.substr(0, end), nullptr, false);
      if (call.is_discarded() || !json_call(call)) return false;
      rest = trim(rest.substr(end));
      if (rest.starts_with(';')) rest = trim(rest.substr(1));
    }
    if (calls.empty()) return false;
  } else {
    if (!json_call(json::parse(text, nullptr, false))) return false;
  }
  if (const Streaming& st = streaming_; st.on) {
    // The (first) call went out as it came: its id, and its arguments' text as sent (the
    // same JSON value as parsed, without the whitespace outside strings).
    if (calls.empty() || !st.ended || calls.front().name != st.name ||
        json::parse(st.arguments, nullptr, false) != json::parse(calls.front().arguments)) {
      return false;
    }
    calls.front().id = st.id;
    calls.front().arguments = st.arguments;
    calls.front().streamed = true;
  }
  held_space_.clear();  // the whitespace between content and a call is neither's
  after_call_ = true;
  for (ToolCall& c : calls) out.calls.push_back(std::move(c));
  calls_ += calls.size();
  return true;
}

void ToolCallSplitter::stream_call(Part& out) {
  Streaming& st = streaming_;
  if (!st.decided) {
    const CallHead head = calling_.style == ToolStyle::MistralArgs ? args_call_head(pending_)
                                                                   : json_call_head(pending_, calling_.style == ToolStyle::Mistral);
    if (head.kind == CallHead::Wait) return;
    st.decided = true;
    const bool allowed = head.kind == CallHead::Head && calling_.find(head.name) &&
                         (calling_.choice != ToolChoice::Named || head.name == calling_.named);
    if (!allowed || pending_[head.value_at] != '{') return;  // arguments as a JSON string: whole only
    st.on = true;
    st.id = make_id_ ? make_id_() : std::string();
    st.name = head.name;
    st.scanned = head.value_at;
    out.pieces.push_back({calls_, st.id, st.name, {}});
  }
  if (!st.on || st.ended) return;
  std::string piece;
  for (; st.scanned < pending_.size() && !st.ended; ++st.scanned) {
    const char c = pending_[st.scanned];
    if (st.in_string) {
      if (st.escaped) st.escaped = false;
      else if (c == '\\') st.escaped = true;
      else if (c == '"') st.in_string = false;
    } else if (c == '"') {
      st.in_string = true;
    } else if (is_space(c)) {
      continue;  // outside strings: dropped
    } else if (c == '{' || c == '[') {
      ++st.depth;
    } else if (c == '}' || c == ']') {
      st.ended = --st.depth == 0;
    }
    piece += c;
  }
  st.arguments += piece;
  if (!piece.empty()) out.pieces.push_back({calls_, {}, {}, std::move(piece)});
}

void ToolCallSplitter::run(Part& out, bool final) {
  while (true) {
    if (state_ == State::Llama3Start) {
      size_t at = 0;
      while (at < pending_.size() && is_space(pending_[at])) ++at;
      if (at == pending_.size() && !final) return;  // nothing but whitespace yet
      if (at < pending_.size() && pending_[at] == '{') {
        state_ = State::InCall;  // the whole reply is the call
        continue;
      }
      state_ = State::Content;
      continue;
    }
    if (state_ == State::InCall) {
      if (calling_.style == ToolStyle::MistralArgs) {  // one call, ended by its arguments' object
        stream_call(out);
        const size_t end = args_call_end(pending_);
        if (end == std::string::npos && !final) return;
        const std::string body = end == std::string::npos ? pending_ : pending_.substr(0, end);
        if (!take_call(out, body)) emit_content(out, std::string(kMistralCalls) + body);
        pending_.erase(0, body.size());
        state_ = State::Content;
        streaming_ = {};
        continue;
      }
      if (calling_.style == ToolStyle::Llama3 || calling_.style == ToolStyle::Mistral) {
        stream_call(out);
        if (!final) return;  // the calls run to the end of the reply
        const std::string_view opened = calling_.style == ToolStyle::Mistral ? kMistralCalls : std::string_view();
        if (!take_call(out, pending_)) emit_content(out, std::string(opened) + pending_);
        pending_.clear();
        state_ = State::Content;
        streaming_ = {};
        return;
      }
      if (calling_.style == ToolStyle::Hermes) stream_call(out);
      const size_t close = find_close(pending_);
      if (close == std::string::npos) {
        if (!final) return;
        // The reply ended inside the block (a stop word, end of generation): a call if it parses.
        if (!take_call(out, pending_)) emit_content(out, std::string(kCallOpen) + pending_);
        pending_.clear();
        state_ = State::Content;
        streaming_ = {};
        return;
      }
      const std::string body = pending_.substr(0, close);
      if (!take_call(out, body)) emit_content(out, std::string(kCallOpen) + body + std::string(kCallClose));
      pending_.erase(0, close + kCallClose.size());
      state_ = State::Content;
      streaming_ = {};
      continue;
    }
    // Content. Without parallel calls, nothing after the first call is parsed.
    const bool mistral = calling_.style == ToolStyle::Mistral || calling_.style == ToolStyle::MistralArgs;
    const std::string_view opening = mistral ? kMistralCalls : kCallOpen;
    const bool parse = active_ && calling_.style != ToolStyle::Llama3 && (calling_.parallel || calls_ == 0);
    const size_t open = parse ? pending_.find(opening) : std::string::npos;
    if (open != std::string::npos) {
      emit_content(out, std::string_view(pending_).substr(0, open));
      pending_.erase(0, open + opening.size());
      state_ = State::InCall;
      continue;
    }
    const size_t keep = parse && !final ? partial_tag_suffix(pending_, opening) : 0;
    emit_content(out, std::string_view(pending_).substr(0, pending_.size() - keep));
    pending_.erase(0, pending_.size() - keep);
    return;
  }
}

ToolCallSplitter::Part ToolCallSplitter::feed(std::string_view piece) {
  Part out;
  if (!active_) {
    out.content = std::string(piece);
    return out;
  }
  pending_.append(piece);
  run(out, false);
  return out;
}

ToolCallSplitter::Part ToolCallSplitter::finish(std::string_view last) {
  Part out;
  if (!active_) {
    out.content = std::string(last);
    return out;
  }
  pending_.append(last);
  run(out, true);
  if (calls_ == 0) out.content += held_space_;  // the trailing whitespace of a reply without calls stays
  held_space_.clear();
  return out;
}

}  // namespace pico::coordinator::http_api
