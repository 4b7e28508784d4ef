// OpenAI endpoints: /v1/chat/completions, /v1/completions, /v1/models.
#include <boost/asio/this_coro.hpp>

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

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

std::string finish_reason(const std::string& reason) { return reason == "length" ? "length" : "stop"; }

awaitable<void> generate(Session& s, const json& body, OnlineRequest req, bool chat) {
  const bool stream = opt_bool(body, "stream").value_or(false);
  bool include_usage = false;
  if (auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) throw ApiError(400, "'stream_options' must be an object");
    include_usage = opt_bool(*it, "include_usage").value_or(false);
  }
  if (auto n = opt_int(body, "n"); n && *n != 1) throw ApiError(400, "only n = 1 is supported");
  bool want_logprobs = false;
  if (chat) {
    want_logprobs = opt_bool(body, "logprobs").value_or(false);
    const auto top = opt_int(body, "top_logprobs");
    if (top && (*top < 0 || *top > 20)) throw ApiError(400, "'top_logprobs' must be between 0 and 20");
    if (want_logprobs) req.logprobs = static_cast<int>(top.value_or(0));
  } else if (auto lp = opt_int(body, "logprobs")) {
    if (*lp < 0 || *lp > 20) throw ApiError(400, "'logprobs' must be between 0 and 20");
    want_logprobs = true;
    req.logprobs = static_cast<int>(*lp);
  }

  const std::string id = random_id(chat ? "chatcmpl-" : "cmpl-");
  const int64_t created = unix_time();
  const std::string& model = s.state.options.model_name;
  const char* object = chat ? "chat.completion.chunk" : "text_completion";
  auto chunk = [&](json choice) {
    choice["index"] = 0;
    return json{{"id", id}, {"object", object}, {"created", created}, {"model", model}, {"choices", json::array({choice})}};
  };

  Generation gen(s.state.engine, co_await asio::this_coro::executor, std::move(req));
  std::string text;
  json chat_lp = json::array();
  CompletionLogprobs comp_lp;

  if (stream) {
    if (!co_await s.stream_begin()) {
      gen.cancel();
      co_return;
    }
    if (chat) {
      const json first = chunk({{"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr}, {"finish_reason", nullptr}});
      const std::string first_text = first.dump();
      if (!co_await s.stream_data(first_text)) {
        gen.cancel();
        co_return;
      }
    }
  }
  while (true) {
    Generation::Event ev = co_await gen.next();
    if (ev.kind == Generation::Event::Error) {
      if (!stream) throw ApiError(500, ev.reason, "server_error", "generation_failed");
      const std::string err = error_body(500, ev.reason, "server_error", "generation_failed").dump();
      co_await s.stream_data(err);
      co_await s.stream_end();
      co_return;
    }
    if (ev.kind == Generation::Event::Done) {
      const std::string reason = finish_reason(ev.reason);
      if (!stream) {
        json choice = chat ? json{{"index", 0},
                                  {"message", {{"role", "assistant"}, {"content", text}}},
                                  {"logprobs", want_logprobs ? json{{"content", chat_lp}} : json(nullptr)},
                                  {"finish_reason", reason}}
                           : json{{"index", 0},
                                  {"text", text},
                                  {"logprobs", want_logprobs ? comp_lp.to_json() : json(nullptr)},
                                  {"finish_reason", reason}};
        const json full = {{"id", id},
                               {"object", chat ? "chat.completion" : "text_completion"},
                               {"created", created},
                               {"model", model},
                               {"choices", json::array({choice})},
                               {"usage", usage_json(ev.usage)}};
        co_await s.reply(200, full);
        co_return;
      }
      json last = chat ? chunk({{"delta", json::object()}, {"logprobs", nullptr}, {"finish_reason", reason}})
                       : chunk({{"text", ""}, {"logprobs", nullptr}, {"finish_reason", reason}});
      bool ok = co_await s.stream_data(last.dump());
      if (ok && include_usage) {
        json u = {{"id", id}, {"object", object}, {"created", created}, {"model", model},
                  {"choices", json::array()}, {"usage", usage_json(ev.usage)}};
        ok = co_await s.stream_data(u.dump());
      }
      const std::string done = "[DONE]";
      if (ok) co_await s.stream_data(done);
      co_await s.stream_end();
      co_return;
    }
    const TokenEvent& t = ev.token;
    const size_t offset = text.size();
    text += t.text;
    json lp = nullptr;
    if (want_logprobs && t.id >= 0) {
      if (chat) {
        json entry = chat_logprob(s.state.tok, t);
        chat_lp.push_back(entry);
        lp = {{"content", json::array({entry})}};
      } else {
        CompletionLogprobs one;
        one.add(s.state.tok, t, offset);
        comp_lp.add(s.state.tok, t, offset);
        lp = one.to_json();
      }
    }
    if (stream && (!t.text.empty() || !lp.is_null())) {
      json c = chat ? chunk({{"delta", {{"content", t.text}}}, {"logprobs", lp}, {"finish_reason", nullptr}})
                    : chunk({{"text", t.text}, {"logprobs", lp}, {"finish_reason", nullptr}});
      const std::string text_c = c.dump(-1, ' ', false, json::error_handler_t::replace);
      if (!co_await s.stream_data(text_c)) {
        gen.cancel();  // the client is gone
        s.keep_alive = false;
        co_return;
      }
    }
  }
}

std::string message_content(const json& m) {
  auto it = m.find("content");
  if (it == m.end() || it->is_null()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    std::string text;
    for (const auto& part : *it) {
      if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string()) {
        throw ApiError(400, "only text content parts are supported");
      }
      text += part["text"].get<std::string>();
    }
    return text;
  }
  throw ApiError(400, "'content' must be a string or a list of text parts");
}

}  // namespace

awaitable<void> chat_completions(Session& s) {
  const json body = parse_body(s.request);
  check_model(s.state, body);
  auto it = body.find("messages");
  if (it == body.end() || !it->is_array() || it->empty()) throw ApiError(400, "'messages' must be a non-empty list");
  std::vector<tokenizer::ChatMessage> messages;
  for (const auto& m : *it) {
    if (!m.is_object()) throw ApiError(400, "each message must be an object");
    auto role = opt_string(m, "role");
    if (!role) throw ApiError(400, "each message needs a 'role'");
    messages.push_back({*role, message_content(m)});
  }
  OnlineRequest req;
  req.max_tokens = -1;  // OpenAI's default for chat: until the end of generation or the context
  parse_generation(body, req);
  req.prompt = s.state.tok.encode(s.state.chat.apply(messages, true), true, true);
  co_await generate(s, body, std::move(req), true);
}

awaitable<void> completions(Session& s) {
  const json body = parse_body(s.request);
  check_model(s.state, body);
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) throw ApiError(400, "'prompt' is required");
  if (it->is_array() && it->size() > 1 && (*it)[0].is_string()) throw ApiError(400, "only one prompt per request");
  OnlineRequest req;
  req.max_tokens = 16;  // OpenAI's default for completions
  parse_generation(body, req);
  req.prompt = parse_prompt(s.state, *it);
  co_await generate(s, body, std::move(req), false);
}

awaitable<void> models(Session& s) {
  json model = {{"id", s.state.options.model_name},
                {"object", "model"},
                {"created", std::chrono::duration_cast<std::chrono::seconds>(s.state.started.time_since_epoch()).count()},
                {"owned_by", "pico"}};
  const json list = {{"object", "list"}, {"data", json::array({model})}};
  co_await s.reply(200, list);
}

}  // namespace pico::coordinator::http_api
