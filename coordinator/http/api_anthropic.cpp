// Anthropic's Messages API: /v1/messages (text and tool use, streamed as Anthropic's
// events) and /v1/messages/count_tokens. The request is translated to a chat request
// (http/anthropic.hpp); the reply's reasoning, when the template has some, is a
// "thinking" block before the text; its tool calls are tool_use blocks after it.
#include "http/anthropic.hpp"
#include "http/api.hpp"

namespace pico::coordinator::http_api {

namespace {

// One content block of a streamed reply: opened at its first delta, closed when a block
// of the other kind starts or the reply ends.
class BlockStream {
 public:
  explicit BlockStream(Session& s) : s_(s) {}

  awaitable<bool> delta(const std::string& kind, const std::string& text) {
    if (text.empty()) co_return true;
    if (kind != open_ && !co_await open(kind)) co_return false;
    const json d = kind == "thinking" ? json{{"type", "thinking_delta"}, {"thinking", text}}
                                      : json{{"type", "text_delta"}, {"text", text}};
    const json data = {{"type", "content_block_delta"}, {"index", index_}, {"delta", d}};
    co_return co_await event("content_block_delta", data);
  }

  // A whole tool_use block: its start (id, name, empty input), the input as one
  // input_json_delta, its stop.
  awaitable<bool> tool_use(const ToolCall& call) {
    if (!co_await close()) co_return false;
    ++index_;
    const json start = {{"type", "content_block_start"},
                        {"index", index_},
                        {"content_block", {{"type", "tool_use"}, {"id", call.id}, {"name", call.name}, {"input", json::object()}}}};
    const json delta = {{"type", "content_block_delta"},
                        {"index", index_},
                        {"delta", {{"type", "input_json_delta"}, {"partial_json", call.arguments}}}};
    const json stop = {{"type", "content_block_stop"}, {"index", index_}};
    co_return co_await event("content_block_start", start) && co_await event("content_block_delta", delta) &&
              co_await event("content_block_stop", stop);
  }

  // Closes the open block; a reply without any gets one empty text block.
  awaitable<bool> finish() {
    const std::string text_kind = "text";
    if (open_.empty() && index_ < 0 && !co_await open(text_kind)) co_return false;
    co_return co_await close();
  }

  // (Arguments of co_await are named values: GCC 12 mishandles temporaries there.)
  awaitable<bool> event(std::string_view type, const json& data) {
    const std::string text = data.dump(-1, ' ', false, json::error_handler_t::replace);
    co_return co_await s_.stream_data(text, type);
  }

 private:
  awaitable<bool> open(const std::string& kind) {
    if (!co_await close()) co_return false;
    ++index_;
    open_ = kind;
    const json block = kind == "thinking" ? json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}
                                          : json{{"type", "text"}, {"text", ""}};
    const json data = {{"type", "content_block_start"}, {"index", index_}, {"content_block", block}};
    co_return co_await event("content_block_start", data);
  }

  awaitable<bool> close() {
    if (open_.empty()) co_return true;
    open_.clear();
    const json data = {{"type", "content_block_stop"}, {"index", index_}};
    co_return co_await event("content_block_stop", data);
  }

  Session& s_;
  std::string open_;  // "", "thinking" or "text"
  int index_ = -1;
};

json usage_of(const Usage& u) {
  return {{"input_tokens", u.prompt_tokens},
          {"output_tokens", u.completion_tokens},
          {"cache_read_input_tokens", u.cached_tokens}};
}

}  // namespace

awaitable<void> anthropic_messages(Session& s) {
  ParsedGeneration parsed =
      parse_generation_request(s.state.parse, Endpoint::ChatCompletions, chat_request_from_messages(parse_body(s.request)));
  const bool stream = parsed.stream;
  const std::string id = random_id("msg_");
  const std::string& model = s.state.options.model_name;
  const auto input_tokens = static_cast<int>(parsed.choices.front().prompt.size());
  Generation gen(s.state.engine, co_await asio::this_coro::executor, s.socket, std::move(parsed.choices));
  ChatReplySplit reply(parsed, stream, [] { return random_id("toolu_"); });
  std::vector<ToolCall> calls;
  BlockStream blocks(s);
  auto gone = [&] {
    gen.cancel();
    s.keep_alive = false;
  };
  if (stream) {
    const json start = {{"type", "message_start"},
                        {"message",
                         {{"id", id},
                          {"type", "message"},
                          {"role", "assistant"},
                          {"model", model},
                          {"content", json::array()},
                          {"stop_reason", nullptr},
                          {"stop_sequence", nullptr},
                          {"usage", {{"input_tokens", input_tokens}, {"output_tokens", 0}}}}}};
    if (!co_await s.stream_begin() || !co_await blocks.event("message_start", start)) {
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
      const json error = {{"type", "error"}, {"error", {{"type", "api_error"}, {"message", ev.reason}}}};
      co_await blocks.event("error", error);
      co_await s.stream_end();
      co_return;
    }
    const bool done = ev.kind == Generation::Event::Done;
    ChatReplySplit::Piece piece = reply.next(done, ev.token.text);
    const std::string& reasoning = reply.reasoning;
    const std::string& content = reply.content;
    ToolCallSplitter::Part& tools = piece.tools;
    const std::string thinking_kind = "thinking", text_kind = "text";
    if (stream && !(co_await blocks.delta(thinking_kind, piece.reasoning) && co_await blocks.delta(text_kind, tools.content))) {
      gone();
      co_return;
    }
    for (ToolCall& call : tools.calls) {
      if (stream && !co_await blocks.tool_use(call)) {
        gone();
        co_return;
      }
      calls.push_back(std::move(call));
    }
    if (!done) continue;
    const std::string stop_reason = calls.empty() ? anthropic_stop_reason(ev.reason) : "tool_use";
    const json stop_sequence = ev.usage.stopping_word.empty() ? json(nullptr) : json(ev.usage.stopping_word);
    if (!stream) {
      json blocks_json = json::array();
      if (!reasoning.empty()) blocks_json.push_back({{"type", "thinking"}, {"thinking", reasoning}, {"signature", ""}});
      if (!content.empty() || calls.empty()) blocks_json.push_back({{"type", "text"}, {"text", content}});
      for (const ToolCall& call : calls) {
        blocks_json.push_back(
            {{"type", "tool_use"}, {"id", call.id}, {"name", call.name}, {"input", json::parse(call.arguments)}});
      }
      const json message = {{"id", id},
                            {"type", "message"},
                            {"role", "assistant"},
                            {"model", model},
                            {"content", blocks_json},
                            {"stop_reason", stop_reason},
                            {"stop_sequence", stop_sequence},
                            {"usage", usage_of(ev.usage)}};
      co_await s.reply(200, message);
      co_return;
    }
    const json delta = {{"type", "message_delta"},
                        {"delta", {{"stop_reason", stop_reason}, {"stop_sequence", stop_sequence}}},
                        {"usage", usage_of(ev.usage)}};
    const json stop = {{"type", "message_stop"}};
    if (co_await blocks.finish() && co_await blocks.event("message_delta", delta)) {
      co_await blocks.event("message_stop", stop);
    }
    co_await s.stream_end();
    co_return;
  }
}

awaitable<void> anthropic_count_tokens(Session& s) {
  const ParsedGeneration parsed = parse_generation_request(
      s.state.parse, Endpoint::ChatCompletions, chat_request_from_messages(parse_body(s.request), true));
  const json count = {{"input_tokens", parsed.choices.front().prompt.size()}};
  co_await s.reply(200, count);
}

}  // namespace pico::coordinator::http_api
