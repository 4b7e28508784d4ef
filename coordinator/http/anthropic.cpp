#include "http/anthropic.hpp"

#include "http/request_parsing.hpp"

namespace pico::coordinator::http_api {

namespace {

[[noreturn]] void invalid(const std::string& name, const std::string& what) {
  throw ApiError(400, "'" + name + "' " + what, "invalid_request_error", "invalid_value", name);
}

// A content of text or text blocks as OpenAI content parts (a string stays a string).
json text_content(const std::string& name, const json& content) {
  if (content.is_string()) return content;
  if (!content.is_array()) invalid(name, "must be a string or a list of content blocks");
  json parts = json::array();
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string block = name + "[" + std::to_string(i) + "]";
    const json& b = content[i];
    if (!b.is_object() || !b.contains("type") || !b["type"].is_string()) invalid(block, "must be a block with a 'type'");
    const std::string& type = b["type"].get_ref<const std::string&>();
    if (type != "text") {
      throw ApiError(400, "'" + block + "' of type '" + type + "' is not supported (text blocks only)",
                     "invalid_request_error", "unsupported_field", block);
    }
    if (!b.contains("text") || !b["text"].is_string()) invalid(block + ".text", "must be a string");
    parts.push_back({{"type", "text"}, {"text", b["text"]}});
  }
  return parts;
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
    messages.push_back({{"role", *role}, {"content", text_content(name + ".content", *content)}});
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
  if (auto tools = body.find("tools"); tools != body.end() && !tools->is_null() && !(tools->is_array() && tools->empty())) {
    throw ApiError(400, "'tools' is not supported", "invalid_request_error", "unsupported_field", "tools");
  }
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
