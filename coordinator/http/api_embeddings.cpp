// /v1/embeddings (OpenAI's shape) and /embedding, /embeddings (llama-server's): each
// input is one engine request that evaluates its prompt and returns the hidden states
// after the output norm, pooled as the server was started (ServerOptions::pooling),
// then normalised as llama-server normalises them (embd_normalize; only when pooled).
#include <boost/beast/core/detail/base64.hpp>
#include <cmath>

#include "http/api.hpp"
#include "http/embedding_normalize.hpp"

namespace pico::coordinator::http_api {

namespace {

std::string base64_of(const std::vector<float>& values) {
  const size_t bytes = values.size() * sizeof(float);
  std::string out(beast::detail::base64::encoded_size(bytes), '\0');
  out.resize(beast::detail::base64::encode(out.data(), values.data(), bytes));
  return out;
}

awaitable<void> serve_embeddings(Session& s, bool openai_endpoint) {
  const ServerState& state = s.state;
  const Pooling pooling = state.options.pooling;
  const json body = parse_body(s.request);
  EmbeddingRequest parsed = parse_embedding_request(state.parse, body, openai_endpoint);
  if (parsed.openai && pooling == Pooling::none) {
    throw ApiError(400,
                   "Pooling type 'none' is not OAI compatible. Please use a different pooling type "
                   "(pico-coord --pooling mean, cls or last)",
                   "invalid_request_error", "invalid_value");
  }
  std::vector<OnlineRequest> requests;
  for (std::vector<int32_t>& input : parsed.inputs) {
    OnlineRequest r;
    r.prompt = std::move(input);
    r.max_tokens = 0;
    r.cache_prompt = false;
    r.embedding = pooling;
    requests.push_back(std::move(r));
  }
  const size_t n = requests.size();
  std::vector<std::vector<std::vector<float>>> rows(n);
  std::vector<int> prompt_tokens(n, 0);
  Generation gen(s.state.engine, co_await asio::this_coro::executor, s.socket, std::move(requests));
  for (size_t remaining = n; remaining > 0;) {
    Generation::Event ev = co_await gen.next();
    if (gen.client_gone()) {  // cancelled: nobody to answer
      s.keep_alive = false;
      co_return;
    }
    if (ev.kind == Generation::Event::Error) {
      gen.cancel();
      throw ApiError(500, ev.reason, "server_error", "embedding_failed");
    }
    if (ev.kind == Generation::Event::Embedding) rows[ev.choice] = std::move(ev.embedding);
    if (ev.kind == Generation::Event::Done) {
      if (rows[ev.choice].empty()) {
        gen.cancel();
        throw ApiError(500, "an input ended (" + ev.reason + ") without its embedding", "server_error",
                       "embedding_failed");
      }
      prompt_tokens[ev.choice] = ev.usage.prompt_tokens;
      --remaining;
    }
  }
  // As llama-server: a pooled embedding is normalised, one row per token is not.
  if (pooling != Pooling::none) {
    for (auto& input : rows) normalize_embedding(input.front(), parsed.normalize);
  }
  if (!parsed.openai) {
    json list = json::array();
    for (size_t i = 0; i < n; ++i) list.push_back({{"index", i}, {"embedding", rows[i]}});
    co_await s.reply(200, list);
    co_return;
  }
  json data = json::array();
  int total = 0;
  for (size_t i = 0; i < n; ++i) {
    json item = {{"object", "embedding"}, {"index", i}};
    if (parsed.base64) {
      item["embedding"] = base64_of(rows[i].front());
      item["encoding_format"] = "base64";
    } else {
      item["embedding"] = rows[i].front();
    }
    data.push_back(std::move(item));
    total += prompt_tokens[i];
  }
  const json reply = {{"object", "list"},
                      {"data", std::move(data)},
                      {"model", body.value("model", state.options.model_name)},
                      {"usage", {{"prompt_tokens", total}, {"total_tokens", total}}}};
  co_await s.reply(200, reply);
}

}  // namespace

awaitable<void> embeddings(Session& s) { co_await serve_embeddings(s, true); }
awaitable<void> llama_embeddings(Session& s) { co_await serve_embeddings(s, false); }

}  // namespace pico::coordinator::http_api
