// OpenAI endpoints: /v1/chat/completions, /v1/completions, /v1/models.
#include <boost/asio/this_coro.hpp>
#include <algorithm>
#include <cctype>
#include <optional>
#include <string>
#include <string_view>

#include "http/api.hpp"

namespace pico::coordinator::http_api {

namespace {

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

// Chat logprobs entry of one token ({"token", "logprob", "bytes", "top_logprobs"}).
json chat_logprob(const tokenizer::Tokenizer& tok, const TokenEvent& ev) {
  const std::string piece = tok.piece(ev.id);
  json top = json::array();
  for (const auto& t : ev.top) {
    const std::string p = tok.piece(t.id);
    top.push_back({{"token", p}, {"logprob", t.logprob}, {"bytes", bytes_of(p)}});
  }
  return {{"token", piece}, {"logprob", ev.logprob}, {"bytes", bytes_of(piece)}, {"top_logprobs", top}};
}

struct CompletionLogprobs {
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(), offsets = json::array();
  void add(const tokenizer::Tokenizer& tok, const TokenEvent& ev, size_t offset) {
    tokens.push_back(tok.piece(ev.id));
    token_logprobs.push_back(ev.logprob);
    json t = json::object();
    for (const auto& p : ev.top) t[tok.piece(p.id)] = p.logprob;
    top.push_back(t);
    offsets.push_back(offset);
  }
  json to_json() const {
    return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top}, {"text_offset", offsets}};
  }
};

// n choices share the prompt: counted once; cached_tokens are those every choice reused.
json usage_json(const std::vector<Usage>& choices) {
  int completion = 0, cached = choices.empty() ? 0 : choices[0].cached_tokens;
  for (const auto& u : choices) {
    completion += u.completion_tokens;
    cached = std::min(cached, u.cached_tokens);
  }
  const int prompt = choices.empty() ? 0 : choices[0].prompt_tokens;
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

std::string finish_reason(const std::string& reason) { return reason == "length" ? "length" : "stop"; }

// A chat reply's calls as OpenAI writes them (message.tool_calls, or a stream's
// delta.tool_calls with `index`).
json tool_call_json(const ToolCall& call, std::optional<size_t> index = std::nullopt) {
  json out = {{"id", call.id}, {"type", "function"}, {"function", {{"name", call.name}, {"arguments", call.arguments}}}};
  if (index) out["index"] = *index;
  return out;
}

// What one choice has produced so far.
struct Choice {
  std::string text;                // raw, as generated
  ReasoningSplitter split;         // chat: text -> reasoning + content
  ToolCallSplitter tool_split;     // chat: content -> content + tool calls
  std::string reasoning, content;  // chat
  std::vector<ToolCall> calls;     // chat
  json chat_lp = json::array();
  CompletionLogprobs comp_lp;
  std::string reason;
  Usage usage;
  bool done = false;
};

awaitable<void> generate(Session& s, ParsedGeneration parsed, bool chat) {
  const bool stream = parsed.stream;
  const bool include_usage = parsed.include_usage;
  const bool want_logprobs = parsed.logprobs;

  const std::string id = random_id(chat ? "chatcmpl-" : "cmpl-");
  const int64_t created = unix_time();
  const std::string& model = s.state.options.model_name;
  const char* object = chat ? "chat.completion.chunk" : "text_completion";
  auto chunk = [&](json choice, size_t index) {
    choice["index"] = index;
    return json{{"id", id},
                {"object", object},
                {"created", created},
                {"model", model},
                {"system_fingerprint", system_fingerprint()},
                {"choices", json::array({choice})}};
  };

  Generation gen(s.state.engine, co_await asio::this_coro::executor, s.socket, std::move(parsed.choices));
  std::vector<Choice> choices(gen.size());
  for (auto& c : choices) {
    c.split = ReasoningSplitter::for_reply(parsed.reasoning, stream);
    if (parsed.tools.active()) {
      c.tool_split = ToolCallSplitter(parsed.tools, [style = parsed.tools.style] { return tool_call_id(style); });
    }
  }
  size_t remaining = choices.size();
  // A chat delta of reasoning and/or content.
  auto delta = [](const ReasoningSplitter::Split& d) {
    json out = json::object();
    if (!d.reasoning.empty()) out["reasoning_content"] = d.reasoning;
    if (!d.content.empty() || d.reasoning.empty()) out["content"] = d.content;
    return out;
  };
  // Reasoning and content of a chat reply; the content through the tool-call splitter
  // (final: the reply ended). What is new, to stream: text, then each finished call.
  struct ChatPart {
    ReasoningSplitter::Split text;
    std::vector<ToolCallSplitter::CallPiece> pieces;
    std::vector<ToolCall> calls;
    bool empty() const { return text.empty() && pieces.empty() && calls.empty(); }
  };
  auto chat_part = [](Choice& c, ReasoningSplitter::Split part, bool final) {
    ToolCallSplitter::Part tools = final ? c.tool_split.finish(part.content) : c.tool_split.feed(part.content);
    c.reasoning += part.reasoning;
    c.content += tools.content;
    ChatPart out{{std::move(part.reasoning), std::move(tools.content)}, std::move(tools.pieces), std::move(tools.calls)};
    for (const ToolCall& call : out.calls) c.calls.push_back(call);
    return out;
  };
  // The chunks of a chat part: its text, then the pieces of a call still coming (its
  // header: index, id, name, empty arguments; then its arguments piece by piece), then
  // per finished call not streamed so its header and its arguments, as OpenAI streams
  // them.
  auto part_chunks = [&](const Choice& c, const ChatPart& part, const json& lp, size_t choice) {
    std::vector<json> out;
    if (!part.text.empty() || !lp.is_null()) {
      out.push_back(chunk({{"delta", delta(part.text)}, {"logprobs", lp}, {"finish_reason", nullptr}}, choice));
    }
    auto header_chunk = [&](size_t index, const std::string& call_id, const std::string& name) {
      json header = tool_call_json({call_id, name, "", false}, index);
      return chunk({{"delta", {{"tool_calls", json::array({header})}}}, {"logprobs", nullptr}, {"finish_reason", nullptr}},
                   choice);
    };
    auto arguments_chunk = [&](size_t index, const std::string& arguments) {
      return chunk({{"delta", {{"tool_calls", json::array({{{"index", index}, {"function", {{"arguments", arguments}}}}})}}},
                    {"logprobs", nullptr},
                    {"finish_reason", nullptr}},
                   choice);
    };
    for (const ToolCallSplitter::CallPiece& piece : part.pieces) {
      if (!piece.id.empty() || !piece.name.empty()) out.push_back(header_chunk(piece.index, piece.id, piece.name));
      if (!piece.arguments.empty()) out.push_back(arguments_chunk(piece.index, piece.arguments));
    }
    size_t index = c.calls.size() - part.calls.size();
    for (const ToolCall& call : part.calls) {
      if (!call.streamed) {
        out.push_back(header_chunk(index, call.id, call.name));
        out.push_back(arguments_chunk(index, call.arguments));
      }
      ++index;
    }
    return out;
  };

  if (stream) {
    if (!co_await s.stream_begin()) {
      gen.cancel();
      co_return;
    }
    for (size_t i = 0; chat && i < choices.size(); ++i) {
      const json first =
          chunk({{"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr}, {"finish_reason", nullptr}}, i);
      const std::string first_text = first.dump();
      if (!co_await s.stream_data(first_text)) {
        gen.cancel();
        s.keep_alive = false;
        co_return;
      }
    }
  }
  while (remaining > 0) {
    Generation::Event ev = co_await gen.next();
    if (gen.client_gone()) {  // cancelled: nobody to answer
      s.keep_alive = false;
      co_return;
    }
    Choice& c = choices[ev.choice];
    if (ev.kind == Generation::Event::Progress) {  // return_progress: llama-server's chunk without text
      if (!stream) continue;
      json piece = chat ? chunk({{"delta", {{"role", "assistant"}, {"content", nullptr}}}, {"logprobs", nullptr},
                                 {"finish_reason", nullptr}},
                                ev.choice)
                        : chunk({{"text", ""}, {"logprobs", nullptr}, {"finish_reason", nullptr}}, ev.choice);
      piece["prompt_progress"] = progress_json(ev.progress);
      const std::string piece_text = piece.dump();
      if (!co_await s.stream_data(piece_text)) {
        gen.cancel();
        s.keep_alive = false;
        co_return;
      }
      continue;
    }
    if (ev.kind == Generation::Event::Error) {
      gen.cancel();
      if (!stream) throw ApiError(500, ev.reason, "server_error", "generation_failed");
      const std::string err = error_body(500, ev.reason, "server_error", "generation_failed").dump();
      co_await s.stream_data(err);
      co_await s.stream_end();
      co_return;
    }
    if (ev.kind == Generation::Event::Done) {
      c.done = true;
      c.reason = finish_reason(ev.reason);
      c.usage = ev.usage;
      --remaining;
      if (chat) {  // what the splitters held back (a partial tag, trailing whitespace, a call)
        const ChatPart rest = chat_part(c, c.split.finish(), true);
        if (!c.calls.empty()) c.reason = "tool_calls";
        for (const json& piece : stream ? part_chunks(c, rest, nullptr, ev.choice) : std::vector<json>{}) {
          const std::string piece_text = piece.dump(-1, ' ', false, json::error_handler_t::replace);
          if (!co_await s.stream_data(piece_text)) {
            gen.cancel();
            s.keep_alive = false;
            co_return;
          }
        }
      }
      if (stream) {
        json last = chat ? chunk({{"delta", json::object()}, {"logprobs", nullptr}, {"finish_reason", c.reason}}, ev.choice)
                         : chunk({{"text", ""}, {"logprobs", nullptr}, {"finish_reason", c.reason}}, ev.choice);
        last["timings"] = timings_json(c.usage);  // as llama-server, on the chunk that ends the choice
        const std::string last_text = last.dump();
        if (!co_await s.stream_data(last_text)) {
          gen.cancel();
          s.keep_alive = false;
          co_return;
        }
      }
      continue;
    }
    const TokenEvent& t = ev.token;
    const size_t offset = c.text.size();
    c.text += t.text;
    ChatPart part;
    if (chat) part = chat_part(c, c.split.feed(t.text), false);
    json lp = nullptr;
    if (want_logprobs && t.id >= 0) {
      if (chat) {
        json entry = chat_logprob(s.state.tok, t);
        c.chat_lp.push_back(entry);
        lp = {{"content", json::array({entry})}};
      } else {
        CompletionLogprobs one;
        one.add(s.state.tok, t, offset);
        c.comp_lp.add(s.state.tok, t, offset);
        lp = one.to_json();
      }
    }
    std::vector<json> pieces;
    if (stream && chat) {
      pieces = part_chunks(c, part, lp, ev.choice);
    } else if (stream && (!t.text.empty() || !lp.is_null())) {
      pieces.push_back(chunk({{"text", t.text}, {"logprobs", lp}, {"finish_reason", nullptr}}, ev.choice));
    }
    for (const json& piece : pieces) {
      const std::string piece_text = piece.dump(-1, ' ', false, json::error_handler_t::replace);
      if (!co_await s.stream_data(piece_text)) {
        gen.cancel();  // the client is gone
        s.keep_alive = false;
        co_return;
      }
    }
  }
  std::vector<Usage> usages;
  for (const auto& c : choices) usages.push_back(c.usage);
  if (!stream) {
    json list = json::array();
    for (size_t i = 0; i < choices.size(); ++i) {
      const Choice& c = choices[i];
      json message = {{"role", "assistant"}, {"content", c.content}};
      if (!c.reasoning.empty()) message["reasoning_content"] = c.reasoning;  // as llama-server: only when there is some
      if (!c.calls.empty()) {  // as OpenAI: no content is null beside calls
        if (c.content.empty()) message["content"] = nullptr;
        message["tool_calls"] = json::array();
        for (const ToolCall& call : c.calls) message["tool_calls"].push_back(tool_call_json(call));
      }
      list.push_back(chat ? json{{"index", i},
                                 {"message", message},
                                 {"logprobs", want_logprobs ? json{{"content", c.chat_lp}} : json(nullptr)},
                                 {"finish_reason", c.reason}}
                          : json{{"index", i},
                                 {"text", c.text},
                                 {"logprobs", want_logprobs ? c.comp_lp.to_json() : json(nullptr)},
                                 {"finish_reason", c.reason}});
    }
    const json full = {{"id", id},
                       {"object", chat ? "chat.completion" : "text_completion"},
                       {"created", created},
                       {"model", model},
                       {"system_fingerprint", system_fingerprint()},
                       {"choices", list},
                       {"usage", usage_json(usages)},
                       {"timings", timings_json(choices.front().usage)}};
    co_await s.reply(200, full);
    co_return;
  }
  bool ok = true;
  if (include_usage) {
    const json u = {{"id", id},       {"object", object},         {"created", created},
                    {"model", model}, {"system_fingerprint", system_fingerprint()},
                    {"choices", json::array()}, {"usage", usage_json(usages)}};
    const std::string usage_text = u.dump();
    ok = co_await s.stream_data(usage_text);
  }
  const std::string done = "[DONE]";
  if (ok) co_await s.stream_data(done);
  co_await s.stream_end();
}

}  // namespace

awaitable<void> chat_completions(Session& s) {
  co_await generate(s, parse_generation_request(s.state.parse, Endpoint::ChatCompletions, parse_body(s.request)), true);
}

awaitable<void> completions(Session& s) {
  co_await generate(s, parse_generation_request(s.state.parse, Endpoint::Completions, parse_body(s.request)), false);
}

namespace {
json model_object(const Session& s, const std::string& id) {
  return {{"id", id},
          {"object", "model"},
          {"created", std::chrono::duration_cast<std::chrono::seconds>(s.state.started.time_since_epoch()).count()},
          {"owned_by", "pico"}};
}

// %XX escapes of a path segment (a model id may hold a '/').
std::string percent_decoded(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    auto hex = [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; };
    if (text[i] == '%' && i + 2 < text.size() && hex(text[i + 1]) && hex(text[i + 2])) {
      out += static_cast<char>(std::stoi(std::string(text.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out += text[i];
    }
  }
  return out;
}
}  // namespace

awaitable<void> models(Session& s) {
  const json list = {{"object", "list"}, {"data", json::array({model_object(s, s.state.options.model_name)})}};
  co_await s.reply(200, list);
}

awaitable<void> model_by_id(Session& s) {
  // Any id names the one model, as any `model` of a request does.
  const std::string_view target(s.request.target().data(), s.request.target().size());
  const std::string_view path = target.substr(0, target.find('?'));
  co_await s.reply(200, model_object(s, percent_decoded(path.substr(path.find("/models/") + 8))));
}

}  // namespace pico::coordinator::http_api
