#include "http/responses.hpp"

#include "http/request_parsing.hpp"

namespace pico::coordinator::http_api {

namespace {

[[noreturn]] void invalid(const std::string& name, const std::string& what) {
  throw ApiError(400, "'" + name + "' " + what, "invalid_request_error", "invalid_value", name);
}

[[noreturn]] void unsupported(const std::string& name, const std::string& what) {
  throw ApiError(400, "'" + name + "' " + what + " is not supported", "invalid_request_error", "unsupported_field",
                 name);
}

const std::string& string_field(const json& object, const std::string& where, const char* key) {
  auto it = object.find(key);
  if (it == object.end() || !it->is_string()) invalid(where + "." + key, "must be a string");
  return it->get_ref<const std::string&>();
}

// A message's content: a string, or parts of input_text / output_text (refusal for an
// assistant's) as chat text parts.
json message_content(const json& content, const std::string& where) {
  if (content.is_string()) return content;
  if (!content.is_array()) invalid(where, "must be a string or a list of content parts");
  json parts = json::array();
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string part = where + "[" + std::to_string(i) + "]";
    if (!content[i].is_object()) invalid(part, "must be a content part");
    const std::string& type = string_field(content[i], part, "type");
    if (type == "input_text" || type == "output_text") {
      parts.push_back({{"type", "text"}, {"text", string_field(content[i], part, "text")}});
    } else if (type == "refusal") {
      parts.push_back({{"type", "text"}, {"text", string_field(content[i], part, "refusal")}});
    } else {
      unsupported(part + ".type", "'" + type + "'");
    }
  }
  return parts;
}

// The messages of the input items, in order; an assistant's text, reasoning and calls
// in a row become one assistant message.
json messages_from_items(const json& input) {
  json messages = json::array();
  const auto assistant = [&]() -> json& {
    if (messages.empty() || messages.back()["role"] != "assistant" || messages.back().contains("tool_call_id")) {
      messages.push_back({{"role", "assistant"}, {"content", ""}});
    }
    return messages.back();
  };
  for (size_t i = 0; i < input.size(); ++i) {
    const json& item = input[i];
    const std::string where = "input[" + std::to_string(i) + "]";
    if (!item.is_object()) invalid(where, "must be an input item");
    const std::string type = item.contains("type") ? string_field(item, where, "type") : "message";
    if (type == "message") {
      const std::string& role = string_field(item, where, "role");
      if (role != "user" && role != "system" && role != "developer" && role != "assistant") {
        invalid(where + ".role", "must be user, system, developer or assistant");
      }
      if (!item.contains("content")) invalid(where + ".content", "is required");
      json content = message_content(item["content"], where + ".content");
      if (role == "assistant") {
        json& m = assistant();
        if (content.is_string()) content = json::array({{{"type", "text"}, {"text", content}}});
        json parts = m["content"].is_string() && m["content"].get<std::string>().empty() ? json::array() : m["content"];
        if (parts.is_string()) parts = json::array({{{"type", "text"}, {"text", parts}}});
        for (const json& p : content) parts.push_back(p);
        m["content"] = parts;
      } else {
        messages.push_back({{"role", role}, {"content", content}});
      }
    } else if (type == "function_call") {
      json call = {{"id", string_field(item, where, "call_id")},
                   {"type", "function"},
                   {"function", {{"name", string_field(item, where, "name")}, {"arguments", string_field(item, where, "arguments")}}}};
      json& m = assistant();
      if (!m.contains("tool_calls")) m["tool_calls"] = json::array();
      m["tool_calls"].push_back(std::move(call));
    } else if (type == "function_call_output") {
      const std::string& call_id = string_field(item, where, "call_id");
      if (!item.contains("output")) invalid(where + ".output", "is required");
      json output = message_content(item["output"], where + ".output");
      messages.push_back({{"role", "tool"}, {"tool_call_id", call_id}, {"content", output}});
    } else if (type == "reasoning") {
      // Its text, when the client sends it back, goes with the assistant's turn.
      std::string text;
      if (auto c = item.find("content"); c != item.end() && c->is_array()) {
        for (size_t k = 0; k < c->size(); ++k) {
          text += string_field((*c)[k], where + ".content[" + std::to_string(k) + "]", "text");
        }
      }
      if (!text.empty()) assistant()["reasoning_content"] = text;
    } else {
      unsupported(where + ".type", "'" + type + "'");
    }
  }
  return messages;
}

}  // namespace

json chat_request_from_responses(const json& body) {
  json chat = json::object();
  json messages = json::array();
  for (const auto& [key, value] : body.items()) {
    if (key == "input" || key == "instructions" || key == "tools" || key == "text" || key == "metadata" ||
        key == "store" || key == "reasoning") {
      continue;  // below, or echoed in the reply
    } else if (key == "model" || key == "stream" || key == "temperature" || key == "top_p" || key == "tool_choice" ||
               key == "parallel_tool_calls" || key == "user" || key == "seed") {
      chat[key] = value;
    } else if (key == "max_output_tokens") {
      chat["max_tokens"] = value;
    } else if (key == "truncation") {
      if (value != "disabled") invalid(key, "must be 'disabled' (a prompt past the context is refused)");
    } else if (key == "previous_response_id" || key == "conversation") {
      if (!value.is_null()) unsupported(key, "(pico keeps no responses: send the whole input)");
    } else if (key == "background") {
      if (value != false) unsupported(key, "true");
    } else if (key == "include") {
      if (!value.is_array() || !value.empty()) unsupported(key, "a non-empty list");
    } else {
      unsupported(key, "this field");
    }
  }
  if (auto it = body.find("store"); it != body.end() && !it->is_boolean()) invalid("store", "must be a boolean");
  if (auto it = body.find("metadata"); it != body.end() && !it->is_null() && !it->is_object()) {
    invalid("metadata", "must be an object");
  }
  if (auto it = body.find("reasoning"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) invalid("reasoning", "must be an object");
    for (const auto& [key, value] : it->items()) {
      if (!value.is_null()) unsupported("reasoning." + key, "(the chat template decides whether the model thinks)");
    }
  }
  if (auto it = body.find("instructions"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) invalid("instructions", "must be a string");
    messages.push_back({{"role", "system"}, {"content", *it}});
  }
  auto input = body.find("input");
  if (input == body.end() || input->is_null()) invalid("input", "is required");
  if (input->is_string()) {
    messages.push_back({{"role", "user"}, {"content", *input}});
  } else if (input->is_array()) {
    for (json& m : messages_from_items(*input)) messages.push_back(std::move(m));
  } else {
    invalid("input", "must be a string or a list of input items");
  }
  chat["messages"] = std::move(messages);
  if (auto it = body.find("tools"); it != body.end() && !it->is_null()) {
    if (!it->is_array()) invalid("tools", "must be a list of tools");
    json tools = json::array();
    for (size_t i = 0; i < it->size(); ++i) {
      const json& tool = (*it)[i];
      const std::string where = "tools[" + std::to_string(i) + "]";
      if (!tool.is_object()) invalid(where, "must be a tool");
      const std::string& type = string_field(tool, where, "type");
      if (type != "function") unsupported(where + ".type", "'" + type + "' (function tools only)");
      if (!valid_function_name(string_field(tool, where, "name"))) invalid(where + ".name", kFunctionNameRule);
      json function = tool;
      function.erase("type");
      tools.push_back({{"type", "function"}, {"function", std::move(function)}});
    }
    if (!tools.empty()) chat["tools"] = std::move(tools);
  }
  if (auto it = chat.find("tool_choice"); it != chat.end() && it->is_object()) {
    // {"type": "function", "name": N} as chat's {"type": "function", "function": {"name": N}}.
    const json& choice = *it;
    if (choice.value("type", "") != "function") unsupported("tool_choice.type", "this tool choice");
    *it = {{"type", "function"}, {"function", {{"name", string_field(choice, "tool_choice", "name")}}}};
  }
  if (auto it = body.find("text"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) invalid("text", "must be an object");
    for (const auto& [key, value] : it->items()) {
      if (key == "format") {
        if (!value.is_object()) invalid("text.format", "must be an object");
        const std::string& type = string_field(value, "text.format", "type");
        if (type == "json_schema") {
          json schema = value;
          schema.erase("type");
          chat["response_format"] = {{"type", "json_schema"}, {"json_schema", std::move(schema)}};
        } else if (type == "json_object" || type == "text") {
          chat["response_format"] = {{"type", type}};
        } else {
          unsupported("text.format.type", "'" + type + "'");
        }
      } else if (key == "verbosity") {
        if (!value.is_null() && value != "medium") unsupported("text.verbosity", "another than 'medium'");
      } else {
        unsupported("text." + key, "this field");
      }
    }
  }
  return chat;
}

}  // namespace pico::coordinator::http_api
