// The HTTP API's internals shared by server.cpp (connections, routing, errors, SSE)
// and the endpoint files (api_openai.cpp, api_llama.cpp). Each connection is a
// coroutine on its own strand; a generation's tokens come from the engine thread
// through a queue that wakes the coroutine (Generation).
#pragma once

#include <atomic>
#include <utility>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "engine.hpp"
#include "http/random_id.hpp"
#include "http/request_parsing.hpp"
#include "http/server.hpp"
#include "tokenizer/chat_template.hpp"

namespace pico::coordinator::http_api {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using json = nlohmann::json;
template <class T>
using awaitable = asio::awaitable<T>;
using HttpRequest = http::request<http::string_body>;

json error_body(int status, const std::string& message, const std::string& type, const std::string& code,
               const std::string& param = {});
// llama-server's "timings" of one request (prompt and predicted: n, ms, per token, per second).
json timings_json(const Usage& u);
// llama-server's "prompt_progress" (total, cache, processed, time_ms).
json progress_json(const PromptProgress& p);
// What build answered (OpenAI's system_fingerprint).
inline const char* system_fingerprint() { return "pico-" PICO_VERSION; }

struct ServerState {
  Engine& engine;
  const tokenizer::Tokenizer& tok;
  tokenizer::ChatTemplate chat;
  ServerOptions options;
  ParseContext parse;
  std::chrono::system_clock::time_point started = std::chrono::system_clock::now();
  std::atomic<uint64_t> http_requests{0};
  std::atomic<int> connections{0};
};

// One HTTP exchange on a connection.
class Session {
 public:
  Session(ServerState& state_, tcp::socket& socket_, const HttpRequest& request_)
      : state(state_), socket(socket_), request(request_) {}
  ServerState& state;
  tcp::socket& socket;
  const HttpRequest& request;
  bool keep_alive = true;
  std::vector<std::pair<http::field, std::string>> extra_headers;  // on the next reply (e.g. Retry-After)
  std::vector<std::pair<std::string, std::string>> named_headers;  // the same, for fields Beast has no enum for

  awaitable<void> reply(int status, const json& body);
  awaitable<void> reply_text(int status, const std::string& content_type, std::string body);
  // Server-sent events over a chunked response; each returns false once the client is gone.
  awaitable<bool> stream_begin();
  // Writes "data: DATA\n\n", after "event: EVENT\n" when one is named (Anthropic's stream).
  awaitable<bool> stream_data(const std::string& data, std::string_view event = {});
  // Writes an SSE comment (": \n\n"): keeps a quiet stream checked for a client gone.
  awaitable<bool> stream_comment();
  awaitable<void> stream_end();

 private:
  awaitable<bool> stream_write(std::string event);  // one chunk of the stream
  bool streaming_ = false;
  bool broken_ = false;
};

// Submitted requests as seen from their connection's coroutine: one per choice (n > 1
// submits the same prompt n times), their events through one queue. The socket is
// watched meanwhile: a client that closes its connection cancels them (while queued,
// in prefill or in decode, streaming or not).
class Generation {
 public:
  struct Event {
    enum Kind { Token, Done, Error, Embedding, Progress } kind = Token;
    size_t choice = 0;
    TokenEvent token;
    std::string reason;  // Done: finish reason; Error: message
    Usage usage;
    std::vector<std::vector<float>> embedding;  // Embedding: Callbacks::on_embedding's rows (before Done)
    PromptProgress progress = {};               // Progress (OnlineRequest::return_progress)
  };
  // Throws ApiError when the engine refuses the request (400; 503 when its queue is
  // full). executor: the connection's strand.
  Generation(Engine& engine, const asio::any_io_executor& executor, tcp::socket& socket,
             std::vector<OnlineRequest> choices);
  Generation(Engine& engine, const asio::any_io_executor& executor, tcp::socket& socket, OnlineRequest request);
  ~Generation();
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;
  // The next event of any choice (each choice ends with one Done or Error).
  awaitable<Event> next();
  void cancel();
  size_t size() const { return handles_.size(); }
  // The client closed its connection (the requests were cancelled).
  bool client_gone() const;

 private:
  struct Channel {
    explicit Channel(const asio::any_io_executor& ex) : timer(ex) {}
    std::mutex mutex;
    std::deque<Event> events;
    asio::steady_timer timer;
    bool watching = true;  // strand only
    bool gone = false;     // strand only
  };
  static void watch(tcp::socket& socket, std::shared_ptr<Channel> channel, std::vector<Engine::Handle> handles);
  std::shared_ptr<Channel> channel_;
  tcp::socket& socket_;
  std::vector<Engine::Handle> handles_;
  std::vector<bool> finished_;
};

// Runs work on a thread of its own; the coroutine waits without holding an I/O thread.
// A StageError or std::invalid_argument from it becomes ApiError 400 with `code`.
// (Callers pass a named std::function: GCC 12 destroys a lambda temporary with
// captures inside a co_await expression twice.)
awaitable<json> off_thread(std::function<json()> work, std::string code);

// A chat reply's text through its splitters as it comes (reasoning, then tool calls,
// the Anthropic and Responses endpoints'): next() takes one event's text (done: the
// reply ended) and returns what is new; the reply's reasoning and content accumulate.
struct ChatReplySplit {
  ChatReplySplit(const ParsedGeneration& parsed, bool stream, std::function<std::string()> make_id)
      : split(ReasoningSplitter::for_reply(parsed.reasoning, stream)) {
    if (parsed.tools.active()) tool_split = ToolCallSplitter(parsed.tools, std::move(make_id));
  }
  struct Piece {
    std::string reasoning;
    ToolCallSplitter::Part tools;
  };
  Piece next(bool done, const std::string& text) {
    ReasoningSplitter::Split part = done ? split.finish() : split.feed(text);
    Piece out{std::move(part.reasoning), done ? tool_split.finish(part.content) : tool_split.feed(part.content)};
    reasoning += out.reasoning;
    content += out.tools.content;
    return out;
  }
  ReasoningSplitter split;
  ToolCallSplitter tool_split;
  std::string reasoning, content;
};

// The request's body as a JSON object (ApiError 400 otherwise).
json parse_body(const HttpRequest& request);
int64_t unix_time();

// Endpoints.
awaitable<void> chat_completions(Session& s);
awaitable<void> completions(Session& s);
awaitable<void> models(Session& s);
awaitable<void> model_by_id(Session& s);  // /v1/models/{id}
awaitable<void> llama_completion(Session& s);
awaitable<void> infill(Session& s);  // /infill: a /completion of the fill-in-the-middle prompt
awaitable<void> apply_template(Session& s);
awaitable<void> tokenize(Session& s);
awaitable<void> detokenize(Session& s);
awaitable<void> health(Session& s);
awaitable<void> props(Session& s);
awaitable<void> set_props(Session& s);
awaitable<void> slots(Session& s);
awaitable<void> slot_action(Session& s);  // POST /slots/{id}?action=save|restore|erase
awaitable<void> metrics(Session& s);
awaitable<void> embeddings(Session& s);              // /v1/embeddings
awaitable<void> responses(Session& s);               // /v1/responses
awaitable<void> llama_embeddings(Session& s);        // /embedding, /embeddings (llama-server's shape)
awaitable<void> anthropic_messages(Session& s);      // /v1/messages
awaitable<void> anthropic_count_tokens(Session& s);  // /v1/messages/count_tokens
awaitable<void> cluster(Session& s);
awaitable<void> cluster_join(Session& s);
awaitable<void> cluster_replan(Session& s);
awaitable<void> webui_page(Session& s);  // GET /: the web UI
awaitable<void> webui_file(Session& s);  // GET /ui/NAME: its files
// GET /layer-trace: server-sent events {"tokens": [{"seq", "pos", "rms": [per layer]}]}
// of the tokens computed while the stream is open (the heatmap).
awaitable<void> layer_trace(Session& s);
bool is_webui_path(std::string_view path);  // /, /ui/...: served without the API key

}  // namespace pico::coordinator::http_api
