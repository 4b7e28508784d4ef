// The web UI (coordinator/webui/, built into the binary by cmake/EmbedFiles.cmake): the
// page at / and its files at /ui/NAME. Static, so served without the API key (the page
// asks for it and sends it with its API calls, as llama-server's UI does); off with
// --no-webui. /layer-trace streams the activation heatmap's data (server-sent events,
// behind the key like every API path).
#include <chrono>
#include <cmath>
#include <cstddef>
#include <string_view>

#include "api.hpp"

namespace pico::coordinator::http_api {

namespace webui {
struct EmbeddedFile {
  std::string_view path;
  std::string_view bytes;
};
extern const EmbeddedFile kEmbeddedFiles[];
extern const size_t kEmbeddedFileCount;
}  // namespace webui

namespace {

std::string_view content_type(std::string_view path) {
  if (path.ends_with(".html")) return "text/html; charset=utf-8";
  if (path.ends_with(".js")) return "text/javascript; charset=utf-8";
  if (path.ends_with(".css")) return "text/css; charset=utf-8";
  return "application/octet-stream";
}

awaitable<void> serve_file(Session& s, std::string_view path) {
  if (!s.state.options.webui) throw ApiError(404, "the web UI is off (--no-webui)", "not_found_error", "not_found");
  for (size_t i = 0; i < webui::kEmbeddedFileCount; ++i) {
    const webui::EmbeddedFile& file = webui::kEmbeddedFiles[i];
    if (file.path != path) continue;
    // Everything the page loads comes from this server; no inline script.
    s.extra_headers = {{http::field::cache_control, "no-cache"}};
    s.named_headers = {
        {"Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; frame-ancestors 'none'"},
        {"X-Content-Type-Options", "nosniff"}};
    co_await s.reply_text(200, std::string(content_type(path)), std::string(file.bytes));
    co_return;
  }
  throw ApiError(404, "no file " + std::string(path) + " in the web UI", "not_found_error", "not_found");
}

}  // namespace

bool is_webui_path(std::string_view path) { return path == "/" || path.starts_with("/ui/"); }

awaitable<void> webui_page(Session& s) { co_await serve_file(s, "/index.html"); }

awaitable<void> layer_trace(Session& s) {
  // Watching makes the engine trace its tokens from its next step on; this connection's
  // end (a failed write) stops it.
  const auto watcher = s.state.engine.layer_trace().watch();
  if (!co_await s.stream_begin()) co_return;
  asio::steady_timer timer(co_await asio::this_coro::executor);
  auto idle = std::chrono::steady_clock::now();
  while (true) {
    timer.expires_after(std::chrono::milliseconds(100));
    beast::error_code ec;
    co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    const std::vector<TracedToken> tokens = watcher->take();
    if (tokens.empty()) {
      // A comment now and then: a client that left is noticed by the failed write.
      if (std::chrono::steady_clock::now() - idle < std::chrono::seconds(2)) continue;
      idle = std::chrono::steady_clock::now();
      if (!co_await s.stream_comment()) co_return;
      continue;
    }
    idle = std::chrono::steady_clock::now();
    json rows = json::array();
    for (const TracedToken& t : tokens) {
      json rms = json::array();
      for (const float v : t.rms) rms.push_back(std::isfinite(v) ? json(v) : json(nullptr));
      json row = json::object();
      row["seq"] = t.seq_id;
      row["pos"] = t.pos;
      row["rms"] = std::move(rms);
      rows.push_back(std::move(row));
    }
    json event = json::object();
    event["tokens"] = std::move(rows);
    const std::string data = event.dump();
    if (!co_await s.stream_data(data)) co_return;
  }
}

awaitable<void> webui_file(Session& s) {
  const std::string target(s.request.target().data(), s.request.target().size());
  const std::string path = target.substr(0, target.find('?'));
  co_await serve_file(s, std::string_view(path).substr(3));  // "/ui/app.js" -> "/app.js"
}

}  // namespace pico::coordinator::http_api
