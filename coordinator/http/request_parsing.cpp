#include "http/request_parsing.hpp"

#include "http/responses.hpp"

#include "http/anthropic.hpp"
#include "http/json_schema_grammar.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>

namespace pico::coordinator::http_api {

namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int kMaxTopLogprobs = 20;
constexpr double kMaxLogitBias = 100.0;

[[noreturn]] void invalid(const std::string& name, const std::string& what) {
  throw ApiError(400, "'" + name + "' " + what, "invalid_request_error", "invalid_value", name);
}

[[noreturn]] void unsupported(const std::string& name) {
  throw ApiError(400, "'" + name + "' is not supported", "invalid_request_error", "unsupported_field", name);
}

std::string number_text(double v) {
  std::string s = std::to_string(v);
  while (s.size() > 1 && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

double number(const std::string& name, const json& v, double lo, double hi) {
  if (!v.is_number()) invalid(name, "must be a number");
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi) {
    invalid(name, "must be between " + number_text(lo) + " and " + number_text(hi));
  }
  return x;
}

int64_t integer(const std::string& name, const json& v, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) invalid(name, "must be an integer");
  const bool too_big = v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi);
  const int64_t x = too_big ? hi : v.get<int64_t>();
  if (too_big || x < lo || x > hi) {
    invalid(name, "must be between " + std::to_string(lo) + " and " + std::to_string(hi));
  }
  return x;
}

bool boolean(const std::string& name, const json& v) {
  if (!v.is_boolean()) invalid(name, "must be a boolean");
  return v.get<bool>();
}

const std::string& string(const std::string& name, const json& v) {
  if (!v.is_string()) invalid(name, "must be a string");
  return v.get_ref<const std::string&>();
}

// Parsing state of one generation request.
struct Parse {
  const ParseContext& ctx;
  Endpoint endpoint;
  const json& body;
  OnlineRequest req;
  ParsedGeneration out;
  int64_t n = 1;
  std::optional<int64_t> top_logprobs;
  tokenizer::ChatOptions chat;
  bool no_thinking = false;  // reasoning_effort "none"
  std::vector<std::string> dry_breakers = {"\n", ":", "\"", "*"};  // llama.cpp's default
  std::string grammar_field;  // the field that gave the grammar (one per request)
};

// A generation endpoint reads a field when its bit is set.
enum : unsigned { kLlama = 1, kCompletions = 2, kChat = 4, kOpenAI = kCompletions | kChat, kAll = 7 };

unsigned endpoint_bit(Endpoint e) {
  switch (e) {
    case Endpoint::LlamaCompletion: return kLlama;
    case Endpoint::Completions: return kCompletions;
    case Endpoint::ChatCompletions: return kChat;
  }
  return 0;
}

using Handler = void (*)(Parse&, const std::string& name, const json& value);

struct Field {
  const char* name;
  unsigned endpoints;
  Handler handle;
};

void parse_stop(Parse& p, const std::string& name, const json& v) {
  std::vector<std::string> stops;
  if (v.is_string()) {
    stops.push_back(v.get<std::string>());
  } else if (v.is_array()) {
    for (const auto& s : v) {
      if (!s.is_string()) invalid(name, "must be a string or a list of strings");
      stops.push_back(s.get<std::string>());
    }
  } else {
    invalid(name, "must be a string or a list of strings");
  }
  if (stops.size() > p.ctx.max_stop_strings) {
    invalid(name, "holds " + std::to_string(stops.size()) + " strings; at most " +
                      std::to_string(p.ctx.max_stop_strings) + " are allowed");
  }
  for (const auto& s : stops) {
    if (s.size() > p.ctx.max_stop_length) {
      invalid(name, "holds a string of " + std::to_string(s.size()) + " bytes; at most " +
                        std::to_string(p.ctx.max_stop_length) + " are allowed");
    }
  }
  std::erase(stops, std::string());
  p.req.stop = std::move(stops);
}

// One bias: a number in [-100, 100], or false (llama.cpp: ban the token).
float bias_value(const std::string& name, const json& v) {
  if (v.is_boolean()) {
    if (v.get<bool>()) invalid(name, "biases must be numbers or false (to ban a token)");
    return -std::numeric_limits<float>::infinity();
  }
  return static_cast<float>(number(name, v, -kMaxLogitBias, kMaxLogitBias));
}

// OpenAI: {"<token id>": bias}; llama.cpp as well, plus [[id, bias]], [["text", bias]]
// (every token of the text) and "text" keys in the object form.
void parse_logit_bias(Parse& p, const std::string& name, const json& v) {
  auto& out = p.req.sampling.logit_bias;
  out.clear();
  const auto n_vocab = static_cast<int64_t>(p.ctx.tok.vocab_size());
  auto add_id = [&](int64_t id, float bias) {
    if (id < 0 || id >= n_vocab) {
      invalid(name, "token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(n_vocab) + ")");
    }
    out.push_back({static_cast<int32_t>(id), bias});
  };
  auto add_text = [&](const std::string& text, float bias) {
    const auto ids = p.ctx.tok.encode(text, false, false);
    if (ids.empty()) invalid(name, "the text '" + text + "' has no tokens");
    for (int32_t id : ids) out.push_back({id, bias});
  };
  const bool llama = p.endpoint == Endpoint::LlamaCompletion;
  if (v.is_object()) {
    for (const auto& [key, value] : v.items()) {
      const float bias = bias_value(name, value);
      char* end = nullptr;
      const long long id = std::strtoll(key.c_str(), &end, 10);
      if (!key.empty() && *end == '\0') {
        add_id(id, bias);
      } else if (llama) {
        add_text(key, bias);
      } else {
        invalid(name, "keys must be token ids ('" + key + "' is not)");
      }
    }
  } else if (v.is_array() && llama) {
    for (const auto& pair : v) {
      if (!pair.is_array() || pair.size() != 2) invalid(name, "must be a list of [token, bias] pairs");
      const float bias = bias_value(name, pair[1]);
      if (pair[0].is_number_integer()) {
        add_id(integer(name, pair[0], std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()), bias);
      } else if (pair[0].is_string()) {
        add_text(pair[0].get<std::string>(), bias);
      } else {
        invalid(name, "pairs must start with a token id or a text");
      }
    }
  } else {
    invalid(name, llama ? "must be an object or a list of [token, bias] pairs" : "must be an object");
  }
}

void parse_max_tokens(Parse& p, const std::string& name, const json& v) {
  // llama.cpp: -1 for no limit, 0 to evaluate the prompt only; OpenAI: at least 1.
  const int64_t lo = p.endpoint == Endpoint::LlamaCompletion ? -1 : 1;
  const int64_t x = v.is_number_integer() && v.get<int64_t>() == -1 ? -1 : integer(name, v, lo, kInt32Max);
  p.req.max_tokens = static_cast<int>(x);
}

void parse_samplers(Parse& p, const std::string& name, const json& v) {
  using sample::Stage;
  if (!v.is_array()) invalid(name, "must be a list of sampler names");
  std::vector<Stage> stages;
  for (const auto& s : v) {
    const std::string& n = string(name, s);
    if (n == "penalties") stages.push_back(Stage::Penalties);
    else if (n == "top_k") stages.push_back(Stage::TopK);
    else if (n == "typ_p" || n == "typical_p") stages.push_back(Stage::TypicalP);
    else if (n == "top_p") stages.push_back(Stage::TopP);
    else if (n == "min_p") stages.push_back(Stage::MinP);
    else if (n == "temperature") stages.push_back(Stage::Temperature);
    else if (n == "top_n_sigma") stages.push_back(Stage::TopNSigma);
    else if (n == "xtc") stages.push_back(Stage::Xtc);
    else if (n == "dry") stages.push_back(Stage::Dry);
    else invalid(name, "names an unknown sampler '" + n + "'");
  }
  p.req.sampling.stages = std::move(stages);
}

// A field pico does not implement, accepted only at the value that changes nothing.
template <class Neutral>
void neutral_only(const std::string& name, const json& v, Neutral is_neutral) {
  if (!is_neutral(v)) unsupported(name);
}
bool is_zero(const json& v) { return v.is_number() && v.get<double>() == 0.0; }
bool is_false(const json& v) { return v.is_boolean() && !v.get<bool>(); }
bool is_empty_list(const json& v) { return v.is_array() && v.empty(); }
bool is_empty_text(const json& v) { return v.is_string() && v.get_ref<const std::string&>().empty(); }
bool non_positive(const json& v) { return v.is_number() && v.get<double>() <= 0.0; }

// The request's one grammar, from GBNF text (grammar, or a converted JSON Schema); the
// sampler applies it where llama.cpp does (sample/sampler.hpp).
void set_grammar(Parse& p, const std::string& name, const std::string& gbnf, std::string_view root = "root") {
  if (!p.grammar_field.empty()) {
    invalid(name, "cannot be given with '" + p.grammar_field + "': a request has one grammar");
  }
  p.grammar_field = name;
  try {
    p.req.sampling.grammar = sample::Grammar::parse(gbnf, root);
  } catch (const sample::GrammarError& e) {
    // A converted schema fails only by a limit (its grammar too large to follow).
    invalid(name, std::string(name == "grammar" ? "is not a valid GBNF grammar: " : "makes a grammar pico refuses: ") +
                      e.what());
  }
  p.req.sampling.grammar_vocabulary =
      p.ctx.grammar_vocabulary ? p.ctx.grammar_vocabulary->get() : make_grammar_vocabulary(p.ctx.tok);
}

// JSON Schema → GBNF. The schema's keys arrive sorted (the body is parsed into a map), so
// optional properties come in name order where llama-server keeps the schema's order:
// the same documents validate either way.
void set_schema_grammar(Parse& p, const std::string& name, const json& schema) {
  if (!schema.is_object() && !schema.is_boolean()) invalid(name, "must be a JSON Schema (an object)");
  std::string gbnf;
  try {
    gbnf = json_schema_to_grammar(nlohmann::ordered_json::parse(schema.dump()));
  } catch (const SchemaError& e) {
    invalid(name, std::string("cannot be turned into a grammar: ") + e.what());
  }
  set_grammar(p, name, gbnf);
}

void parse_grammar(Parse& p, const std::string& name, const json& v) {
  const std::string& text = string(name, v);
  if (!text.empty()) set_grammar(p, name, text);  // "": none, as llama.cpp
}

// OpenAI's response_format, as llama-server reads it: json_object (with an optional
// "schema") or json_schema ({"json_schema": {"schema": ..., "strict": ...}}).
void parse_response_format(Parse& p, const std::string& name, const json& v) {
  if (!v.is_object() || !v.contains("type") || !v["type"].is_string()) {
    invalid(name, "must be an object with a 'type'");
  }
  const std::string& type = v["type"].get_ref<const std::string&>();
  if (type == "text") return;
  if (type == "json_object") {
    if (auto it = v.find("schema"); it != v.end() && !it->is_null()) {
      set_schema_grammar(p, name + ".schema", *it);
    } else {
      set_grammar(p, name, json_object_grammar());
    }
    return;
  }
  if (type == "json_schema") {
    auto wrapper = v.find("json_schema");
    if (wrapper == v.end() || !wrapper->is_object()) invalid(name, "of type 'json_schema' needs a 'json_schema' object");
    if (auto strict = wrapper->find("strict"); strict != wrapper->end() && !strict->is_null()) {
      boolean(name + ".json_schema.strict", *strict);  // the output always follows the schema
    }
    auto schema = wrapper->find("schema");
    set_schema_grammar(p, name + ".json_schema.schema",
                       schema == wrapper->end() || schema->is_null() ? json::object() : *schema);
    return;
  }
  invalid(name, "type must be 'text', 'json_object' or 'json_schema'");
}

// llama-server passes every key to the Jinja template; pico's templates are code and
// read only enable_thinking (a boolean, as llama-server insists).
tokenizer::ChatOptions parse_chat_template_kwargs(const std::string& name, const json& v) {
  if (!v.is_object()) invalid(name, "must be an object");
  tokenizer::ChatOptions options;
  for (const auto& [key, value] : v.items()) {
    if (key != "enable_thinking") unsupported(name + "." + key);
    if (!value.is_null()) options.enable_thinking = boolean(name + ".enable_thinking", value);
  }
  return options;
}

void parse_reasoning_format(Parse& p, const std::string& name, const json& v) {
  const auto format = reasoning_format_from_name(string(name, v));
  if (!format) invalid(name, "must be " + std::string(kReasoningFormatNames));
  p.out.reasoning.format = *format;  // read by chat completions; the others keep the raw text, as llama-server
}

void parse_stream_options(Parse& p, const std::string& name, const json& v) {
  if (!v.is_object()) invalid(name, "must be an object");
  if (auto it = v.find("include_usage"); it != v.end() && !it->is_null()) {
    p.out.include_usage = boolean(name + ".include_usage", *it);
  }
}

// The fields of the generation endpoints.
const Field kGenerationFields[] = {
    {"stream", kAll, [](Parse& p, const std::string& n, const json& v) { p.out.stream = boolean(n, v); }},
    {"stream_options", kAll, parse_stream_options},
    {"temperature", kAll,
     [](Parse& p, const std::string& n, const json& v) { p.req.sampling.temperature = static_cast<float>(number(n, v, 0, 100)); }},
    {"top_p", kAll,
     [](Parse& p, const std::string& n, const json& v) { p.req.sampling.top_p = static_cast<float>(number(n, v, 0, 1)); }},
    {"min_p", kAll,
     [](Parse& p, const std::string& n, const json& v) { p.req.sampling.min_p = static_cast<float>(number(n, v, 0, 1)); }},
    {"typical_p", kAll,
     [](Parse& p, const std::string& n, const json& v) { p.req.sampling.typical_p = static_cast<float>(number(n, v, 0, 1)); }},
    // -1 or 0: off (vLLM's and llama.cpp's ways to say it).
    {"top_k", kAll,
     [](Parse& p, const std::string& n, const json& v) { p.req.sampling.top_k = static_cast<int32_t>(integer(n, v, -1, kInt32Max)); }},
    {"min_keep", kAll,
     [](Parse& p, const std::string& n, const json& v) { p.req.sampling.min_keep = static_cast<size_t>(integer(n, v, 0, kInt32Max)); }},
    {"repeat_penalty", kAll,
     [](Parse& p, const std::string& n, const json& v) {
       const double x = number(n, v, 0, 1e6);
       if (x <= 0) invalid(n, "must be greater than 0");
       p.req.sampling.repeat_penalty = static_cast<float>(x);
     }},
    {"repeat_last_n", kAll,
     [](Parse& p, const std::string& n, const json& v) {
       p.req.sampling.penalty_last_n = static_cast<int32_t>(integer(n, v, -1, kInt32Max));
     }},
    {"frequency_penalty", kAll,
     [](Parse& p, const std::string& n, const json& v) { p.req.sampling.frequency_penalty = static_cast<float>(number(n, v, -2, 2)); }},
    {"presence_penalty", kAll,
     [](Parse& p, const std::string& n, const json& v) { p.req.sampling.presence_penalty = static_cast<float>(number(n, v, -2, 2)); }},
    {"seed", kAll,
     [](Parse& p, const std::string& n, const json& v) {
       const int64_t x = integer(n, v, -1, std::numeric_limits<uint32_t>::max());
       p.req.sampling.seed = x < 0 ? sample::SamplingParams::kRandomSeed : static_cast<uint32_t>(x);
     }},
    // Aliases: the later one wins (llama.cpp: n_predict first; OpenAI: max_tokens is the
    // deprecated name).
    {"max_tokens", kAll, parse_max_tokens},
    {"max_completion_tokens", kAll, parse_max_tokens},
    {"n_predict", kLlama, parse_max_tokens},
    {"stop", kAll, parse_stop},
    {"ignore_eos", kAll, [](Parse& p, const std::string& n, const json& v) { p.req.ignore_eos = boolean(n, v); }},
    {"cache_prompt", kAll, [](Parse& p, const std::string& n, const json& v) { p.req.cache_prompt = boolean(n, v); }},
    {"logit_bias", kAll, parse_logit_bias},
    {"samplers", kAll, parse_samplers},
    {"n", kAll,
     [](Parse& p, const std::string& n, const json& v) {
       p.n = integer(n, v, 1, p.ctx.max_choices);
       if (p.n > 1 && p.endpoint == Endpoint::LlamaCompletion) unsupported(n);  // one completion per request here
     }},
    // Any name: the one model serves it, as llama-server does (clients send their own
    // default, e.g. "gpt-3.5-turbo").
    {"model", kAll, [](Parse&, const std::string& n, const json& v) { string(n, v); }},
    {"user", kOpenAI, [](Parse&, const std::string& n, const json& v) { string(n, v); }},  // for abuse tracking: no effect
    // Log probabilities.
    {"n_probs", kLlama,
     [](Parse& p, const std::string& n, const json& v) { p.out.n_probs = static_cast<int>(integer(n, v, 0, kMaxTopLogprobs)); }},
    {"post_sampling_probs", kLlama,
     [](Parse& p, const std::string& n, const json& v) { p.req.post_sampling_probs = boolean(n, v); }},
    {"logprobs", kAll,
     [](Parse& p, const std::string& n, const json& v) {
       if (p.endpoint == Endpoint::ChatCompletions) {
         p.out.logprobs = boolean(n, v);
       } else if (p.endpoint == Endpoint::Completions) {
         p.out.logprobs = true;
         p.top_logprobs = integer(n, v, 0, kMaxTopLogprobs);
       } else if (!p.body.contains("n_probs")) {  // llama.cpp: an alias of n_probs
         p.out.n_probs = static_cast<int>(integer(n, v, 0, kMaxTopLogprobs));
       }
     }},
    {"top_logprobs", kChat,
     [](Parse& p, const std::string& n, const json& v) { p.top_logprobs = integer(n, v, 0, kMaxTopLogprobs); }},
    // OpenAI fields without an implementation here.
    {"echo", kCompletions, [](Parse&, const std::string& n, const json& v) { neutral_only(n, v, is_false); }},
    {"suffix", kCompletions, [](Parse&, const std::string& n, const json& v) { neutral_only(n, v, is_empty_text); }},
    {"best_of", kCompletions,
     [](Parse& p, const std::string& n, const json& v) {
       const int64_t x = integer(n, v, 1, p.ctx.max_choices);
       if (x != 1 && x != p.body.value("n", json(1))) unsupported(n);
     }},
    // tools, tool_choice, parallel_tool_calls: parse_tool_calling (chat). The legacy
    // functions API only at its neutral values.
    {"functions", kChat, [](Parse&, const std::string& n, const json& v) { neutral_only(n, v, is_empty_list); }},
    {"function_call", kChat,
     [](Parse&, const std::string& n, const json& v) {
       if (v.is_string() && (v == "none" || v == "auto")) return;
       if (v.is_object() && v.contains("name") && v["name"].is_string()) unsupported(n);
       invalid(n, "must be 'none', 'auto' or {\"name\": ...}");
     }},
    {"response_format", kAll, parse_response_format},
    {"modalities", kChat,
     [](Parse&, const std::string& n, const json& v) {
       neutral_only(n, v, [](const json& x) { return x == json::array({"text"}); });
     }},
    {"audio", kChat, [](Parse&, const std::string& n, const json&) { unsupported(n); }},
    {"prediction", kChat, [](Parse&, const std::string& n, const json&) { unsupported(n); }},
    {"web_search_options", kChat, [](Parse&, const std::string& n, const json&) { unsupported(n); }},
    // llama-server: "none" turns thinking off (whatever chat_template_kwargs say); other
    // efforts go to templates that read them, which pico's formats do not.
    {"reasoning_effort", kChat,
     [](Parse& p, const std::string& n, const json& v) {
       if (string(n, v) != "none") {
         throw ApiError(400, "'" + n + "' '" + v.get<std::string>() + "' is not supported (only 'none')",
                        "invalid_request_error", "unsupported_field", n);
       }
       p.no_thinking = true;
     }},
    {"store", kChat, [](Parse&, const std::string& n, const json& v) { neutral_only(n, v, is_false); }},
    {"chat_template_kwargs", kChat,
     [](Parse& p, const std::string& n, const json& v) { p.chat = parse_chat_template_kwargs(n, v); }},
    // llama.cpp's other samplers (sample/sampler.hpp).
    {"mirostat", kAll,
     [](Parse& p, const std::string& n, const json& v) { p.req.sampling.mirostat = static_cast<int32_t>(integer(n, v, 0, 2)); }},
    {"mirostat_tau", kAll,
     [](Parse& p, const std::string& n, const json& v) { p.req.sampling.mirostat_tau = static_cast<float>(number(n, v, -1e9, 1e9)); }},
    {"mirostat_eta", kAll,
     [](Parse& p, const std::string& n, const json& v) { p.req.sampling.mirostat_eta = static_cast<float>(number(n, v, -1e9, 1e9)); }},
    {"xtc_probability", kAll,
     [](Parse& p, const std::string& n, const json& v) { p.req.sampling.xtc_probability = static_cast<float>(number(n, v, 0, 1)); }},
    {"xtc_threshold", kAll,
     [](Parse& p, const std::string& n, const json& v) { p.req.sampling.xtc_threshold = static_cast<float>(number(n, v, 0, 1)); }},
    {"dynatemp_range", kAll,
     [](Parse& p, const std::string& n, const json& v) { p.req.sampling.dynatemp_range = static_cast<float>(number(n, v, 0, 100)); }},
    {"dynatemp_exponent", kAll,
     [](Parse& p, const std::string& n, const json& v) {
       p.req.sampling.dynatemp_exponent = static_cast<float>(number(n, v, -1e9, 1e9));
     }},
    {"top_n_sigma", kAll,
     [](Parse& p, const std::string& n, const json& v) { p.req.sampling.top_n_sigma = static_cast<float>(number(n, v, -1e9, 1e9)); }},
    {"dry_multiplier", kAll,
     [](Parse& p, const std::string& n, const json& v) { p.req.sampling.dry_multiplier = static_cast<float>(number(n, v, -1e9, 1e9)); }},
    {"dry_base", kAll,
     [](Parse& p, const std::string& n, const json& v) {
       // llama-server: a base below 1 means the default.
       const auto base = static_cast<float>(number(n, v, -1e9, 1e9));
       p.req.sampling.dry_base = base < 1.0f ? sample::SamplingParams{}.dry_base : base;
     }},
    {"dry_allowed_length", kAll,
     [](Parse& p, const std::string& n, const json& v) { p.req.sampling.dry_allowed_length = static_cast<int32_t>(integer(n, v, 0, kInt32Max)); }},
    {"dry_penalty_last_n", kAll,
     [](Parse& p, const std::string& n, const json& v) {
       const int64_t last_n = integer(n, v, -1, kInt32Max);  // -1: the context size
       p.req.sampling.dry_penalty_last_n = static_cast<int32_t>(last_n < 0 ? p.ctx.ctx : last_n);
     }},
    {"dry_sequence_breakers", kAll,
     [](Parse& p, const std::string& n, const json& v) {
       constexpr size_t kMaxBreakers = 32;
       if (!v.is_array() || v.empty()) invalid(n, "must be a non-empty list of strings");
       if (v.size() > kMaxBreakers) invalid(n, "holds " + std::to_string(v.size()) + " strings, at most 32 are allowed");
       p.dry_breakers.clear();
       for (const auto& s : v) p.dry_breakers.push_back(string(n, s));
     }},
    // llama.cpp samplers and options without an implementation here: their off values.
    {"adaptive_target", kAll,
     [](Parse&, const std::string& n, const json& v) { neutral_only(n, v, [](const json& x) { return x.is_number() && x.get<double>() < 0; }); }},
    // Parameters of those samplers: no effect while the sampler is off, so any number.
    {"adaptive_decay", kAll, [](Parse&, const std::string& n, const json& v) { number(n, v, 0, 0.99); }},
    {"grammar", kAll, parse_grammar},
    {"json_schema", kAll, set_schema_grammar},
    {"grammar_lazy", kAll, [](Parse&, const std::string& n, const json& v) { neutral_only(n, v, is_false); }},
    {"grammar_triggers", kAll, [](Parse&, const std::string& n, const json& v) { neutral_only(n, v, is_empty_list); }},
    {"preserved_tokens", kAll, [](Parse&, const std::string& n, const json& v) { neutral_only(n, v, is_empty_list); }},
    {"lora", kAll, [](Parse&, const std::string& n, const json& v) { neutral_only(n, v, is_empty_list); }},
    {"n_keep", kAll, [](Parse&, const std::string& n, const json& v) { neutral_only(n, v, is_zero); }},
    {"n_discard", kAll, [](Parse&, const std::string& n, const json& v) { neutral_only(n, v, is_zero); }},
    {"n_indent", kAll, [](Parse&, const std::string& n, const json& v) { neutral_only(n, v, is_zero); }},
    {"n_cache_reuse", kAll, [](Parse&, const std::string& n, const json& v) { neutral_only(n, v, is_zero); }},
    {"id_slot", kAll,
     [](Parse&, const std::string& n, const json& v) { neutral_only(n, v, [](const json& x) { return x == -1; }); }},
    {"t_max_predict_ms", kAll, [](Parse&, const std::string& n, const json& v) { neutral_only(n, v, non_positive); }},
    {"t_max_prompt_ms", kAll, [](Parse&, const std::string& n, const json& v) { neutral_only(n, v, non_positive); }},
    {"timings_per_token", kAll, [](Parse&, const std::string& n, const json& v) { neutral_only(n, v, is_false); }},
    {"return_progress", kAll, [](Parse& p, const std::string& n, const json& v) { p.req.return_progress = boolean(n, v); }},
    {"response_fields", kAll, [](Parse&, const std::string& n, const json& v) { neutral_only(n, v, is_empty_list); }},
    {"return_tokens", kLlama, [](Parse&, const std::string& n, const json& v) { boolean(n, v); }},  // tokens come always
    {"verbose", kAll, [](Parse&, const std::string& n, const json& v) { neutral_only(n, v, is_false); }},
    {"backend_sampling", kAll, [](Parse&, const std::string& n, const json& v) { neutral_only(n, v, is_false); }},
    {"reasoning_format", kAll, parse_reasoning_format},
};

// llama.cpp's mixed list of texts and token ids (or one text) as tokens; with
// `special`, BOS before the first text (as the vocabulary asks) and special-token
// texts parsed, else neither (llama-server's /infill fields).
std::vector<int32_t> mixed_tokens(const ParseContext& ctx, const json& list, const std::string& field, bool special) {
  const auto n_vocab = static_cast<int64_t>(ctx.tok.vocab_size());
  std::vector<int32_t> ids;
  bool first = true;
  for (const auto& t : list.is_array() ? list : json::array({list})) {
    if (t.is_string()) {
      const auto part = ctx.tok.encode(t.get<std::string>(), special && first, special);
      ids.insert(ids.end(), part.begin(), part.end());
    } else if (t.is_number_integer()) {
      const bool neg = t.is_number_unsigned() ? false : t.get<int64_t>() < 0;
      const bool big = t.is_number_unsigned() ? t.get<uint64_t>() >= static_cast<uint64_t>(n_vocab) : t.get<int64_t>() >= n_vocab;
      if (neg || big) {
        throw ApiError(400,
                       "'" + field + "' token id " + t.dump() + " is outside the vocabulary [0, " + std::to_string(n_vocab) + ")",
                       "invalid_request_error", "invalid_prompt", field);
      }
      ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
    } else {
      invalid(field, "must be a string or a list of token ids (and texts)");
    }
    first = false;
  }
  return ids;
}

// A prompt: text (tokenized with BOS and specials), a list of token ids, or llama.cpp's
// mixed list of texts and ids.
std::vector<int32_t> parse_prompt(const ParseContext& ctx, const json& prompt, const std::string& field = "prompt") {
  if (!prompt.is_string() && (!prompt.is_array() || prompt.empty())) {
    invalid(field, "must be a non-empty string or a list of token ids");
  }
  if (prompt.is_array() &&
      std::count_if(prompt.begin(), prompt.end(), [](const json& x) { return !x.is_number_integer(); }) > 1 &&
      std::all_of(prompt.begin(), prompt.end(), [](const json& x) { return x.is_string() || x.is_array(); })) {
    invalid(field, "holds several prompts; one per request is supported");
  }
  return mixed_tokens(ctx, prompt, field, true);
}

std::string message_content(const json& m, const std::string& where, bool may_be_empty) {
  auto it = m.find("content");
  if (it == m.end() || it->is_null()) {
    if (!may_be_empty) invalid(where + ".content", "is required");
    return {};
  }
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array()) invalid(where + ".content", "must be a string or a list of text parts");
  std::string text;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& part = (*it)[i];
    const std::string at = where + ".content[" + std::to_string(i) + "]";
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) invalid(at, "must be an object with a 'type'");
    const std::string& type = part["type"].get_ref<const std::string&>();
    if (type != "text") unsupported(at + "' of type '" + type);
    if (!part.contains("text")) invalid(at + ".text", "is required");
    text += string(at + ".text", part["text"]);
  }
  return text;
}

// An assistant message's tool_calls: [{id, type: "function", function: {name, arguments}}],
// arguments a JSON object or its text.
std::vector<ToolCall> parse_message_tool_calls(const std::string& where, const json& v) {
  if (!v.is_array()) invalid(where, "must be a list");
  std::vector<ToolCall> calls;
  for (size_t i = 0; i < v.size(); ++i) {
    const json& c = v[i];
    const std::string at = where + "[" + std::to_string(i) + "]";
    if (!c.is_object()) invalid(at, "must be an object");
    if (auto type = c.find("type"); type != c.end() && !type->is_null() && *type != "function") {
      invalid(at + ".type", "must be 'function'");
    }
    if (!c.contains("function") || !c["function"].is_object()) invalid(at + ".function", "is required (an object)");
    const json& f = c["function"];
    ToolCall call;
    if (!f.contains("name")) invalid(at + ".function.name", "is required");
    call.name = string(at + ".function.name", f["name"]);
    if (auto id = c.find("id"); id != c.end() && !id->is_null()) call.id = string(at + ".id", *id);
    json arguments = f.value("arguments", json::object());
    // Text as given stays as given: the templates that write arguments as a string
    // write the client's text (those that take an object parse it again).
    std::optional<std::string> text;
    if (arguments.is_string()) {
      text = arguments.get<std::string>();
      arguments = json::parse(*text, nullptr, false);
      if (arguments.is_discarded()) invalid(at + ".function.arguments", "is not valid JSON");
    }
    if (!arguments.is_object()) invalid(at + ".function.arguments", "must be a JSON object (or its text)");
    call.arguments = text ? std::move(*text) : arguments.dump(-1, ' ', false, json::error_handler_t::replace);
    calls.push_back(std::move(call));
  }
  return calls;
}

std::vector<RequestMessage> parse_messages(const json& body) {
  auto it = body.find("messages");
  if (it == body.end() || it->is_null()) invalid("messages", "is required");
  if (!it->is_array()) invalid("messages", "must be a list");
  if (it->empty()) invalid("messages", "must not be empty");
  std::vector<RequestMessage> messages;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) invalid(where, "must be an object");
    if (!m.contains("role") || m["role"].is_null()) invalid(where + ".role", "is required");
    std::string role = string(where + ".role", m["role"]);
    if (role == "developer") role = "system";  // OpenAI's newer name for it
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      if (role == "function") unsupported(where + ".role' '" + role);
      invalid(where + ".role", "must be 'system', 'developer', 'user', 'assistant' or 'tool'");
    }
    if (m.contains("name") && !m["name"].is_null()) string(where + ".name", m["name"]);
    RequestMessage message;
    std::optional<std::string> reasoning;
    if (auto r = m.find("reasoning_content"); r != m.end() && !r->is_null()) {
      reasoning = string(where + ".reasoning_content", *r);
    }
    if (auto tc = m.find("tool_calls"); tc != m.end() && !tc->is_null()) {
      if (role != "assistant") invalid(where + ".tool_calls", "is for assistant messages");
      message.tool_calls = parse_message_tool_calls(where + ".tool_calls", *tc);
    }
    if (role == "tool") {
      auto id = m.find("tool_call_id");
      if (id == m.end() || id->is_null()) invalid(where + ".tool_call_id", "is required");
      message.tool_call_id = string(where + ".tool_call_id", *id);
    }
    if (auto fc = m.find("function_call"); fc != m.end() && !fc->is_null()) unsupported(where + ".function_call");
    message.message = {role, message_content(m, where, role == "assistant"), std::move(reasoning)};
    messages.push_back(std::move(message));
  }
  return messages;
}

// tools, tool_choice, parallel_tool_calls of a chat request.
ToolCalling parse_tool_calling(const json& body, tokenizer::ChatFormat format) {
  constexpr size_t kMaxTools = 128;
  ToolCalling calling;
  calling.style = tool_style(format);
  if (auto it = body.find("tools"); it != body.end() && !it->is_null()) {
    if (!it->is_array()) invalid("tools", "must be a list");
    if (it->size() > kMaxTools) invalid("tools", "has more than " + std::to_string(kMaxTools) + " tools");
    for (size_t i = 0; i < it->size(); ++i) {
      const json& t = (*it)[i];
      const std::string at = "tools[" + std::to_string(i) + "]";
      if (!t.is_object()) invalid(at, "must be an object");
      const json type = t.value("type", json());
      if (type != "function") {
        if (type.is_string()) unsupported(at + ".type' '" + type.get<std::string>());
        invalid(at + ".type", "must be 'function'");
      }
      if (!t.contains("function") || !t["function"].is_object()) invalid(at + ".function", "is required (an object)");
      const json& f = t["function"];
      ToolFunction tool;
      if (!f.contains("name")) invalid(at + ".function.name", "is required");
      tool.name = string(at + ".function.name", f["name"]);
      if (!valid_function_name(tool.name)) invalid(at + ".function.name", kFunctionNameRule);
      if (calling.find(tool.name)) invalid(at + ".function.name", "names '" + tool.name + "' a second time");
      if (auto d = f.find("description"); d != f.end() && !d->is_null()) {
        tool.description = string(at + ".function.description", *d);
      }
      if (auto params = f.find("parameters"); params != f.end() && !params->is_null()) {
        if (!params->is_object()) invalid(at + ".function.parameters", "must be a JSON Schema (an object)");
        tool.parameters = *params;
      }
      if (auto strict = f.find("strict"); strict != f.end() && !strict->is_null()) boolean(at + ".function.strict", *strict);
      calling.tools.push_back(std::move(tool));
    }
  }
  if (auto it = body.find("tool_choice"); it != body.end() && !it->is_null()) {
    const json& v = *it;
    if (v.is_string()) {
      const std::string& s = v.get_ref<const std::string&>();
      if (s == "none") calling.choice = ToolChoice::None;
      else if (s == "auto") calling.choice = ToolChoice::Auto;
      else if (s == "required") calling.choice = ToolChoice::Required;
      else invalid("tool_choice", "must be 'none', 'auto', 'required' or an object");
    } else {
      if (!v.is_object() || v.value("type", json()) != "function" || !v.contains("function") ||
          !v["function"].is_object() || !v["function"].contains("name") || !v["function"]["name"].is_string()) {
        invalid("tool_choice",
                "must be 'none', 'auto', 'required' or {\"type\": \"function\", \"function\": {\"name\": ...}}");
      }
      calling.choice = ToolChoice::Named;
      calling.named = v["function"]["name"].get<std::string>();
      if (!calling.find(calling.named)) invalid("tool_choice", "names '" + calling.named + "', which is not in 'tools'");
    }
    if (calling.tools.empty() && calling.choice == ToolChoice::Required) invalid("tool_choice", "'required' needs 'tools'");
  }
  if (auto it = body.find("parallel_tool_calls"); it != body.end() && !it->is_null()) {
    calling.parallel = boolean("parallel_tool_calls", *it);
  }
  if (calling.active() && calling.style == ToolStyle::Llama3) {
    const auto messages = body.find("messages");
    const bool has_user = messages != body.end() && messages->is_array() &&
                          std::any_of(messages->begin(), messages->end(), [](const json& m) {
                            return m.is_object() && m.value("role", json()) == "user";
                          });
    if (!has_user) invalid("messages", "needs a user message: the llama3 template puts the tools in the first");
  }
  return calling;
}

struct RenderedChat {
  std::string prompt;
  // Where the reply begins when the prompt continues a last assistant message (nullopt:
  // as the format's generation prompt has it).
  std::optional<tokenizer::ReplyStart> continued;
};

// The prompt text of a chat request (a conversation the template refuses: 400). The
// template's default system message goes first when the request has none. An assistant
// message last is continued (llama-server's assistant prefill, HF's
// continue_final_message): the conversation is rendered with it and without a
// generation prompt, and cut after its text, so that the reply goes on from there.
RenderedChat render_chat(const ParseContext& ctx, const json& body, const tokenizer::ChatOptions& options,
                         const ToolCalling& calling) {
  if (!ctx.chat) throw ApiError(500, "no chat template", "server_error");
  auto request_messages = parse_messages(body);
  if (!ctx.chat->default_system().empty() && request_messages.front().message.role != "system") {
    RequestMessage system;
    system.message = {"system", ctx.chat->default_system()};
    request_messages.insert(request_messages.begin(), std::move(system));
  }
  // The text the prompt is cut after (empty: nothing is continued).
  std::string continued;
  RenderedChat out;
  if (const RequestMessage& last = request_messages.back(); last.message.role == "assistant") {
    const size_t n = request_messages.size();
    if (n >= 2 && request_messages[n - 2].message.role == "assistant") {
      invalid("messages", "ends with two assistant messages: only the last one can be continued");
    }
    if (!last.tool_calls.empty()) {
      invalid("messages", "ends with an assistant message with tool_calls, which cannot be continued");
    }
    const std::string reasoning = last.message.reasoning_content.value_or("");
    if (!last.message.content.empty()) {
      continued = last.message.content;
      out.continued = tokenizer::ReplyStart::Content;
    } else if (!reasoning.empty() && ctx.chat->thinking_tags()) {
      continued = reasoning;
      out.continued = tokenizer::ReplyStart::InsideThinking;
    } else {
      request_messages.pop_back();  // nothing to continue: a new turn
    }
  }
  const tokenizer::ChatOptions render_options{continued.empty(), options.enable_thinking, calling.active()};
  if (auto prompt = render_tool_prompt(ctx.chat->format(), calling, request_messages)) {
    out.prompt = std::move(*prompt);
  } else {
    const auto messages = render_tool_messages(ctx.chat->format(), calling, request_messages);
    try {
      out.prompt = ctx.chat->apply(messages, render_options);
    } catch (const std::invalid_argument& e) {
      throw ApiError(400, "the chat template (" + std::string(ctx.chat->name()) + ") refuses the messages: " + e.what(),
                     "invalid_request_error", "invalid_value", "messages");
    }
  }
  if (continued.empty()) return out;
  // Some formats trim a message's text: then its trimmed text is what the prompt holds.
  size_t at = out.prompt.rfind(continued);
  size_t length = continued.size();
  if (at == std::string::npos) {
    const size_t first = continued.find_first_not_of(" \t\n\r\v\f");
    const size_t last = continued.find_last_not_of(" \t\n\r\v\f");
    const std::string trimmed = first == std::string::npos ? std::string() : continued.substr(first, last + 1 - first);
    at = trimmed.empty() ? std::string::npos : out.prompt.rfind(trimmed);
    length = trimmed.size();
  }
  if (at == std::string::npos) {
    throw ApiError(400, "the chat template (" + std::string(ctx.chat->name()) +
                            ") does not write the last assistant message's text, so it cannot be continued",
                   "invalid_request_error", "invalid_value", "messages");
  }
  out.prompt.erase(at + length);
  return out;
}

}  // namespace

json parse_json_body(std::string_view text) {
  json body = json::parse(text, nullptr, false);
  if (body.is_discarded()) throw ApiError(400, "the request body is not valid JSON");
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  return body;
}

namespace {
sample::DryBreakers dry_breakers_of(const tokenizer::Tokenizer& tok, const std::vector<std::string>& breakers) {
  return sample::make_dry_breakers(
      breakers, static_cast<int32_t>(tok.vocab_size()),
      [&](int32_t id) {
        const int32_t ids[1] = {id};
        return tok.decode(ids, true);
      },
      [&](std::string_view text) { return tok.encode(text, false, false); });
}
}  // namespace

std::shared_ptr<const sample::GrammarVocabulary> make_grammar_vocabulary(const tokenizer::Tokenizer& tok) {
  const auto n = static_cast<int32_t>(tok.vocab_size());
  std::vector<std::string> pieces;
  std::vector<bool> end_of_generation;
  pieces.reserve(static_cast<size_t>(n));
  end_of_generation.reserve(static_cast<size_t>(n));
  for (int32_t id = 0; id < n; ++id) {
    pieces.push_back(tok.piece(id, true));
    end_of_generation.push_back(tok.is_eog(id));
  }
  return std::make_shared<const sample::GrammarVocabulary>(std::move(pieces), std::move(end_of_generation));
}

std::shared_ptr<const sample::GrammarVocabulary> GrammarVocabularyCache::get() {
  std::call_once(once_, [&] { vocabulary_ = make_grammar_vocabulary(tok_); });
  return vocabulary_;
}

std::shared_ptr<const sample::DryBreakers> DryBreakerCache::get(const std::vector<std::string>& breakers) {
  constexpr size_t kLists = 16;
  std::lock_guard lock(mutex_);
  for (size_t i = 0; i < lists_.size(); ++i) {
    if (lists_[i].first != breakers) continue;
    auto entry = std::move(lists_[i]);
    lists_.erase(lists_.begin() + static_cast<std::ptrdiff_t>(i));
    lists_.push_back(std::move(entry));
    return lists_.back().second;
  }
  auto built = std::make_shared<const sample::DryBreakers>(dry_breakers_of(tok_, breakers));
  if (lists_.size() == kLists) lists_.erase(lists_.begin());
  lists_.emplace_back(breakers, built);
  return built;
}

ParsedGeneration parse_generation_request(const ParseContext& ctx, Endpoint endpoint, const json& body) {
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  Parse p{ctx, endpoint, body, {}, {}, 1, std::nullopt, {}, false, {}, {}};
  p.out.reasoning.format = ctx.reasoning_format;
  // Defaults: llama.cpp's n_predict -1 (until end of generation or the context);
  // OpenAI's max_tokens 16 for completions, none for chat.
  p.req.max_tokens = endpoint == Endpoint::Completions ? 16 : -1;
  const unsigned bit = endpoint_bit(endpoint);
  for (const Field& f : kGenerationFields) {
    if (!(f.endpoints & bit)) continue;
    auto it = body.find(f.name);
    if (it == body.end() || it->is_null()) continue;  // null: the default, as llama.cpp
    f.handle(p, f.name, *it);
  }
  const sample::SamplingParams& sp = p.req.sampling;
  if (sp.dry_multiplier != 0.0f && sp.dry_base >= 1.0f && sp.dry_penalty_last_n != 0) {
    if (ctx.dry_breakers) {
      p.req.sampling.dry_breakers = ctx.dry_breakers->get(p.dry_breakers);
    } else {
      p.req.sampling.dry_breakers = std::make_shared<const sample::DryBreakers>(dry_breakers_of(ctx.tok, p.dry_breakers));
    }
  }
  if (endpoint == Endpoint::ChatCompletions) {
    if (p.top_logprobs && !p.out.logprobs) invalid("top_logprobs", "needs 'logprobs': true");
    if (p.out.logprobs) p.req.logprobs = static_cast<int>(p.top_logprobs.value_or(0));
    if (p.no_thinking) p.chat.enable_thinking = false;
    if (!ctx.chat) throw ApiError(500, "no chat template", "server_error");
    p.out.tools = parse_tool_calling(body, ctx.chat->format());
    if (p.out.tools.forced()) {
      try {
        set_grammar(p, "tool_choice", tool_call_grammar(p.out.tools), kToolCallsRule);
      } catch (const SchemaError& e) {
        invalid("tools", std::string("has parameters pico cannot turn into a grammar: ") + e.what());
      }
    } else if (p.out.tools.active() && p.grammar_field.empty()) {
      // auto: free text, but a call the reply opens follows the grammar of calls (a lazy
      // grammar, as llama-server's). Parameters the converter cannot express leave it free.
      try {
        const std::string gbnf = tool_call_grammar(p.out.tools);
        set_grammar(p, "tools", gbnf, kToolCallsRule);
        p.req.sampling.grammar_triggers = tool_call_triggers(p.out.tools.style);
      } catch (const SchemaError&) {
        p.req.sampling.grammar = nullptr;
      } catch (const ApiError&) {  // a grammar past the matcher's limits
        p.req.sampling.grammar = nullptr;
      }
    }
    const RenderedChat rendered = render_chat(ctx, body, p.chat, p.out.tools);
    p.req.prompt = ctx.tok.encode(rendered.prompt, true, true);
    // The tags the reply's parsers read are written in the reply even where the
    // vocabulary has them as control tokens.
    std::vector<std::string> read_tags =
        p.out.tools.active() ? tool_syntax_tags(p.out.tools.style) : std::vector<std::string>();
    if (const auto thinking = ctx.chat->thinking_tags()) {
      read_tags.emplace_back(thinking->open);
      read_tags.emplace_back(thinking->close);
    }
    for (const std::string& tag : read_tags) {
      const int32_t id = ctx.tok.vocab().find(tag);
      if (id != tokenizer::kNoToken && ctx.tok.is_control(id)) p.req.shown_tokens.push_back(id);
    }
    if (const auto tags = ctx.chat->thinking_tags()) {
      const tokenizer::ReplyStart start = rendered.continued.value_or(ctx.chat->reply_start(p.chat));
      if (start != tokenizer::ReplyStart::Content) {
        p.out.reasoning.open_tag = tags->open;
        p.out.reasoning.close_tag = tags->close;
        p.out.reasoning.starts_inside = start == tokenizer::ReplyStart::InsideThinking;
      }
    }
  } else {
    auto it = body.find("prompt");
    if (it == body.end() || it->is_null()) invalid("prompt", "is required");
    if (endpoint == Endpoint::Completions && p.out.logprobs) p.req.logprobs = static_cast<int>(*p.top_logprobs);
    if (endpoint == Endpoint::LlamaCompletion && p.out.n_probs > 0) p.req.logprobs = p.out.n_probs;
    p.req.prompt = parse_prompt(ctx, *it);
  }
  if (p.req.prompt.empty()) invalid(endpoint == Endpoint::ChatCompletions ? "messages" : "prompt", "has no tokens");
  if (static_cast<int64_t>(p.req.prompt.size()) >= ctx.ctx) {
    throw ApiError(400, exceeds_context_message(p.req.prompt.size(), ctx.ctx), "exceed_context_size_error");
  }
  // One sequence per choice; with a seed, choice i samples with seed + i so that the
  // choices differ and each is reproducible.
  p.out.choices.assign(static_cast<size_t>(p.n), p.req);
  if (p.req.sampling.seed != sample::SamplingParams::kRandomSeed) {
    for (size_t i = 0; i < p.out.choices.size(); ++i) {
      p.out.choices[i].sampling.seed = p.req.sampling.seed + static_cast<uint32_t>(i);
    }
  }
  return std::move(p.out);
}

std::string parse_apply_template_request(const ParseContext& ctx, const json& body) {
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  tokenizer::ChatOptions options;
  if (auto it = body.find("chat_template_kwargs"); it != body.end() && !it->is_null()) {
    options = parse_chat_template_kwargs("chat_template_kwargs", *it);
  }
  return render_chat(ctx, body, options, ctx.chat ? parse_tool_calling(body, ctx.chat->format()) : ToolCalling{}).prompt;
}

TokenizeRequest parse_tokenize_request(const json& body) {
  TokenizeRequest r;
  auto it = body.find("content");
  if (it == body.end() || it->is_null()) invalid("content", "is required");
  r.content = string("content", *it);
  auto flag = [&](const char* name, bool& out) {
    if (auto f = body.find(name); f != body.end() && !f->is_null()) out = boolean(name, *f);
  };
  flag("add_special", r.add_special);
  flag("parse_special", r.parse_special);
  flag("with_pieces", r.with_pieces);
  return r;
}

std::vector<int32_t> parse_detokenize_request(const ParseContext& ctx, const json& body) {
  auto it = body.find("tokens");
  if (it == body.end() || it->is_null()) invalid("tokens", "is required");
  if (!it->is_array()) invalid("tokens", "must be a list of token ids");
  const auto n_vocab = static_cast<int64_t>(ctx.tok.vocab_size());
  std::vector<int32_t> ids;
  for (const auto& t : *it) {
    if (!t.is_number_integer()) invalid("tokens", "must hold integers");
    const bool out = t.is_number_unsigned() ? t.get<uint64_t>() >= static_cast<uint64_t>(n_vocab)
                                            : t.get<int64_t>() < 0 || t.get<int64_t>() >= n_vocab;
    if (out) invalid("tokens", "token id " + t.dump() + " is outside the vocabulary [0, " + std::to_string(n_vocab) + ")");
    ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return ids;
}

EmbeddingRequest parse_embedding_request(const ParseContext& ctx, const json& body, bool openai_endpoint) {
  EmbeddingRequest out;
  out.openai = openai_endpoint;
  for (const auto& [key, value] : body.items()) {
    if (key == "input" || key == "content" || key == "user") continue;
    if (key == "model") {
      if (!value.is_string()) invalid(key, "must be a string");  // any name: the one model serves it
    } else if (key == "encoding_format") {
      if (value != "float" && value != "base64") invalid(key, "must be 'float' or 'base64'");
      out.base64 = value == "base64";
    } else if (key == "embd_normalize") {
      if (!value.is_number_integer() || value.get<int64_t>() < -1 || value.get<int64_t>() > 64) {
        invalid(key, "must be an integer from -1 to 64 (-1: none, 0: max absolute, 2: euclidean, p: p-norm)");
      }
      out.normalize = static_cast<int>(value.get<int64_t>());
    } else if (key == "dimensions") {
      // The model's width only: nothing here shortens an embedding (it would need a
      // model trained for it).
      if (!value.is_number_integer() || value.get<int64_t>() != ctx.n_embd) {
        invalid(key, "must be the model's embedding size, " + std::to_string(ctx.n_embd));
      }
    } else {
      unsupported(key);
    }
  }
  const json* input = nullptr;
  std::string field = "input";
  if (auto it = body.find("input"); it != body.end() && !it->is_null()) {
    input = &*it;
  } else if (auto c = body.find("content"); c != body.end() && !c->is_null()) {
    input = &*c;
    field = "content";
    out.openai = false;  // llama-server answers "content" in its own shape
  } else {
    throw ApiError(400, "\"input\" or \"content\" must be provided", "invalid_request_error", "invalid_value", "input");
  }
  // A list holding no number is a list of inputs; anything else is one input.
  const bool several = input->is_array() && !input->empty() &&
                       std::none_of(input->begin(), input->end(), [](const json& x) { return x.is_number(); });
  if (several) {
    if (input->size() > ctx.max_embedding_inputs) {
      invalid(field, "holds " + std::to_string(input->size()) + " inputs; at most " +
                         std::to_string(ctx.max_embedding_inputs) + " per request");
    }
    for (size_t i = 0; i < input->size(); ++i) {
      out.inputs.push_back(parse_prompt(ctx, (*input)[i], field + "[" + std::to_string(i) + "]"));
    }
  } else {
    out.inputs.push_back(parse_prompt(ctx, *input, field));
  }
  for (size_t i = 0; i < out.inputs.size(); ++i) {
    if (out.inputs[i].empty()) invalid(several ? field + "[" + std::to_string(i) + "]" : field, "has no tokens");
    if (static_cast<int64_t>(out.inputs[i].size()) >= ctx.ctx) {
      throw ApiError(400, exceeds_context_message(out.inputs[i].size(), ctx.ctx), "exceed_context_size_error");
    }
  }
  return out;
}

bool valid_function_name(const std::string& name) {
  return !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
}

json infill_completion_body(const ParseContext& ctx, json body) {
  const tokenizer::SpecialTokens& special = ctx.tok.vocab().special();
  std::string missing;
  if (special.fim_pre == tokenizer::kNoToken) missing += "prefix token is missing. ";
  if (special.fim_suf == tokenizer::kNoToken) missing += "suffix token is missing. ";
  if (special.fim_mid == tokenizer::kNoToken) missing += "middle token is missing. ";
  if (!missing.empty()) {
    throw ApiError(501, "Infill is not supported by this model: " + missing, "not_supported_error", "not_supported");
  }
  const auto take = [&](const char* key) -> json {
    auto it = body.find(key);
    if (it == body.end()) return nullptr;
    json v = std::move(*it);
    body.erase(it);
    return v;
  };
  const json prefix = take("input_prefix"), suffix = take("input_suffix"), extra_chunks = take("input_extra");
  const json prompt = take("prompt");
  if (prefix.is_null()) invalid("input_prefix", "is required");
  if (suffix.is_null()) invalid("input_suffix", "is required");
  if (!prompt.is_null() && !prompt.is_string()) invalid("prompt", "must be a string");
  if (!extra_chunks.is_null() && !extra_chunks.is_array()) {
    invalid("input_extra", "must be an array of {\"filename\": string, \"text\": string}");
  }
  std::vector<int32_t> tokens_prefix = mixed_tokens(ctx, prefix, "input_prefix", false);
  std::vector<int32_t> tokens_suffix = mixed_tokens(ctx, suffix, "input_suffix", false);
  const std::vector<int32_t> tokens_prompt =
      prompt.is_string() ? ctx.tok.encode(prompt.get<std::string>(), false, true) : std::vector<int32_t>{};
  // The repository-level pattern (as llama-server):
  //   [FIM_REP]myproject\n [FIM_SEP]filename\n chunk ... [FIM_SEP]filename\n
  //   [FIM_PRE]prefix [FIM_SUF]suffix [FIM_MID]prompt
  std::vector<int32_t> extra;
  const auto append = [&](const std::string& text) {
    const auto t = ctx.tok.encode(text, false, false);
    extra.insert(extra.end(), t.begin(), t.end());
  };
  if (special.fim_rep != tokenizer::kNoToken) {
    extra.push_back(special.fim_rep);
    append("myproject\n");
  }
  const json chunks = extra_chunks.is_null() ? json::array() : extra_chunks;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const json& chunk = chunks[i];
    const std::string where = "input_extra[" + std::to_string(i) + "]";
    if (!chunk.is_object() || !chunk.contains("text") || !chunk["text"].is_string()) {
      invalid(where + ".text", "must be a string");
    }
    if (chunk.contains("filename") && !chunk["filename"].is_string()) invalid(where + ".filename", "must be a string");
    for (const auto& [key, unused] : chunk.items()) {
      if (key != "text" && key != "filename") unsupported(where + "." + key);
    }
    if (special.fim_sep != tokenizer::kNoToken) {
      extra.push_back(special.fim_sep);
      append(chunk.value("filename", std::string("tmp")) + "\n");
    } else {
      append("\n\n--- snippet ---\n\n");
    }
    append(chunk["text"].get<std::string>());
  }
  if (special.fim_sep != tokenizer::kNoToken) {
    extra.push_back(special.fim_sep);
    append("filename\n");
  }
  // A batch's worth of prefix and suffix (3 : 1), the rest of the context for the extra
  // chunks (their end), less room for the reply, as llama-server takes them.
  const int64_t batch = std::min<int64_t>(2048, ctx.ctx);
  int64_t n_predict = -1;
  if (auto it = body.find("n_predict"); it != body.end() && it->is_number_integer()) n_predict = it->get<int64_t>();
  const auto prefix_take = std::min<int64_t>(static_cast<int64_t>(tokens_prefix.size()), 3 * (batch / 4));
  const auto suffix_take = std::min<int64_t>(static_cast<int64_t>(tokens_suffix.size()),
                                             std::max<int64_t>(0, batch / 4 - (2 + static_cast<int64_t>(tokens_prompt.size()))));
  const auto extra_take =
      std::min<int64_t>(std::max<int64_t>(0, ctx.ctx - batch - 2 * n_predict), static_cast<int64_t>(extra.size()));
  tokens_prefix.erase(tokens_prefix.begin(), tokens_prefix.end() - prefix_take);
  tokens_suffix.resize(static_cast<size_t>(suffix_take));
  std::vector<int32_t> out;
  if (ctx.tok.add_bos()) out.push_back(ctx.tok.bos());
  out.insert(out.begin(), extra.end() - extra_take, extra.end());
  out.push_back(special.fim_pre);
  out.insert(out.end(), tokens_prefix.begin(), tokens_prefix.end());
  out.insert(out.end(), tokens_prompt.begin(), tokens_prompt.end());
  out.push_back(special.fim_suf);
  out.insert(out.end(), tokens_suffix.begin(), tokens_suffix.end());
  out.push_back(special.fim_mid);
  body["prompt"] = out;
  return body;
}

void parse_request(const ParseContext& ctx, std::string_view path, std::string_view body_text) {
  auto body = [&] { return parse_json_body(body_text); };
  if (path == "/completion" || path == "/completions") {
    parse_generation_request(ctx, Endpoint::LlamaCompletion, body());
  } else if (path == "/v1/completions") {
    parse_generation_request(ctx, Endpoint::Completions, body());
  } else if (path == "/v1/chat/completions" || path == "/chat/completions") {
    parse_generation_request(ctx, Endpoint::ChatCompletions, body());
  } else if (path == "/v1/messages") {
    parse_generation_request(ctx, Endpoint::ChatCompletions, chat_request_from_messages(body()));
  } else if (path == "/v1/messages/count_tokens") {
    parse_generation_request(ctx, Endpoint::ChatCompletions, chat_request_from_messages(body(), true));
  } else if (path == "/v1/embeddings" || path == "/embeddings" || path == "/embedding") {
    parse_embedding_request(ctx, body(), path == "/v1/embeddings");
  } else if (path == "/v1/responses") {
    parse_generation_request(ctx, Endpoint::ChatCompletions, chat_request_from_responses(body()));
  } else if (path == "/infill") {
    parse_generation_request(ctx, Endpoint::LlamaCompletion, infill_completion_body(ctx, body()));
  } else if (path == "/apply-template") {
    parse_apply_template_request(ctx, body());
  } else if (path == "/tokenize") {
    parse_tokenize_request(body());
  } else if (path == "/detokenize") {
    parse_detokenize_request(ctx, body());
  } else {
    throw ApiError(404, "no route " + std::string(path), "invalid_request_error", "not_found");
  }
}

}  // namespace pico::coordinator::http_api
