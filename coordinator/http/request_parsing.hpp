// Request parsing and validation of the HTTP API, as pure functions (no Beast, asio or
// coroutine types: the unit tests and the fuzz target call them directly). A JSON body
// becomes engine requests plus the response options, or an ApiError (400) naming the
// field at fault.
//
// Each endpoint has one table of the fields it reads (request_parsing.cpp), after
// llama-server's schema (tools/server/server-schema.cpp: names, aliases, limits) and
// OpenAI's documented ranges. A field pico does not implement (audio, ...) is
// accepted only at its neutral value, else refused with "'X' is not
// supported"; a name in no table is ignored, as llama-server ignores it.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "engine.hpp"
#include "http/reasoning.hpp"
#include "http/tool_calls.hpp"
#include "sample/dry.hpp"
#include "sample/grammar.hpp"
#include "tokenizer/chat_template.hpp"
#include "tokenizer/tokenizer.hpp"

namespace pico::coordinator::http_api {

using json = nlohmann::json;

// A request the API refuses: status and an OpenAI-style error object (param: the
// field at fault, when one is).
class ApiError : public std::runtime_error {
 public:
  ApiError(int status_, std::string message, std::string type_ = "invalid_request_error", std::string code_ = {},
           std::string param_ = {})
      : std::runtime_error(std::move(message)),
        status(status_),
        type(std::move(type_)),
        code(std::move(code_)),
        param(std::move(param_)) {}
  int status;
  std::string type, code, param;
};

// DRY's sequence breakers as tokens (sample::make_dry_breakers: a pass over the
// vocabulary), kept per list of strings: the default list is built once, not per
// request. Thread-safe; holds the 16 lists used last.
class DryBreakerCache {
 public:
  explicit DryBreakerCache(const tokenizer::Tokenizer& tok) : tok_(tok) {}
  std::shared_ptr<const sample::DryBreakers> get(const std::vector<std::string>& breakers);

 private:
  const tokenizer::Tokenizer& tok_;
  std::mutex mutex_;
  std::vector<std::pair<std::vector<std::string>, std::shared_ptr<const sample::DryBreakers>>> lists_;  // newest last
};

// The grammar matcher's view of the vocabulary (each token's bytes, specials as their
// text, and which tokens end generation): built on first use, shared by every request.
std::shared_ptr<const sample::GrammarVocabulary> make_grammar_vocabulary(const tokenizer::Tokenizer& tok);
class GrammarVocabularyCache {
 public:
  explicit GrammarVocabularyCache(const tokenizer::Tokenizer& tok) : tok_(tok) {}
  std::shared_ptr<const sample::GrammarVocabulary> get();

 private:
  const tokenizer::Tokenizer& tok_;
  std::once_flag once_;
  std::shared_ptr<const sample::GrammarVocabulary> vocabulary_;
};

// What the parsers need to know of the server.
struct ParseContext {
  const tokenizer::Tokenizer& tok;
  const tokenizer::ChatTemplate* chat = nullptr;  // needed by chat completions
  int64_t ctx = 4096;                             // positions per sequence
  std::string model_name, model_path;             // 'model' must name one of them (OpenAI endpoints)
  int64_t max_choices = 16;                       // 'n'
  size_t max_stop_strings = 16;                   // 'stop': count
  size_t max_stop_length = 256;                   // 'stop': bytes of each
  ReasoningFormat reasoning_format = ReasoningFormat::Deepseek;  // 'reasoning_format' unless given
  DryBreakerCache* dry_breakers = nullptr;                        // null: built per request
  GrammarVocabularyCache* grammar_vocabulary = nullptr;           // null: built per request
  int64_t n_embd = 0;                                             // the model's width (embeddings' 'dimensions')
  size_t max_embedding_inputs = 256;                              // inputs of one embeddings request
};

enum class Endpoint { LlamaCompletion, Completions, ChatCompletions };

// A generation request: one engine request per choice (n of them; with a seed, choice i
// samples with seed + i) and how to answer.
struct ParsedGeneration {
  std::vector<OnlineRequest> choices;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool logprobs = false;       // OpenAI: return logprobs (choices[i].logprobs top ones each)
  int n_probs = 0;             // /completion: completion_probabilities with this many top tokens (0: none)
  ReplyReasoning reasoning;    // chat: how the reply's reasoning is separated (content only elsewhere)
  ToolCalling tools;           // chat: the request's tools (ToolCalling::active: the reply is parsed for calls)
};

// /v1/embeddings, /embeddings, /embedding: one or several inputs (each a text, token
// ids, or both mixed), and how to answer.
struct EmbeddingRequest {
  std::vector<std::vector<int32_t>> inputs;
  bool openai = true;   // OpenAI's reply (data[], usage); llama-server's list otherwise
  bool base64 = false;  // encoding_format "base64": each embedding's F32 bytes in base64
  // embd_normalize, as llama.cpp's common_embd_normalize: -1 none, 0 max absolute (to
  // the int16 range), 2 euclidean (the default), p: p-norm (1: taxicab).
  int normalize = 2;
};

struct TokenizeRequest {
  std::string content;
  bool add_special = false, parse_special = true, with_pieces = false;
};

// The body as a JSON object (400 otherwise).
json parse_json_body(std::string_view text);
// /completion, /v1/completions, /v1/chat/completions.
ParsedGeneration parse_generation_request(const ParseContext& ctx, Endpoint endpoint, const json& body);
// /apply-template (llama-server's): the prompt text a chat request's messages and
// chat_template_kwargs become.
std::string parse_apply_template_request(const ParseContext& ctx, const json& body);
TokenizeRequest parse_tokenize_request(const json& body);
// OpenAI's (and Anthropic's) rule for a function's name: 1 to 64 letters, digits, '_' or '-'.
bool valid_function_name(const std::string& name);
inline constexpr const char* kFunctionNameRule = "must be 1 to 64 letters, digits, '_' or '-'";

// /infill (llama-server's): the body of a /completion whose prompt is the fill-in-the-
// middle prompt of input_prefix, input_suffix, input_extra and prompt (the model's FIM
// tokens, in llama-server's repository-level pattern and proportions); ApiError 501 for
// a model without FIM tokens.
json infill_completion_body(const ParseContext& ctx, json body);
// openai_endpoint: /v1/embeddings (the reply is OpenAI's unless the body has
// llama-server's 'content' instead of 'input').
EmbeddingRequest parse_embedding_request(const ParseContext& ctx, const json& body, bool openai_endpoint);
std::vector<int32_t> parse_detokenize_request(const ParseContext& ctx, const json& body);

// Any of the above by path (the fuzz target's entry): parses and validates the body
// for that endpoint, throws ApiError as the server would answer. Unknown paths: 404.
void parse_request(const ParseContext& ctx, std::string_view path, std::string_view body);

}  // namespace pico::coordinator::http_api
