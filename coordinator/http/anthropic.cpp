#include "http/anthropic.hpp"

#include "http/request_parsing.hpp"

namespace pico::coordinator::http_api {

namespace {

[[noreturn]] void invalid(const std::string& name, const std::string& what) {
  throw ApiError(400, "'" + name + "' " + what, "invalid_request_error", "invalid_value", name);
}

// A text block as an OpenAI content part.
json text_part(const std::string& block, const json& b) {
  if (!b.is_object() || !b.contains("type") || !b["type"].is_string()) invalid(block, "must be a block with a 'type'");
  const std::string& type = b["type"].get_ref<const std::string&>();
  if (type != "text") {
    throw ApiError(400, "'" + block + "' of type '" + type + "' is not supported (text and tool blocks only)",
                   "invalid_request_error", "unsupported_field", block);
  }
  if (!b.contains("text") || !b["text"].is_string()) invalid(block + ".text", "must be a string");
  return {{"type", "text"}, {"text", b["text"]}};
}

// A content of text or text blocks as OpenAI content parts (a string stays a string).
json text_content(const std::string& name, const json& content) {
  if (content.is_string()) return content;
  if (!content.is_array()) invalid(name, "must be a string or a list of content blocks");
  json parts = json::array();
  for (size_t i = 0; i < content.size(); ++i) parts.push_back(text_part(name + "[" + std::to_string(i) + "]", content[i]));
  return parts;
}

// A tool_result's content: text, or text blocks joined.
std::string tool_result_text(const std::string& name, const json& content) {
  if (content.is_null()) return "";
  const json text = text_content(name, content);
  if (text.is_string()) return text.get<std::string>();
  std::string out;
  for (const json& part : text) out += part["text"].get<std::string>();
  return out;
}

// One Anthropic message as chat messages: an assistant's tool_use blocks become its
// tool_calls; a user's tool_result blocks become tool messages (before its text).
void add_message(json& messages, const std::string& name, const std::string& role, const json& content) {
  if (!content.is_array()) {
    messages.push_back({{"role", role}, {"content", text_content(name, content)}});
    return;
  }
  json text = json::array(), calls = json::array();
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string block = name + "[" + std::to_string(i) + "]";
    const json& b = content[i];
    const json type = b.is_object() ? b.value("type", json()) : json();
    if (type == "tool_use" && role == "assistant") {
      if (!b.contains("id") || !b["id"].is_string()) invalid(block + ".id", "must be a string");
      if (!b.contains("name") || !b["name"].is_string()) invalid(block + ".name", "must be a string");
      const json input = b.value("input", json::object());
      if (!input.is_object()) invalid(block + ".input", "must be an object");
      calls.push_back({{"id", b["id"]}, {"type", "function"}, {"function", {{"name", b["name"]}, {"arguments", input.dump()}}}});
    } else if (type == "tool_result" && role == "user") {
      if (!b.contains("tool_use_id") || !b["tool_use_id"].is_string()) invalid(block + ".tool_use_id", "must be a string");
      std::string result = tool_result_text(block + ".content", b.value("content", json()));
      if (b.value("is_error", false) == true) result = "Error: " + result;
      messages.push_back({{"role", "tool"}, {"tool_call_id", b["tool_use_id"]}, {"content", result}});
    } else {
      text.push_back(text_part(block, b));
    }
  }
  if (calls.empty() && text.empty() && !messages.empty() && messages.back()["role"] == "tool") return;
  json message = {{"role", role}, {"content", text}};
  if (!calls.empty()) message["tool_calls"] = std::move(calls);
  messages.push_back(std::move(message));
}

// tools ({name, description, input_schema}) and tool_choice ({type: auto | any | tool |
// none, name, disable_parallel_tool_use}) as OpenAI's.
void add_tools(json& chat, const json& body) {
  if (auto tools = body.find("tools"); tools != body.end() && !tools->is_null()) {
    if (!tools->is_array()) invalid("tools", "must be a list");
    json functions = json::array();
    for (size_t i = 0; i < tools->size(); ++i) {
      const std::string name = "tools[" + std::to_string(i) + "]";
      const json& t = (*tools)[i];
      if (!t.is_object()) invalid(name, "must be an object");
      if (auto type = t.find("type"); type != t.end() && !type->is_null() && *type != "custom") {
        throw ApiError(400, "'" + name + ".type' '" + type->dump() + "' is not supported (client tools only)",
                       "invalid_request_error", "unsupported_field", name + ".type");
      }
      // The tool's own field is named: the chat request's would be tools[i].function.name.
      if (!t.contains("name") || !t["name"].is_string()) invalid(name + ".name", "must be a string");
      if (!valid_function_name(t["name"].get<std::string>())) invalid(name + ".name", kFunctionNameRule);
      json function = {{"name", t["name"]}};
      if (t.contains("description")) function["description"] = t["description"];
      function["parameters"] = t.value("input_schema", json::object());
      functions.push_back({{"type", "function"}, {"function", std::move(function)}});
    }
    chat["tools"] = std::move(functions);
    chat["parallel_tool_calls"] = true;
  }
  if (auto choice = body.find("tool_choice"); choice != body.end() && !choice->is_null()) {
    const json type = choice->is_object() ? choice->value("type", json()) : json();
    if (type == "auto") chat["tool_choice"] = "auto";
    else if (type == "any") chat["tool_choice"] = "required";
    else if (type == "none") chat["tool_choice"] = "none";
    else if (type == "tool") chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", choice->value("name", json())}}}};
    else invalid("tool_choice.type", "must be 'auto', 'any', 'tool' or 'none'");
    if (choice->value("disable_parallel_tool_use", false) == true) chat["parallel_tool_calls"] = false;
  }
}

}  // namespace

json chat_request_from_messages(const json& body, bool for_counting) {
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  json chat = json::object();
  json messages = json::array();
  if (auto it = body.find("system"); it != body.end() && !it->is_null()) {
    messages.push_back({{"role", "system"}, {"content", text_content("system", *it)}});
  }
  auto it = body.find("messages");
  if (it == body.end() || !it->is_array() || it->empty()) invalid("messages", "must be a non-empty list of messages");
  for (size_t i = 0; i < it->size(); ++i) {
    const std::string name = "messages[" + std::to_string(i) + "]";
    const json& m = (*it)[i];
    if (!m.is_object()) invalid(name, "must be an object");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string() || (*role != "user" && *role != "assistant")) {
      invalid(name + ".role", "must be 'user' or 'assistant'");
    }
    auto content = m.find("content");
    if (content == m.end()) invalid(name + ".content", "is required");
    add_message(messages, name + ".content", role->get<std::string>(), *content);
  }
  chat["messages"] = std::move(messages);
  if (auto max = body.find("max_tokens"); max != body.end() && !max->is_null()) {
    if (!max->is_number_integer() || max->get<int64_t>() < 1) invalid("max_tokens", "must be a positive integer");
    chat["max_tokens"] = *max;
  } else if (!for_counting) {
    invalid("max_tokens", "is required");
  }
  if (auto stops = body.find("stop_sequences"); stops != body.end() && !stops->is_null()) chat["stop"] = *stops;
  for (const char* name : {"temperature", "top_p", "top_k", "stream"}) {
    if (auto v = body.find(name); v != body.end() && !v->is_null()) chat[name] = *v;
  }
  add_tools(chat, body);
  if (auto thinking = body.find("thinking"); thinking != body.end() && !thinking->is_null()) {
    const auto type = thinking->is_object() ? thinking->value("type", json()) : json();
    if (type != "enabled" && type != "disabled") invalid("thinking.type", "must be 'enabled' or 'disabled'");
    chat["chat_template_kwargs"] = {{"enable_thinking", type == "enabled"}};
  }
  return chat;
}

std::string anthropic_stop_reason(const std::string& finish_reason) {
  if (finish_reason == "length") return "max_tokens";
  if (finish_reason == "stop_string") return "stop_sequence";
  return "end_turn";
}

}  // namespace pico::coordinator::http_api
