// libFuzzer target: an HTTP request body -> engine requests (coordinator/http's
// request_parsing), as pico-coord parses every request before it reaches the engine.
//
// The first input byte picks the endpoint, the rest is the body. The parser must
// either refuse with an ApiError of a 4xx status (anything else would reach the
// client as a 500, or kill the server) or return requests the engine takes as they
// are: a prompt of 1 .. ctx-1 in-vocabulary tokens, a sampler that builds (it throws
// on parameters it cannot use), logit-bias ids inside the vocabulary, stop strings
// and choices within their bounds. Tokenizer: the fuzz model's (fuzz_model.hpp).
//   scripts/fuzz http_request [SECONDS]
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <unistd.h>

#include "fuzz_model.hpp"
#include "gguf/reader.hpp"
#include "http/request_parsing.hpp"
#include "http/responses.hpp"
#include "http_request_paths.hpp"
#include "sample/sampler.hpp"

namespace {

using namespace pico;
using coordinator::http_api::ApiError;

constexpr int64_t kContext = 64;  // the fuzz model's context (fuzz_model.hpp)

struct Server {
  std::unique_ptr<gguf::Model> file;
  std::unique_ptr<tokenizer::Tokenizer> tok;
  tokenizer::ChatTemplate chat;
  std::unique_ptr<coordinator::http_api::ParseContext> ctx;
};

Server& server() {
  static Server s = [] {
    Server made;
    const auto dir = std::filesystem::temp_directory_path() / ("pico-http-fuzz-" + std::to_string(::getpid()));
    made.file = gguf::Model::open(fuzz::write_fuzz_model(dir).string());
    made.tok = tokenizer::Tokenizer::from_metadata(made.file->metadata());
    made.chat = tokenizer::ChatTemplate::from_metadata(made.file->metadata(), &made.tok->vocab(), "chatml");
    made.ctx = std::make_unique<coordinator::http_api::ParseContext>(
        coordinator::http_api::ParseContext{*made.tok, &made.chat, kContext, "fuzz-model", "fuzz-model.gguf"});
    return made;
  }();
  return s;
}

void check_generation(const coordinator::http_api::ParseContext& ctx,
                      const coordinator::http_api::ParsedGeneration& parsed) {
  if (parsed.choices.empty() || static_cast<int64_t>(parsed.choices.size()) > ctx.max_choices) __builtin_trap();
  for (const coordinator::OnlineRequest& r : parsed.choices) {
    if (r.prompt.empty() || static_cast<int64_t>(r.prompt.size()) >= ctx.ctx) __builtin_trap();
    for (int32_t id : r.prompt) {
      if (id < 0 || static_cast<size_t>(id) >= ctx.tok.vocab_size()) __builtin_trap();
    }
    for (const auto& bias : r.sampling.logit_bias) {
      if (bias.token < 0 || static_cast<size_t>(bias.token) >= ctx.tok.vocab_size()) __builtin_trap();
      if (std::isnan(bias.bias)) __builtin_trap();
    }
    if (r.stop.size() > ctx.max_stop_strings) __builtin_trap();
    for (const auto& s : r.stop) {
      if (s.size() > ctx.max_stop_length) __builtin_trap();
    }
    if (r.max_tokens < -1 || r.logprobs > 20) __builtin_trap();
    // The engine builds the sampler on its own thread: it must not refuse what parsing took.
    try {
      sample::Sampler sampler(r.sampling);
    } catch (...) {
      __builtin_trap();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return -1;
  const Server& s = server();
  const auto& paths = pico::fuzz::kHttpRequestPaths;
  const std::string_view path = paths[data[0] % paths.size()];
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  using coordinator::http_api::Endpoint;
  try {
    if (path == "/completion" || path == "/v1/completions" || path == "/v1/chat/completions") {
      const Endpoint endpoint = path == "/completion"       ? Endpoint::LlamaCompletion
                                : path == "/v1/completions" ? Endpoint::Completions
                                                            : Endpoint::ChatCompletions;
      check_generation(*s.ctx,
                       coordinator::http_api::parse_generation_request(
                           *s.ctx, endpoint, coordinator::http_api::parse_json_body(body)));
    } else if (path == "/v1/embeddings" || path == "/embedding") {
      const auto parsed = coordinator::http_api::parse_embedding_request(
          *s.ctx, coordinator::http_api::parse_json_body(body), path == "/v1/embeddings");
      if (parsed.inputs.empty() || parsed.inputs.size() > s.ctx->max_embedding_inputs) __builtin_trap();
      for (const auto& input : parsed.inputs) {
        if (input.empty() || static_cast<int64_t>(input.size()) >= s.ctx->ctx) __builtin_trap();
        for (int32_t id : input) {
          if (id < 0 || static_cast<size_t>(id) >= s.tok->vocab_size()) __builtin_trap();
        }
      }
      if (parsed.normalize < -1) __builtin_trap();
    } else if (path == "/v1/responses") {
      check_generation(*s.ctx, coordinator::http_api::parse_generation_request(
                                   *s.ctx, Endpoint::ChatCompletions,
                                   coordinator::http_api::chat_request_from_responses(
                                       coordinator::http_api::parse_json_body(body))));
    } else if (path == "/infill") {
      check_generation(*s.ctx, coordinator::http_api::parse_generation_request(
                                   *s.ctx, Endpoint::LlamaCompletion,
                                   coordinator::http_api::infill_completion_body(
                                       *s.ctx, coordinator::http_api::parse_json_body(body))));
    } else if (path == "/detokenize") {
      for (int32_t id : coordinator::http_api::parse_detokenize_request(
               *s.ctx, coordinator::http_api::parse_json_body(body))) {
        if (id < 0 || static_cast<size_t>(id) >= s.tok->vocab_size()) __builtin_trap();
      }
    } else {
      coordinator::http_api::parse_request(*s.ctx, path, body);
    }
  } catch (const ApiError& e) {
    if (e.status < 400 || e.status > 499) __builtin_trap();
  }
  // Any other exception escapes: libFuzzer reports it as a crash.
  return 0;
}
