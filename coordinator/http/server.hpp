// The HTTP API of pico-coord: OpenAI (/v1/chat/completions, /v1/completions,
// /v1/models) and llama.cpp server (/completion, /tokenize, /detokenize, /health,
// /props, /slots, /metrics) endpoints over Boost.Beast, on top of the Engine.
#pragma once

#include <cstdint>
#include <string>

#include "engine.hpp"
#include "http/reasoning.hpp"
#include "tokenizer/chat_template.hpp"

namespace pico::coordinator {

class ClusterControl;

struct ServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8080;
  std::string api_key;           // empty: no authentication (compared in constant time)
  std::string model_name;        // the id /v1/models lists
  std::string model_path;
  size_t body_limit = 8u << 20;  // bytes of a request body: 413 beyond
  size_t header_limit = 64u << 10;  // bytes of a request's header: 431 beyond
  int threads = 4;               // I/O threads
  int read_timeout_s = 120;      // a connection idle this long without a whole request is closed
  int write_timeout_s = 30;      // a client that takes no byte of a reply for this long is dropped (its request cancelled)
  int max_connections = 512;     // open connections; one more gets 503 and is closed
  size_t max_stop_strings = 16;  // 'stop' strings per request
  size_t max_stop_length = 256;  // bytes of each
  std::string cors_origin;       // empty: no CORS headers; else Access-Control-Allow-Origin and preflight answers
  // Chat replies' reasoning (<think>...</think>) unless a request says otherwise.
  http_api::ReasoningFormat reasoning_format = http_api::ReasoningFormat::Deepseek;
  ClusterControl* cluster = nullptr;  // /cluster (remote stages only; null: in-process)
  // How the embedding endpoints pool a prompt's hidden states (--pooling, else the
  // model's metadata; none: per token, which /v1/embeddings refuses, as llama-server).
  Pooling pooling = Pooling::none;
  int64_t n_embd = 0;  // the model's width (the embeddings' size)
  bool webui = true;   // the web UI at / (--no-webui: off)
};

// Serves until SIGINT or SIGTERM. Throws when the address cannot be bound.
void serve_http(Engine& engine, const tokenizer::Tokenizer& tok, const tokenizer::ChatTemplate& chat,
                const ServerOptions& options);

}  // namespace pico::coordinator
