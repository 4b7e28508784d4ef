#include <spdlog/spdlog.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <limits>
#include <future>
#include <thread>

#include "http/api.hpp"

namespace pico::coordinator {

namespace http_api {

using asio::use_awaitable;

json error_body(int status, const std::string& message, const std::string& type, const std::string& code,
               const std::string& param) {
  json err = {{"message", message}, {"type", type}, {"code", code.empty() ? json(status) : json(code)}};
  if (!param.empty()) err["param"] = param;
  return {{"error", err}};
}

namespace {

// Closes the socket when a write has not finished within the deadline (a client that
// stopped reading): the write then fails and the request is cancelled. On the
// connection's strand, as the socket's other operations.
class WriteDeadline {
 public:
  WriteDeadline(const asio::any_io_executor& strand, tcp::socket& socket, int seconds)
      : timer_(strand), armed_(std::make_shared<bool>(true)) {
    timer_.expires_after(std::chrono::seconds(seconds));
    timer_.async_wait([&socket, armed = armed_](const beast::error_code& ec) {
      if (ec || !*armed) return;
      spdlog::warn("dropping a client that takes no reply data");
      beast::error_code ignored;
      socket.close(ignored);
    });
  }
  ~WriteDeadline() {
    *armed_ = false;
    timer_.cancel();
  }
  WriteDeadline(const WriteDeadline&) = delete;
  WriteDeadline& operator=(const WriteDeadline&) = delete;

 private:
  asio::steady_timer timer_;
  std::shared_ptr<bool> armed_;
};

// The headers every reply carries.
template <class Response>
void common_headers(const ServerOptions& options, Response& res) {
  res.set(http::field::server, "pico");
  if (!options.cors_origin.empty()) {
    res.set(http::field::access_control_allow_origin, options.cors_origin);
    res.set(http::field::vary, "Origin");
  }
}

}  // namespace

// ---- Session ----

awaitable<void> Session::reply(int status, const json& body) {
  co_await reply_text(status, "application/json", body.dump(-1, ' ', false, json::error_handler_t::replace));
}

awaitable<void> Session::reply_text(int status, const std::string& content_type, std::string body) {
  http::response<http::string_body> res{static_cast<http::status>(status), request.version()};
  common_headers(state.options, res);
  if (!content_type.empty()) res.set(http::field::content_type, content_type);
  for (const auto& [name, value] : extra_headers) res.set(name, value);
  for (const auto& [name, value] : named_headers) res.set(name, value);
  res.keep_alive(keep_alive);
  res.body() = std::move(body);
  res.prepare_payload();
  beast::error_code ec;
  {
    WriteDeadline deadline(co_await asio::this_coro::executor, socket, state.options.write_timeout_s);
    co_await http::async_write(socket, res, asio::redirect_error(use_awaitable, ec));
  }
  if (ec) keep_alive = false;
}

awaitable<bool> Session::stream_begin() {
  http::response<http::empty_body> res{http::status::ok, request.version()};
  common_headers(state.options, res);
  res.set(http::field::content_type, "text/event-stream");
  res.set(http::field::cache_control, "no-cache");
  res.keep_alive(keep_alive);
  res.chunked(true);
  http::response_serializer<http::empty_body> sr{res};
  beast::error_code ec;
  {
    WriteDeadline deadline(co_await asio::this_coro::executor, socket, state.options.write_timeout_s);
    co_await http::async_write_header(socket, sr, asio::redirect_error(use_awaitable, ec));
  }
  streaming_ = true;
  broken_ = static_cast<bool>(ec);
  co_return !broken_;
}

awaitable<bool> Session::stream_data(const std::string& data, std::string_view event_name) {
  std::string event;
  if (!event_name.empty()) event.append("event: ").append(event_name).append("\n");
  event.append("data: ").append(data).append("\n\n");
  co_return co_await stream_write(std::move(event));
}

awaitable<bool> Session::stream_comment() { co_return co_await stream_write(": \n\n"); }

awaitable<bool> Session::stream_write(std::string event) {
  if (broken_) co_return false;
  beast::error_code ec;
  {
    WriteDeadline deadline(co_await asio::this_coro::executor, socket, state.options.write_timeout_s);
    co_await asio::async_write(socket, http::make_chunk(asio::buffer(event)), asio::redirect_error(use_awaitable, ec));
  }
  broken_ = static_cast<bool>(ec);
  co_return !broken_;
}

awaitable<void> Session::stream_end() {
  if (broken_) {
    keep_alive = false;
    co_return;
  }
  beast::error_code ec;
  {
    WriteDeadline deadline(co_await asio::this_coro::executor, socket, state.options.write_timeout_s);
    co_await asio::async_write(socket, http::make_chunk_last(), asio::redirect_error(use_awaitable, ec));
  }
  if (ec) keep_alive = false;
}

// ---- Generation ----

Generation::Generation(Engine& engine, const asio::any_io_executor& executor, tcp::socket& socket,
                       OnlineRequest request)
    : Generation(engine, executor, socket, std::vector<OnlineRequest>{std::move(request)}) {}

Generation::Generation(Engine& engine, const asio::any_io_executor& executor, tcp::socket& socket,
                       std::vector<OnlineRequest> choices)
    : channel_(std::make_shared<Channel>(executor)), socket_(socket) {
  for (size_t i = 0; i < choices.size(); ++i) {
    auto push = [ch = channel_, i](Event ev) {
      ev.choice = i;
      {
        std::lock_guard lock(ch->mutex);
        ch->events.push_back(std::move(ev));
      }
      asio::post(ch->timer.get_executor(), [ch] { ch->timer.cancel(); });
    };
    Callbacks cb;
    cb.on_token = [push](const TokenEvent& t) { push({Event::Token, 0, t, {}, {}, {}}); };
    cb.on_done = [push](const std::string& reason, const Usage& u) { push({Event::Done, 0, {}, reason, u, {}}); };
    cb.on_error = [push](const std::string& message) { push({Event::Error, 0, {}, message, {}, {}}); };
    cb.on_embedding = [push](std::vector<std::vector<float>> rows) {
      push({Event::Embedding, 0, {}, {}, {}, std::move(rows)});
    };
    cb.on_prompt_progress = [push](const PromptProgress& p) { push({Event::Progress, 0, {}, {}, {}, {}, p}); };
    try {
      handles_.push_back(engine.submit(std::move(choices[i]), std::move(cb)));
      finished_.push_back(false);
    } catch (const QueueFull& e) {
      cancel();
      throw ApiError(503, e.what(), "unavailable_error", "queue_full");
    } catch (const std::invalid_argument& e) {
      cancel();
      const bool too_long = std::string_view(e.what()).find("context") != std::string_view::npos;
      throw ApiError(400, e.what(), too_long ? "exceed_context_size_error" : "invalid_request_error",
                     too_long ? "" : "invalid_prompt");
    }
  }
  watch(socket_, channel_, handles_);
}

Generation::~Generation() {
  cancel();
  channel_->watching = false;
  beast::error_code ec;
  socket_.cancel(ec);  // the watch (the coroutine, on this strand, has nothing else pending)
}

void Generation::cancel() {
  for (size_t i = 0; i < handles_.size(); ++i) {
    if (!finished_[i]) handles_[i].cancel();
    finished_[i] = true;
  }
}

bool Generation::client_gone() const { return channel_->gone; }

// Waits for the socket to become readable without reading: end of stream or an error
// means the client is gone; data (a pipelined request) is left for the next read.
void Generation::watch(tcp::socket& socket, std::shared_ptr<Channel> channel, std::vector<Engine::Handle> handles) {
  auto executor = channel->timer.get_executor();
  socket.async_wait(tcp::socket::wait_read,
                    asio::bind_executor(executor, [&socket, ch = std::move(channel),
                                                   hs = std::move(handles)](const beast::error_code& ec) mutable {
                      if (!ch->watching || ec == asio::error::operation_aborted) return;
                      if (!ec) {
                        char byte = 0;
                        const ssize_t n = ::recv(socket.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
                        if (n > 0) return;
                        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
                          watch(socket, std::move(ch), std::move(hs));
                          return;
                        }
                      }
                      ch->gone = true;
                      for (auto& h : hs) h.cancel();
                      ch->timer.cancel();
                    }));
}

awaitable<Generation::Event> Generation::next() {
  while (true) {
    {
      std::lock_guard lock(channel_->mutex);
      if (!channel_->events.empty()) {
        Event ev = std::move(channel_->events.front());
        channel_->events.pop_front();
        if (ev.kind != Event::Token && ev.kind != Event::Progress) finished_[ev.choice] = true;
        co_return ev;
      }
    }
    // Woken by the engine's post; the bound only guards against a lost wake-up.
    channel_->timer.expires_after(std::chrono::milliseconds(100));
    beast::error_code ec;
    co_await channel_->timer.async_wait(asio::redirect_error(use_awaitable, ec));
  }
}

// ---- request helpers ----

json parse_body(const HttpRequest& request) { return parse_json_body(request.body()); }

awaitable<json> off_thread(std::function<json()> work, std::string code) {
  auto result = std::make_shared<std::promise<json>>();
  std::future<json> done = result->get_future();
  std::thread([result, work = std::move(work)]() mutable {
    try {
      result->set_value(work());
    } catch (...) {
      result->set_exception(std::current_exception());
    }
  }).detach();
  asio::steady_timer timer(co_await asio::this_coro::executor);
  while (done.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    timer.expires_after(std::chrono::milliseconds(20));
    co_await timer.async_wait(asio::use_awaitable);
  }
  try {
    co_return done.get();
  } catch (const StageError& e) {
    throw ApiError(400, e.what(), "invalid_request_error", code);
  } catch (const std::invalid_argument& e) {
    throw ApiError(400, e.what(), "invalid_request_error", code);
  }
}

int64_t unix_time() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// ---- routing and connections ----

namespace {

using Handler = awaitable<void> (*)(Session&);

struct Route {
  const char* path;
  http::verb method;
  Handler handler;
};

const Route kRoutes[] = {
    {"/v1/chat/completions", http::verb::post, chat_completions},
    {"/chat/completions", http::verb::post, chat_completions},
    {"/v1/completions", http::verb::post, completions},
    {"/v1/models", http::verb::get, models},
    {"/models", http::verb::get, models},
    {"/v1/models/*", http::verb::get, model_by_id},
    {"/models/*", http::verb::get, model_by_id},
    {"/completion", http::verb::post, llama_completion},
    {"/completions", http::verb::post, llama_completion},  // llama-server's native shape, as its /completion
    {"/infill", http::verb::post, infill},
    {"/v1/embeddings", http::verb::post, embeddings},
    {"/v1/responses", http::verb::post, responses},
    {"/responses", http::verb::post, responses},
    {"/embeddings", http::verb::post, llama_embeddings},
    {"/embedding", http::verb::post, llama_embeddings},
    {"/apply-template", http::verb::post, apply_template},
    {"/tokenize", http::verb::post, tokenize},
    {"/detokenize", http::verb::post, detokenize},
    {"/health", http::verb::get, health},
    {"/v1/health", http::verb::get, health},
    {"/props", http::verb::get, props},
    {"/props", http::verb::post, set_props},
    {"/slots", http::verb::get, slots},
    {"/slots/*", http::verb::post, slot_action},
    {"/metrics", http::verb::get, metrics},
    {"/v1/messages", http::verb::post, anthropic_messages},
    {"/v1/messages/count_tokens", http::verb::post, anthropic_count_tokens},
    {"/cluster", http::verb::get, cluster},
    {"/cluster/workers", http::verb::post, cluster_join},
    {"/cluster/replan", http::verb::post, cluster_replan},
    {"/", http::verb::get, webui_page},
    {"/ui/*", http::verb::get, webui_file},
    {"/layer-trace", http::verb::get, layer_trace},
};


// Constant time in the key's bytes: how much of a wrong key matches never shows.
bool same_secret(std::string_view given, std::string_view expected) {
  unsigned char diff = given.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    diff |= static_cast<unsigned char>(expected[i] ^ (i < given.size() ? given[i] : 0));
  }
  return diff == 0;
}

std::string_view view(beast::string_view s) { return {s.data(), s.size()}; }

std::string path_of(beast::string_view target) {
  const std::string_view t = view(target);
  return std::string(t.substr(0, t.find('?')));
}

bool authorized(const ServerState& state, const HttpRequest& request) {
  const auto& key = state.options.api_key;
  const std::string path = path_of(request.target());
  if (key.empty() || path == "/health" || path == "/v1/health") return true;
  if (state.options.webui && request.method() == http::verb::get && is_webui_path(path)) return true;
  if (request.method() == http::verb::options && !state.options.cors_origin.empty()) return true;  // preflight
  // OpenAI's clients send "Authorization: Bearer KEY", Anthropic's "x-api-key: KEY".
  return same_secret(view(request[http::field::authorization]), "Bearer " + key) ||
         same_secret(view(request["x-api-key"]), key);
}

awaitable<void> dispatch(Session& s) {
  const std::string target = path_of(s.request.target());
  int status = 0;
  std::string message, type = "invalid_request_error", code, param;
  const Route* route = nullptr;
  bool path_known = false;
  for (const auto& r : kRoutes) {
    // "PREFIX*": any non-empty rest of the path (a model's id).
    const std::string_view pattern = r.path;
    const bool prefix = pattern.ends_with('*');
    const std::string_view head = prefix ? pattern.substr(0, pattern.size() - 1) : pattern;
    if (prefix ? !(target.size() > head.size() && target.starts_with(head)) : target != head) continue;
    path_known = true;
    if (s.request.method() == r.method) route = &r;
  }
  if (!authorized(s.state, s.request)) {
    status = 401, message = "invalid or missing API key (Authorization: Bearer KEY, or x-api-key: KEY)", code = "invalid_api_key";
    type = "authentication_error";
  } else if (path_known && s.request.method() == http::verb::options && !s.state.options.cors_origin.empty()) {
    // CORS preflight.
    s.extra_headers = {{http::field::access_control_allow_methods, "GET, POST, OPTIONS"},
                       {http::field::access_control_allow_headers, "Authorization, Content-Type, x-api-key, anthropic-version"},
                       {http::field::access_control_max_age, "600"}};
    co_await s.reply_text(204, "", "");
    co_return;
  } else if (!route) {
    status = path_known ? 405 : 404;
    message = path_known ? "method not allowed on " + target : "no route " + target;
    code = path_known ? "method_not_allowed" : "not_found";
  } else {
    try {
      co_await route->handler(s);
    } catch (const ApiError& e) {
      status = e.status, message = e.what(), type = e.type, code = e.code, param = e.param;
    } catch (const json::exception& e) {
      status = 400, message = std::string("bad request: ") + e.what();
    } catch (const std::bad_alloc&) {
      status = 500, message = "out of memory", type = "server_error";
    } catch (const std::exception& e) {
      status = 500, message = e.what(), type = "server_error";
    }
  }
  if (status != 0) {
    if (status == 503) s.extra_headers.push_back({http::field::retry_after, "1"});
    const json err = error_body(status, message, type, code, param);
    co_await s.reply(status, err);
  }
}

// Answers once and closes: read what the client still sends (up to linger_s) so that it
// sees the answer rather than a reset.
awaitable<void> refuse(ServerState& state, tcp::socket& socket, int status, const json& body, int linger_s,
                       std::vector<std::pair<http::field, std::string>> headers = {}) {
  HttpRequest dummy;
  Session s(state, socket, dummy);
  s.keep_alive = false;
  s.extra_headers = std::move(headers);
  co_await s.reply(status, body);
  beast::error_code ec;
  socket.shutdown(tcp::socket::shutdown_send, ec);
  asio::steady_timer timer(co_await asio::this_coro::executor);
  timer.expires_after(std::chrono::seconds(linger_s));
  auto draining = std::make_shared<bool>(true);
  timer.async_wait([&socket, draining](const beast::error_code& e) {
    beast::error_code ignored;
    if (!e && *draining) socket.close(ignored);  // same strand as this coroutine
  });
  std::vector<char> sink(64 * 1024);
  while (!ec) co_await socket.async_read_some(asio::buffer(sink), asio::redirect_error(use_awaitable, ec));
  *draining = false;
  timer.cancel();
}

awaitable<void> connection(ServerState& state, tcp::socket socket) {
  struct Counted {  // this connection, in state.connections
    ServerState& state;
    ~Counted() { --state.connections; }
  } counted{state};
  beast::flat_buffer buffer;
  while (true) {
    http::request_parser<http::string_body> parser;
    parser.body_limit(state.options.body_limit);
    parser.header_limit(static_cast<uint32_t>(std::min<size_t>(state.options.header_limit, UINT32_MAX)));
    beast::error_code ec;
    // A connection that sends no complete request within the read timeout is closed.
    asio::steady_timer idle(co_await asio::this_coro::executor);
    idle.expires_after(std::chrono::seconds(state.options.read_timeout_s));
    auto reading = std::make_shared<bool>(true);
    idle.async_wait([&socket, reading](const beast::error_code& e) {
      beast::error_code ignored;
      if (!e && *reading) socket.close(ignored);  // same strand as this coroutine
    });
    co_await http::async_read_header(socket, buffer, parser, asio::redirect_error(use_awaitable, ec));
    bool answered = false;  // refused after the header, before its body
    if (!ec && beast::iequals(parser.get()[http::field::expect], "100-continue")) {
      // The client waits for a go-ahead before it sends the body: the errors that do not
      // need the body come now, else 100 Continue.
      const auto length = parser.content_length();
      if (length && *length > state.options.body_limit) {
        *reading = false;
        idle.cancel();
        co_await refuse(state, socket, 413,
                        error_body(413, "the request body is too large (at most " +
                                            std::to_string(state.options.body_limit) + " bytes)",
                                   "invalid_request_error", "request_too_large"),
                        1);
        answered = true;
      } else if (!authorized(state, parser.get())) {
        *reading = false;
        idle.cancel();
        co_await refuse(state, socket, 401,
                        error_body(401, "invalid or missing API key (Authorization: Bearer KEY, or x-api-key: KEY)",
                                   "authentication_error", "invalid_api_key"),
                        1);
        answered = true;
      } else {
        static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
        WriteDeadline deadline(co_await asio::this_coro::executor, socket, state.options.write_timeout_s);
        co_await asio::async_write(socket, asio::buffer(kContinue), asio::redirect_error(use_awaitable, ec));
      }
    }
    if (answered) break;
    if (!ec && !parser.is_done()) {
      co_await http::async_read(socket, buffer, parser, asio::redirect_error(use_awaitable, ec));
    }
    *reading = false;
    idle.cancel();
    if (ec == http::error::end_of_stream || ec == asio::error::eof || ec == asio::error::connection_reset ||
        ec == asio::error::operation_aborted || ec == asio::error::bad_descriptor || !socket.is_open()) {
      break;
    }
    if (ec) {
      // Too large or not HTTP: answer once, then close.
      int status = 400;
      std::string message = "malformed HTTP request: " + ec.message(), code = "bad_request";
      if (ec == http::error::body_limit) {
        status = 413, code = "request_too_large";
        message = "the request body is too large (at most " + std::to_string(state.options.body_limit) + " bytes)";
      } else if (ec == http::error::header_limit) {
        status = 431, code = "header_too_large";
        message = "the request header is too large (at most " + std::to_string(state.options.header_limit) + " bytes)";
      }
      co_await refuse(state, socket, status, error_body(status, message, "invalid_request_error", code), 5);
      break;
    }
    const HttpRequest request = parser.release();
    ++state.http_requests;
    Session s(state, socket, request);
    s.keep_alive = request.keep_alive();
    co_await dispatch(s);
    if (!s.keep_alive) break;
  }
  beast::error_code ec;
  socket.shutdown(tcp::socket::shutdown_send, ec);
  socket.close(ec);
}

awaitable<void> too_many_connections(ServerState& state, tcp::socket socket) {
  const json err = error_body(503, "too many connections (at most " + std::to_string(state.options.max_connections) + ")",
                              "unavailable_error", "too_many_connections");
  std::vector<std::pair<http::field, std::string>> headers{{http::field::retry_after, "1"}};
  co_await refuse(state, socket, 503, err, 1, std::move(headers));
  beast::error_code ec;
  socket.close(ec);
}

awaitable<void> listen(ServerState& state, tcp::acceptor& acceptor) {
  asio::steady_timer backoff(acceptor.get_executor());
  bool failing = false;  // logged once per run of failures
  while (true) {
    beast::error_code ec;
    tcp::socket socket = co_await acceptor.async_accept(asio::redirect_error(use_awaitable, ec));
    if (ec == asio::error::operation_aborted) co_return;
    if (ec) {
      // Out of file descriptors (EMFILE, ENFILE) and the like: the pending connection
      // stays queued and accept would fail again at once; wait instead of spinning.
      if (!failing) spdlog::error("accept failed: {} (retrying every 100 ms)", ec.message());
      failing = true;
      backoff.expires_after(std::chrono::milliseconds(100));
      co_await backoff.async_wait(asio::redirect_error(use_awaitable, ec));
      continue;
    }
    if (failing) spdlog::info("accepting connections again");
    failing = false;
    socket.set_option(tcp::no_delay(true), ec);
    auto strand = asio::make_strand(acceptor.get_executor());
    if (state.connections.load() >= state.options.max_connections) {
      asio::co_spawn(strand, too_many_connections(state, std::move(socket)), asio::detached);
      continue;
    }
    ++state.connections;
    asio::co_spawn(strand, connection(state, std::move(socket)), asio::detached);
  }
}

}  // namespace
}  // namespace http_api

void serve_http(Engine& engine, const tokenizer::Tokenizer& tok, const tokenizer::ChatTemplate& chat,
                const ServerOptions& options) {
  using namespace http_api;
  ParseContext parse{tok, nullptr, engine.options().ctx, options.model_name, options.model_path, 16,
                     options.max_stop_strings, options.max_stop_length, options.reasoning_format};
  DryBreakerCache dry_breakers(tok);
  parse.dry_breakers = &dry_breakers;
  GrammarVocabularyCache grammar_vocabulary(tok);
  parse.grammar_vocabulary = &grammar_vocabulary;
  parse.n_embd = options.n_embd;
  ServerState state{engine, tok, chat, options, parse};
  state.parse.chat = &state.chat;
  const int threads = std::max(1, options.threads);
  asio::io_context io(threads);
  tcp::acceptor acceptor(io);
  const tcp::endpoint endpoint(asio::ip::make_address(options.host), options.port);
  acceptor.open(endpoint.protocol());
  acceptor.set_option(asio::socket_base::reuse_address(true));
  acceptor.bind(endpoint);
  acceptor.listen(asio::socket_base::max_listen_connections);
  spdlog::info("listening on http://{}:{} (model {})", options.host, acceptor.local_endpoint().port(),
               options.model_name);
  asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](const beast::error_code&, int) {
    spdlog::info("stopping");
    io.stop();
  });
  asio::co_spawn(io, listen(state, acceptor), asio::detached);
  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i) pool.emplace_back([&io] { io.run(); });
  io.run();
  for (auto& t : pool) t.join();
  engine.stop();  // no more callbacks into the io_context before it goes
}

}  // namespace pico::coordinator
