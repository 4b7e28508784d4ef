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
#include <random>
#include <thread>

#include "http/api.hpp"

namespace pico::coordinator {

namespace http_api {

using asio::use_awaitable;

json error_body(int status, const std::string& message, const std::string& type, const std::string& code) {
  json err = {{"message", message}, {"type", type}, {"code", code.empty() ? json(status) : json(code)}};
  return {{"error", err}};
}

// ---- Session ----

awaitable<void> Session::reply(int status, const json& body) {
  co_await reply_text(status, "application/json", body.dump(-1, ' ', false, json::error_handler_t::replace));
}

awaitable<void> Session::reply_text(int status, const std::string& content_type, std::string body) {
  http::response<http::string_body> res{static_cast<http::status>(status), request.version()};
  res.set(http::field::server, "pico");
  res.set(http::field::content_type, content_type);
  res.set(http::field::access_control_allow_origin, "*");
  res.keep_alive(keep_alive);
  res.body() = std::move(body);
  res.prepare_payload();
  beast::error_code ec;
  co_await http::async_write(socket, res, asio::redirect_error(use_awaitable, ec));
  if (ec) keep_alive = false;
}

awaitable<bool> Session::stream_begin() {
  http::response<http::empty_body> res{http::status::ok, request.version()};
  res.set(http::field::server, "pico");
  res.set(http::field::content_type, "text/event-stream");
  res.set(http::field::cache_control, "no-cache");
  res.set(http::field::access_control_allow_origin, "*");
  res.keep_alive(keep_alive);
  res.chunked(true);
  http::response_serializer<http::empty_body> sr{res};
  beast::error_code ec;
  co_await http::async_write_header(socket, sr, asio::redirect_error(use_awaitable, ec));
  streaming_ = true;
  broken_ = static_cast<bool>(ec);
  co_return !broken_;
}

awaitable<bool> Session::stream_data(const std::string& data) {
  if (broken_) co_return false;
  const std::string event = "data: " + data + "\n\n";
  beast::error_code ec;
  co_await asio::async_write(socket, http::make_chunk(asio::buffer(event)), asio::redirect_error(use_awaitable, ec));
  broken_ = static_cast<bool>(ec);
  co_return !broken_;
}

awaitable<void> Session::stream_end() {
  if (broken_) {
    keep_alive = false;
    co_return;
  }
  beast::error_code ec;
  co_await asio::async_write(socket, http::make_chunk_last(), asio::redirect_error(use_awaitable, ec));
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
    cb.on_token = [push](const TokenEvent& t) { push({Event::Token, 0, t, {}, {}}); };
    cb.on_done = [push](const std::string& reason, const Usage& u) { push({Event::Done, 0, {}, reason, u}); };
    cb.on_error = [push](const std::string& message) { push({Event::Error, 0, {}, message, {}}); };
    try {
      handles_.push_back(engine.submit(std::move(choices[i]), std::move(cb)));
      finished_.push_back(false);
    } catch (const std::invalid_argument& e) {
      cancel();
      const bool too_long = std::string_view(e.what()).find("context") != std::string_view::npos;
      throw ApiError(400, e.what(), "invalid_request_error", too_long ? "context_length_exceeded" : "invalid_prompt");
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
        if (ev.kind != Event::Token) finished_[ev.choice] = true;
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

json parse_body(const HttpRequest& request) {
  json body = json::parse(request.body(), nullptr, false);
  if (body.is_discarded()) throw ApiError(400, "the request body is not valid JSON");
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  return body;
}

namespace {
const json* field(const json& body, const char* key) {
  auto it = body.find(key);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}
}  // namespace

std::optional<double> opt_number(const json& body, const char* key) {
  const json* v = field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) throw ApiError(400, std::string("'") + key + "' must be a number");
  return v->get<double>();
}

std::optional<int64_t> opt_int(const json& body, const char* key) {
  const json* v = field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_number_integer()) throw ApiError(400, std::string("'") + key + "' must be an integer");
  return v->get<int64_t>();
}

std::optional<bool> opt_bool(const json& body, const char* key) {
  const json* v = field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) throw ApiError(400, std::string("'") + key + "' must be a boolean");
  return v->get<bool>();
}

std::optional<std::string> opt_string(const json& body, const char* key) {
  const json* v = field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) throw ApiError(400, std::string("'") + key + "' must be a string");
  return v->get<std::string>();
}

void parse_generation(const json& body, OnlineRequest& r) {
  auto& sp = r.sampling;
  if (auto v = opt_number(body, "temperature")) {
    if (*v < 0 || *v > 100) throw ApiError(400, "'temperature' must be between 0 and 100");
    sp.temperature = static_cast<float>(*v);
  }
  if (auto v = opt_number(body, "top_p")) sp.top_p = static_cast<float>(*v);
  if (auto v = opt_int(body, "top_k")) sp.top_k = static_cast<int32_t>(std::clamp<int64_t>(*v, -1, 1 << 30));
  if (auto v = opt_number(body, "min_p")) sp.min_p = static_cast<float>(*v);
  if (auto v = opt_number(body, "typical_p")) sp.typical_p = static_cast<float>(*v);
  if (auto v = opt_number(body, "presence_penalty")) sp.presence_penalty = static_cast<float>(*v);
  if (auto v = opt_number(body, "frequency_penalty")) sp.frequency_penalty = static_cast<float>(*v);
  if (auto v = opt_number(body, "repeat_penalty")) sp.repeat_penalty = static_cast<float>(*v);
  if (auto v = opt_int(body, "repeat_last_n")) {
    sp.penalty_last_n = static_cast<int32_t>(std::clamp<int64_t>(*v, -1, 1 << 30));
  }
  if (auto v = opt_int(body, "seed")) {
    if (*v >= 0) sp.seed = static_cast<uint32_t>(*v);
  }
  for (const char* key : {"max_tokens", "max_completion_tokens", "n_predict"}) {
    if (auto v = opt_int(body, key)) {
      if (*v < -1 || (*v == 0 && std::string(key) != "n_predict")) {
        throw ApiError(400, std::string("'") + key + "' must be a positive integer");
      }
      r.max_tokens = static_cast<int>(std::min<int64_t>(*v, std::numeric_limits<int32_t>::max()));
    }
  }
  if (auto v = opt_bool(body, "ignore_eos")) r.ignore_eos = *v;
  if (auto v = opt_bool(body, "cache_prompt")) r.cache_prompt = *v;
  if (const json* stop = field(body, "stop")) {
    if (stop->is_string()) {
      r.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (const auto& s : *stop) {
        if (!s.is_string()) throw ApiError(400, "'stop' must be a string or a list of strings");
        r.stop.push_back(s.get<std::string>());
      }
    } else {
      throw ApiError(400, "'stop' must be a string or a list of strings");
    }
  }
}

std::vector<int32_t> parse_prompt(const ServerState& state, const json& prompt) {
  const json* p = &prompt;
  if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) p = &(*p)[0];
  if (p->is_string()) return state.tok.encode(p->get<std::string>(), true, true);
  if (p->is_array() && !p->empty()) {
    std::vector<int32_t> ids;
    for (const auto& t : *p) {
      if (!t.is_number_integer()) throw ApiError(400, "'prompt' must be a string or a list of token ids");
      const int64_t id = t.get<int64_t>();
      if (id < 0 || id > std::numeric_limits<int32_t>::max()) {
        throw ApiError(400, "token id " + std::to_string(id) + " is out of the vocabulary", "invalid_request_error",
                       "invalid_prompt");
      }
      ids.push_back(static_cast<int32_t>(id));
    }
    return ids;
  }
  throw ApiError(400, "'prompt' must be a non-empty string or a list of token ids");
}

void check_model(const ServerState& state, const json& body) {
  auto name = opt_string(body, "model");
  if (!name || name->empty()) return;
  if (*name == state.options.model_name || *name == state.options.model_path) return;
  throw ApiError(404, "the model '" + *name + "' does not exist", "invalid_request_error", "model_not_found");
}

std::string random_id(const std::string& prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += alphabet[rng() % 62];
  return id;
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
    {"/completions", http::verb::post, completions},
    {"/v1/models", http::verb::get, models},
    {"/models", http::verb::get, models},
    {"/completion", http::verb::post, llama_completion},
    {"/tokenize", http::verb::post, tokenize},
    {"/detokenize", http::verb::post, detokenize},
    {"/health", http::verb::get, health},
    {"/v1/health", http::verb::get, health},
    {"/props", http::verb::get, props},
    {"/slots", http::verb::get, slots},
    {"/metrics", http::verb::get, metrics},
};

awaitable<void> dispatch(Session& s) {
  std::string target(s.request.target());
  target = target.substr(0, target.find('?'));
  int status = 0;
  std::string message, type = "invalid_request_error", code;
  const Route* route = nullptr;
  bool path_known = false;
  for (const auto& r : kRoutes) {
    if (target != r.path) continue;
    path_known = true;
    if (s.request.method() == r.method) route = &r;
  }
  const auto& key = s.state.options.api_key;
  if (!key.empty() && target != "/health" && target != "/v1/health" &&
      s.request[http::field::authorization] != "Bearer " + key) {
    status = 401, message = "invalid or missing API key (Authorization: Bearer KEY)", code = "invalid_api_key";
    type = "authentication_error";
  } else if (!route) {
    status = path_known ? 405 : 404;
    message = path_known ? "method not allowed on " + target : "no route " + target;
    code = path_known ? "method_not_allowed" : "not_found";
  } else {
    try {
      co_await route->handler(s);
    } catch (const ApiError& e) {
      status = e.status, message = e.what(), type = e.type, code = e.code;
    } catch (const json::exception& e) {
      status = 400, message = std::string("bad request: ") + e.what();
    } catch (const std::exception& e) {
      status = 500, message = e.what(), type = "server_error";
    }
  }
  if (status != 0) {
    const json err = error_body(status, message, type, code);
    co_await s.reply(status, err);
  }
}

awaitable<void> connection(ServerState& state, tcp::socket socket) {
  beast::flat_buffer buffer;
  while (true) {
    http::request_parser<http::string_body> parser;
    parser.body_limit(state.options.body_limit);
    parser.header_limit(64 * 1024);
    beast::error_code ec;
    // A connection that sends no complete request within the read timeout is closed.
    asio::steady_timer idle(co_await asio::this_coro::executor);
    idle.expires_after(std::chrono::seconds(state.options.read_timeout_s));
    auto reading = std::make_shared<bool>(true);
    idle.async_wait([&socket, reading](const beast::error_code& e) {
      beast::error_code ignored;
      if (!e && *reading) socket.close(ignored);  // same strand as this coroutine
    });
    co_await http::async_read(socket, buffer, parser, asio::redirect_error(use_awaitable, ec));
    *reading = false;
    idle.cancel();
    if (ec == http::error::end_of_stream || ec == asio::error::eof || ec == asio::error::connection_reset ||
        ec == asio::error::operation_aborted || ec == asio::error::bad_descriptor || !socket.is_open()) {
      break;
    }
    if (ec) {
      // Too large or not HTTP: answer once, then close.
      const bool too_large = ec == http::error::body_limit || ec == http::error::header_limit;
      HttpRequest dummy;
      Session s(state, socket, dummy);
      s.keep_alive = false;
      const int status = too_large ? 413 : 400;
      const json err = error_body(status, too_large ? "the request is too large" : "malformed HTTP request: " + ec.message(),
                                  "invalid_request_error", too_large ? "request_too_large" : "bad_request");
      co_await s.reply(status, err);
      // Lingering close: read what the client still sends (up to 5 s) so that it sees the
      // answer rather than a reset.
      socket.shutdown(tcp::socket::shutdown_send, ec);
      asio::steady_timer timer(co_await asio::this_coro::executor);
      timer.expires_after(std::chrono::seconds(5));
      auto draining = std::make_shared<bool>(true);
      timer.async_wait([&socket, draining](const beast::error_code& e) {
        beast::error_code ignored;
        if (!e && *draining) socket.close(ignored);  // same strand as this coroutine
      });
      std::vector<char> sink(64 * 1024);
      while (!ec) co_await socket.async_read_some(asio::buffer(sink), asio::redirect_error(use_awaitable, ec));
      *draining = false;
      timer.cancel();
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

awaitable<void> listen(ServerState& state, tcp::acceptor& acceptor) {
  while (true) {
    beast::error_code ec;
    tcp::socket socket = co_await acceptor.async_accept(asio::redirect_error(use_awaitable, ec));
    if (ec == asio::error::operation_aborted) co_return;
    if (ec) continue;
    socket.set_option(tcp::no_delay(true), ec);
    auto strand = asio::make_strand(acceptor.get_executor());
    asio::co_spawn(strand, connection(state, std::move(socket)), asio::detached);
  }
}

}  // namespace
}  // namespace http_api

void serve_http(Engine& engine, const tokenizer::Tokenizer& tok, const tokenizer::ChatTemplate& chat,
                const ServerOptions& options) {
  using namespace http_api;
  ServerState state{engine, tok, chat, options};
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
