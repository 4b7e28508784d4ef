// OpenAI's Responses API: /v1/responses (and /responses). The request is translated to
// a chat request (http/responses.hpp); the reply's items are its reasoning (when the
// template has some), its text as a message and each tool call as a function_call,
// streamed as OpenAI's typed events (response.created ... response.completed, each with
// its sequence_number).
#include "http/api.hpp"
#include "http/responses.hpp"

namespace pico::coordinator::http_api {

namespace {

json usage_of(const Usage& u) {
  return {{"input_tokens", u.prompt_tokens},
          {"input_tokens_details", {{"cached_tokens", u.cached_tokens}}},
          {"output_tokens", u.completion_tokens},
          {"output_tokens_details", {{"reasoning_tokens", 0}}},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

json message_item(const std::string& id, const std::string& text, const char* status) {
  return {{"type", "message"},
          {"id", id},
          {"status", status},
          {"role", "assistant"},
          {"content", json::array({{{"type", "output_text"}, {"text", text}, {"annotations", json::array()}}})}};
}

json reasoning_item(const std::string& id, const std::string& text) {
  return {{"type", "reasoning"},
          {"id", id},
          {"summary", json::array()},
          {"content", json::array({{{"type", "reasoning_text"}, {"text", text}}})}};
}

json call_item(const std::string& id, const ToolCall& call, const char* status) {
  return {{"type", "function_call"}, {"id", id},          {"call_id", call.id},
          {"name", call.name},       {"arguments", call.arguments}, {"status", status}};
}

// The response object around `output`: what the request asked, echoed.
json response_object(const std::string& id, const json& request, const std::string& model, const char* status,
                     json output) {
  json tools = request.value("tools", json::array());
  return {{"id", id},
          {"object", "response"},
          {"created_at", unix_time()},
          {"status", status},
          {"error", nullptr},
          {"incomplete_details", nullptr},
          {"model", request.value("model", model)},
          {"instructions", request.value("instructions", json(nullptr))},
          {"output", std::move(output)},
          {"parallel_tool_calls", request.value("parallel_tool_calls", true)},
          {"tool_choice", request.value("tool_choice", json("auto"))},
          {"tools", std::move(tools)},
          {"temperature", request.value("temperature", json(nullptr))},
          {"top_p", request.value("top_p", json(nullptr))},
          {"max_output_tokens", request.value("max_output_tokens", json(nullptr))},
          {"previous_response_id", nullptr},
          {"reasoning", {{"effort", nullptr}, {"summary", nullptr}}},
          {"store", false},
          {"text", request.value("text", json{{"format", {{"type", "text"}}}})},
          {"truncation", "disabled"},
          {"metadata", request.value("metadata", json::object())},
          {"usage", nullptr}};
}

// The streamed items: the reasoning or the message open while their text comes, each
// call whole; every event numbered.
class ItemStream {
 public:
  explicit ItemStream(Session& s) : s_(s) {}

  awaitable<bool> event(const std::string& type, json data) {
    data["type"] = type;
    data["sequence_number"] = sequence_++;
    const std::string text = data.dump(-1, ' ', false, json::error_handler_t::replace);
    co_return co_await s_.stream_data(text, type);
  }

  // Text of the reasoning item ("reasoning") or of the message ("message").
  awaitable<bool> delta(const std::string& kind, const std::string& text) {
    if (text.empty()) co_return true;
    if (kind != open_ && !co_await open(kind)) co_return false;
    text_ += text;
    const std::string type = kind == "reasoning" ? "response.reasoning_text.delta" : "response.output_text.delta";
    json data = {{"item_id", item_id_}, {"output_index", index_}, {"content_index", 0}, {"delta", text}};
    if (kind == "message") data["logprobs"] = json::array();
    co_return co_await event(type, std::move(data));
  }

  awaitable<bool> call(const std::string& id, const ToolCall& c) {
    if (!co_await close()) co_return false;
    ++index_;
    const std::string added = "response.output_item.added", delta = "response.function_call_arguments.delta",
                      arguments_done = "response.function_call_arguments.done", done = "response.output_item.done";
    json start = {{"output_index", index_}, {"item", call_item(id, c, "in_progress")}};
    start["item"]["arguments"] = "";
    json piece = {{"item_id", id}, {"output_index", index_}, {"delta", c.arguments}};
    json whole = {{"item_id", id}, {"output_index", index_}, {"arguments", c.arguments}};
    json item = {{"output_index", index_}, {"item", call_item(id, c, "completed")}};
    co_return co_await event(added, std::move(start)) && co_await event(delta, std::move(piece)) &&
              co_await event(arguments_done, std::move(whole)) && co_await event(done, std::move(item));
  }

  awaitable<bool> close() {
    if (open_.empty()) co_return true;
    const std::string kind = std::exchange(open_, std::string());
    const std::string text = std::exchange(text_, std::string());
    json text_done = {{"item_id", item_id_}, {"output_index", index_}, {"content_index", 0}, {"text", text}};
    if (kind == "reasoning") {
      const std::string type = "response.reasoning_text.done", done = "response.output_item.done";
      json item = {{"output_index", index_}, {"item", reasoning_item(item_id_, text)}};
      co_return co_await event(type, std::move(text_done)) && co_await event(done, std::move(item));
    }
    const std::string type = "response.output_text.done", part_done = "response.content_part.done",
                      done = "response.output_item.done";
    json part = {{"item_id", item_id_},
                 {"output_index", index_},
                 {"content_index", 0},
                 {"part", {{"type", "output_text"}, {"text", text}, {"annotations", json::array()}}}};
    json item = {{"output_index", index_}, {"item", message_item(item_id_, text, "completed")}};
    co_return co_await event(type, std::move(text_done)) && co_await event(part_done, std::move(part)) &&
              co_await event(done, std::move(item));
  }

  const std::string& message_id() const { return message_id_; }
  const std::string& reasoning_id() const { return reasoning_id_; }

 private:
  awaitable<bool> open(const std::string& kind) {
    if (!co_await close()) co_return false;
    ++index_;
    open_ = kind;
    const std::string added = "response.output_item.added";
    if (kind == "reasoning") {
      item_id_ = reasoning_id_ = random_id("rs_");
      json item = reasoning_item(item_id_, "");
      item["content"] = json::array();
      json data = {{"output_index", index_}, {"item", std::move(item)}};
      co_return co_await event(added, std::move(data));
    }
    item_id_ = message_id_ = random_id("msg_");
    json item = message_item(item_id_, "", "in_progress");
    item["content"] = json::array();
    json data = {{"output_index", index_}, {"item", std::move(item)}};
    const std::string part_added = "response.content_part.added";
    json part = {{"item_id", item_id_},
                 {"output_index", index_},
                 {"content_index", 0},
                 {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}}}};
    co_return co_await event(added, std::move(data)) && co_await event(part_added, std::move(part));
  }

  Session& s_;
  std::string open_, item_id_, text_, message_id_, reasoning_id_;
  int index_ = -1;
  int sequence_ = 0;
};

}  // namespace

awaitable<void> responses(Session& s) {
  const json request = parse_body(s.request);
  ParsedGeneration parsed =
      parse_generation_request(s.state.parse, Endpoint::ChatCompletions, chat_request_from_responses(request));
  const bool stream = parsed.stream;
  const std::string id = random_id("resp_");
  const std::string& model = s.state.options.model_name;
  Generation gen(s.state.engine, co_await asio::this_coro::executor, s.socket, std::move(parsed.choices));
  ChatReplySplit reply(parsed, stream, [style = parsed.tools.style] { return tool_call_id(style); });
  std::vector<std::pair<std::string, ToolCall>> calls;  // item id, call
  ItemStream items(s);
  auto gone = [&] {
    gen.cancel();
    s.keep_alive = false;
  };
  if (stream) {
    const std::string created = "response.created", in_progress = "response.in_progress";
    json start = {{"response", response_object(id, request, model, "in_progress", json::array())}};
    if (!co_await s.stream_begin() || !co_await items.event(created, start) ||
        !co_await items.event(in_progress, std::move(start))) {
      gone();
      co_return;
    }
  }
  while (true) {
    Generation::Event ev = co_await gen.next();
    if (gen.client_gone()) {
      s.keep_alive = false;
      co_return;
    }
    if (ev.kind == Generation::Event::Progress) continue;  // not part of this API's stream
    if (ev.kind == Generation::Event::Error) {
      gen.cancel();
      if (!stream) throw ApiError(500, ev.reason, "server_error", "generation_failed");
      json failed = response_object(id, request, model, "failed", json::array());
      failed["error"] = {{"code", "server_error"}, {"message", ev.reason}};
      const std::string type = "response.failed";
      json data = {{"response", std::move(failed)}};
      co_await items.event(type, std::move(data));
      co_await s.stream_end();
      co_return;
    }
    const bool done = ev.kind == Generation::Event::Done;
    ChatReplySplit::Piece piece = reply.next(done, ev.token.text);
    const std::string& reasoning = reply.reasoning;
    const std::string& content = reply.content;
    ToolCallSplitter::Part& tools = piece.tools;
    const std::string reasoning_kind = "reasoning", message_kind = "message";
    if (stream && !(co_await items.delta(reasoning_kind, piece.reasoning) && co_await items.delta(message_kind, tools.content))) {
      gone();
      co_return;
    }
    for (ToolCall& call : tools.calls) {
      std::string item_id = random_id("fc_");
      if (stream && !co_await items.call(item_id, call)) {
        gone();
        co_return;
      }
      calls.emplace_back(std::move(item_id), std::move(call));
    }
    if (!done) continue;
    if (stream && !co_await items.close()) {
      gone();
      co_return;
    }
    // The items in the order they came: reasoning, text, calls.
    const bool cut = ev.reason == "length";
    json output = json::array();
    if (!reasoning.empty()) {
      output.push_back(reasoning_item(items.reasoning_id().empty() ? random_id("rs_") : items.reasoning_id(), reasoning));
    }
    if (!content.empty() || (calls.empty() && reasoning.empty())) {
      output.push_back(message_item(items.message_id().empty() ? random_id("msg_") : items.message_id(), content,
                                    cut ? "incomplete" : "completed"));
    }
    for (const auto& [item_id, call] : calls) output.push_back(call_item(item_id, call, "completed"));
    json response = response_object(id, request, model, cut ? "incomplete" : "completed", std::move(output));
    if (cut) response["incomplete_details"] = {{"reason", "max_output_tokens"}};
    response["usage"] = usage_of(ev.usage);
    if (!stream) {
      co_await s.reply(200, response);
      co_return;
    }
    const std::string type = cut ? "response.incomplete" : "response.completed";
    json data = {{"response", std::move(response)}};
    co_await items.event(type, std::move(data));
    co_await s.stream_end();
    co_return;
  }
}

}  // namespace pico::coordinator::http_api
