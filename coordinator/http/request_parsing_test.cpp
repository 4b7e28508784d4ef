// The HTTP API's request parsing, without a server: each endpoint's base request
// parses; each row of the table breaks it in one field and must give 400 (or 404)
// naming that field.
#include "http/request_parsing.hpp"
#include "http/responses.hpp"

#include "http/anthropic.hpp"

#include <algorithm>

#include <gtest/gtest.h>

#include <tuple>

#include <cmath>
#include <limits>

#include "gguf/value.hpp"

namespace pico::coordinator::http_api {
namespace {

// A tokenizer of 6 tokens: <unk>, <s>, </s>, and three words.
std::unique_ptr<tokenizer::Tokenizer> small_tokenizer() {
  gguf::Metadata m;
  m.set("tokenizer.ggml.model", std::string("llama"));
  m.set("tokenizer.ggml.tokens", gguf::string_array({"<unk>", "<s>", "</s>", "\xE2\x96\x81" "a", "\xE2\x96\x81" "b", "c"}));
  std::vector<gguf::Value> scores(6, gguf::Value(0.0f));
  std::vector<gguf::Value> types{gguf::Value(int32_t{2}), gguf::Value(int32_t{3}), gguf::Value(int32_t{3}),
                                 gguf::Value(int32_t{1}), gguf::Value(int32_t{1}), gguf::Value(int32_t{1})};
  m.set("tokenizer.ggml.scores", gguf::make_array(gguf::ValueType::Float32, scores));
  m.set("tokenizer.ggml.token_type", gguf::make_array(gguf::ValueType::Int32, types));
  return std::make_unique<tokenizer::Tokenizer>(tokenizer::Vocabulary::from_metadata(m));
}

struct Fixture {
  std::unique_ptr<tokenizer::Tokenizer> tok = small_tokenizer();
  tokenizer::ChatTemplate chat{tokenizer::ChatFormat::ChatML};
  ParseContext ctx{*tok, &chat, 64, "M", "/models/M.gguf", 16, 4, 8};
};

const json kMessages = json::array({{{"role", "user"}, {"content", "a b"}}});

json base(Endpoint e) {
  if (e == Endpoint::ChatCompletions) return {{"messages", kMessages}, {"max_tokens", 4}};
  return {{"prompt", "a b"}, {"max_tokens", 4}};
}

const char* endpoint_name(Endpoint e) {
  return e == Endpoint::LlamaCompletion ? "/completion" : e == Endpoint::Completions ? "/v1/completions" : "/v1/chat/completions";
}

TEST(RequestParsing, TheBaseRequestsParse) {
  Fixture f;
  for (Endpoint e : {Endpoint::LlamaCompletion, Endpoint::Completions, Endpoint::ChatCompletions}) {
    const ParsedGeneration g = parse_generation_request(f.ctx, e, base(e));
    ASSERT_EQ(g.choices.size(), 1u) << endpoint_name(e);
    EXPECT_EQ(g.choices[0].max_tokens, 4);
    EXPECT_FALSE(g.choices[0].prompt.empty());
  }
}

struct Row {
  unsigned endpoints;  // 1 /completion, 2 /v1/completions, 4 chat
  const char* field;   // set to value over the base request (a path into messages for chat rows)
  json value;
  const char* named;   // the message must name this
  int status = 400;
};

TEST(RequestParsing, EachInvalidFieldIsRefusedByName) {
  Fixture f;
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<Row> rows = {
      {7, "temperature", "hot", "temperature"},
      {7, "temperature", -1, "temperature"},
      {7, "temperature", inf, "temperature"},
      {7, "top_p", 1.5, "top_p"},
      {7, "top_p", -0.1, "top_p"},
      {7, "min_p", 2, "min_p"},
      {7, "typical_p", -1, "typical_p"},
      {7, "top_k", -2, "top_k"},
      {7, "top_k", 1.5, "top_k"},
      {7, "repeat_penalty", 0, "repeat_penalty"},
      {7, "repeat_penalty", -1, "repeat_penalty"},
      {7, "repeat_penalty", inf, "repeat_penalty"},
      {7, "repeat_last_n", -2, "repeat_last_n"},
      {7, "presence_penalty", 2.5, "presence_penalty"},
      {7, "frequency_penalty", -3, "frequency_penalty"},
      {7, "frequency_penalty", inf, "frequency_penalty"},
      {7, "seed", -2, "seed"},
      {7, "seed", 1ll << 33, "seed"},
      {7, "seed", "x", "seed"},
      {7, "max_tokens", "ten", "max_tokens"},
      {6, "max_tokens", 0, "max_tokens"},
      {7, "max_tokens", -2, "max_tokens"},
      {7, "max_completion_tokens", 1ll << 40, "max_completion_tokens"},
      {1, "n_predict", -5, "n_predict"},
      {7, "stop", 5, "stop"},
      {7, "stop", json::array({1}), "stop"},
      {7, "stop", json::array({"a", "b", "c", "d", "e"}), "stop"},   // 5 > 4
      {7, "stop", "123456789", "stop"},                               // 9 bytes > 8
      {7, "stream", "yes", "stream"},
      {7, "stream_options", 5, "stream_options"},
      {7, "stream_options", {{"include_usage", 1}}, "stream_options.include_usage"},
      {7, "ignore_eos", 1, "ignore_eos"},
      {7, "cache_prompt", 1, "cache_prompt"},
      {6, "n", 0, "n"},
      {6, "n", 17, "n"},
      {7, "n", "two", "n"},
      {1, "n", 2, "n"},
      {7, "model", 5, "model"},
      {7, "logit_bias", 5, "logit_bias"},
      {7, "logit_bias", {{"6", 1}}, "logit_bias"},      // outside [0, 6)
      {7, "logit_bias", {{"-1", 1}}, "logit_bias"},
      {7, "logit_bias", {{"3", 101}}, "logit_bias"},
      {7, "logit_bias", {{"3", true}}, "logit_bias"},
      {7, "logit_bias", {{"3", "x"}}, "logit_bias"},
      {6, "logit_bias", {{"a", 1}}, "logit_bias"},      // OpenAI: ids only
      {6, "logit_bias", json::array({json::array({3, 1})}), "logit_bias"},
      {1, "logit_bias", json::array({json::array({3})}), "logit_bias"},
      {1, "logit_bias", json::array({json::array({99, 1})}), "logit_bias"},
      {1, "n_probs", 21, "n_probs"},
      {1, "n_probs", -1, "n_probs"},
      {1, "post_sampling_probs", "yes", "post_sampling_probs"},
      {2, "logprobs", 21, "logprobs"},
      {4, "logprobs", 1, "logprobs"},
      {4, "top_logprobs", 3, "top_logprobs"},  // without logprobs: true
      {2, "echo", true, "echo"},
      {2, "suffix", "x", "suffix"},
      {2, "best_of", 3, "best_of"},
      {7, "mirostat", 3, "mirostat"},
      {7, "mirostat_tau", "x", "mirostat_tau"},
      {7, "dry_multiplier", "0.8", "dry_multiplier"},
      {7, "dry_allowed_length", -1, "dry_allowed_length"},
      {7, "dry_penalty_last_n", -2, "dry_penalty_last_n"},
      {7, "dry_sequence_breakers", json::array(), "dry_sequence_breakers"},
      {7, "dry_sequence_breakers", json::array({"a", 1}), "dry_sequence_breakers"},
      {7, "dry_sequence_breakers", "\n", "dry_sequence_breakers"},
      {7, "xtc_probability", 1.5, "xtc_probability"},
      {7, "xtc_threshold", -0.1, "xtc_threshold"},
      {7, "dynatemp_range", -0.5, "dynatemp_range"},
      {7, "top_n_sigma", "1", "top_n_sigma"},
      {7, "grammar", "root ::= \"a", "grammar"},
      {7, "grammar", "start ::= \"a\"", "grammar"},
      {7, "grammar", 5, "grammar"},
      {7, "json_schema", 5, "json_schema"},
      {7, "json_schema", {{"$ref", "https://example.com/schema.json"}}, "json_schema"},
      {7, "lora", json::array({{{"id", 0}, {"scale", 1}}}), "lora"},
      {7, "n_keep", 4, "n_keep"},
      {7, "id_slot", 2, "id_slot"},
      {7, "samplers", json::array({"bogus"}), "samplers"},
      {7, "reasoning_format", "thinky", "reasoning_format"},
      {7, "reasoning_format", 5, "reasoning_format"},
      {4, "chat_template_kwargs", 5, "chat_template_kwargs"},
      {4, "reasoning_effort", "high", "reasoning_effort"},
      {4, "reasoning_effort", 1, "reasoning_effort"},
      {4, "chat_template_kwargs", {{"enable_thinking", "false"}}, "chat_template_kwargs.enable_thinking"},
      {4, "chat_template_kwargs", {{"add_vision_id", true}}, "chat_template_kwargs.add_vision_id"},
      {4, "messages", json::array({{{"role", "assistant"}, {"content", "x"}, {"reasoning_content", 5}}}),
       "messages[0].reasoning_content"},
      {7, "samplers", "kt", "samplers"},
      {7, "min_keep", -1, "min_keep"},
      {7, "response_format", "text", "response_format"},
      {7, "response_format", {{"type", "xml"}}, "response_format"},
      {7, "response_format", {{"type", "json_object"}, {"schema", "x"}}, "response_format.schema"},
      {7, "response_format", {{"type", "json_schema"}, {"json_schema", {{"strict", 1}}}}, "response_format.json_schema.strict"},
      {7, "response_format", {{"type", "json_schema"}}, "response_format"},
      {4, "tools", json::array({{{"type", "function"}, {"function", {{"name", "f g"}}}}}), "tools[0].function.name"},
      {4, "tools", json::array({{{"type", "function"}, {"function", {{"description", "d"}}}}}), "tools[0].function.name"},
      {4, "tools", json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}, {{"type", "function"}, {"function", {{"name", "f"}}}}}),
       "tools[1].function.name"},
      {4, "tools", json::array({{{"type", "code_interpreter"}}}), "tools[0].type"},
      {4, "tools", json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", "x"}}}}}),
       "tools[0].function.parameters"},
      {4, "tools", json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"strict", 1}}}}}),
       "tools[0].function.strict"},
      {4, "tool_choice", {{"type", "function"}, {"function", {{"name", "nowhere"}}}}, "tool_choice"},
      {4, "parallel_tool_calls", "yes", "parallel_tool_calls"},
      {4, "tools", "none", "tools"},
      {4, "tool_choice", "sometimes", "tool_choice"},
      {4, "tool_choice", {{"type", "function"}}, "tool_choice"},
      {4, "tool_choice", "required", "tool_choice"},
      {4, "functions", json::array({{{"name", "f"}}}), "functions"},
      {4, "function_call", 5, "function_call"},
      {4, "modalities", json::array({"text", "audio"}), "modalities"},
      {4, "audio", {{"voice", "x"}}, "audio"},
      {4, "store", true, "store"},
      {4, "messages", json::array(), "messages"},
      {4, "messages", "hi", "messages"},
      {4, "messages", json::array({"hi"}), "messages[0]"},
      {4, "messages", json::array({{{"content", "hi"}}}), "messages[0].role"},
      {4, "messages", json::array({{{"role", 5}, {"content", "hi"}}}), "messages[0].role"},
      {4, "messages", json::array({{{"role", "robot"}, {"content", "hi"}}}), "messages[0].role"},
      {4, "messages", json::array({{{"role", "tool"}, {"content", "hi"}}}), "messages[0].tool_call_id"},
      {4, "messages", json::array({{{"role", "function"}, {"content", "hi"}}}), "messages[0].role"},
      {4, "messages", json::array({{{"role", "user"}, {"content", "x"}, {"tool_calls", json::array()}}}),
       "messages[0].tool_calls"},
      {4, "messages",
       json::array({{{"role", "assistant"},
                     {"tool_calls", json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"arguments", "{oops"}}}}})}}}),
       "messages[0].tool_calls[0].function.arguments"},
      {4, "messages",
       json::array({{{"role", "assistant"}, {"tool_calls", json::array({{{"type", "function"}, {"function", {{"arguments", "{}"}}}}})}}}),
       "messages[0].tool_calls[0].function.name"},
      {4, "messages", json::array({{{"role", "user"}}}), "messages[0].content"},
      {4, "messages", json::array({{{"role", "user"}, {"content", 5}}}), "messages[0].content"},
      {4, "messages", json::array({{{"role", "user"}, {"content", json::array({{{"type", "image_url"}}})}}}),
       "messages[0].content[0]"},
      {4, "messages", json::array({{{"role", "user"}, {"content", json::array({{{"type", "text"}}})}}}),
       "messages[0].content[0].text"},
      {4, "messages", json::array({{{"role", "assistant"}, {"content", "x"}, {"tool_calls", json::array({1})}}}),
       "messages[0].tool_calls"},
      {4, "messages", json::array({{{"role", "user"}, {"content", "x"}, {"name", 5}}}), "messages[0].name"},
      {3, "prompt", 5, "prompt"},
      {3, "prompt", json::array(), "prompt"},
      {3, "prompt", json::array({6}), "prompt"},   // n_vocab 6
      {3, "prompt", json::array({-1}), "prompt"},
      {3, "prompt", json::array({1ll << 40}), "prompt"},
      {3, "prompt", json::array({"a", "b"}), "prompt"},  // two prompts
      {3, "prompt", json::array({1.5}), "prompt"},
  };
  for (const Row& row : rows) {
    for (Endpoint e : {Endpoint::LlamaCompletion, Endpoint::Completions, Endpoint::ChatCompletions}) {
      const unsigned bit = e == Endpoint::LlamaCompletion ? 1 : e == Endpoint::Completions ? 2 : 4;
      if (!(row.endpoints & bit)) continue;
      json body = base(e);
      body[row.field] = row.value;
      const std::string what = std::string(endpoint_name(e)) + " " + row.field + "=" + row.value.dump();
      try {
        parse_generation_request(f.ctx, e, body);
        ADD_FAILURE() << what << ": accepted";
      } catch (const ApiError& err) {
        EXPECT_EQ(err.status, row.status) << what << ": " << err.what();
        EXPECT_NE(std::string(err.what()).find(row.named), std::string::npos) << what << ": " << err.what();
      }
    }
  }
}

// As llama-server: whatever model a client names, the one model serves it.
TEST(RequestParsing, AnyModelNameIsServed) {
  Fixture f;
  for (Endpoint e : {Endpoint::LlamaCompletion, Endpoint::Completions, Endpoint::ChatCompletions}) {
    json body = base(e);
    body["model"] = "gpt-3.5-turbo";
    EXPECT_EQ(parse_generation_request(f.ctx, e, body).choices.size(), 1u) << endpoint_name(e);
  }
}

TEST(RequestParsing, APromptOverTheContextGetsLlamaServersError) {
  Fixture f;
  json body = base(Endpoint::Completions);
  body["prompt"] = json(std::vector<int>(64, 3));  // ctx 64: one position too many
  try {
    parse_generation_request(f.ctx, Endpoint::Completions, body);
    ADD_FAILURE() << "accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.type, "exceed_context_size_error");
    EXPECT_STREQ(e.what(), "request (64 tokens) exceeds the available context size (64 tokens), try increasing it");
  }
  body["prompt"] = json(std::vector<int>(63, 3));
  EXPECT_EQ(parse_generation_request(f.ctx, Endpoint::Completions, body).choices[0].prompt.size(), 63u);
}

// grammar, json_schema and response_format give the sampler its grammar (with the
// vocabulary's pieces); one per request; errors name the field and the position.
TEST(RequestParsing, GrammarsReachTheSampler) {
  Fixture f;
  const json object_schema = {{"type", "object"}, {"properties", {{"x", {{"type", "integer"}}}}}};
  for (Endpoint e : {Endpoint::LlamaCompletion, Endpoint::Completions, Endpoint::ChatCompletions}) {
    for (const json& extra : {json{{"grammar", "root ::= \"a\" [b-c]*"}}, json{{"json_schema", object_schema}},
                              json{{"response_format", {{"type", "json_object"}}}},
                              json{{"response_format", {{"type", "json_schema"},
                                                        {"json_schema", {{"strict", true}, {"schema", object_schema}}}}}}}) {
      json body = base(e);
      body.update(extra);
      const sample::SamplingParams sp = parse_generation_request(f.ctx, e, body).choices.at(0).sampling;
      ASSERT_NE(sp.grammar, nullptr) << endpoint_name(e) << " " << extra.dump();
      ASSERT_NE(sp.grammar_vocabulary, nullptr);
      EXPECT_EQ(sp.grammar_vocabulary->size(), f.tok->vocab_size());
      EXPECT_FALSE(sp.argmax_suffices());
      EXPECT_NO_THROW(sample::Sampler{sp});
    }
  }
  json body = base(Endpoint::LlamaCompletion);
  body["grammar"] = "";  // llama.cpp: no grammar
  EXPECT_EQ(parse_generation_request(f.ctx, Endpoint::LlamaCompletion, body).choices[0].sampling.grammar, nullptr);
  body["grammar"] = "root ::= \"a\"\nother ::= [a";
  try {
    parse_generation_request(f.ctx, Endpoint::LlamaCompletion, body);
    ADD_FAILURE() << "an unterminated class was accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param, "grammar");
    EXPECT_NE(std::string(e.what()).find("line 2, column"), std::string::npos) << e.what();
  }
  body["grammar"] = "root ::= \"a\"";
  body["json_schema"] = object_schema;
  try {
    parse_generation_request(f.ctx, Endpoint::LlamaCompletion, body);
    ADD_FAILURE() << "two grammars were accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_NE(std::string(e.what()).find("one grammar"), std::string::npos) << e.what();
  }
  // The vocabulary is built once per server.
  GrammarVocabularyCache cache(*f.tok);
  ParseContext cached = f.ctx;
  cached.grammar_vocabulary = &cache;
  body.erase("json_schema");
  const auto first = parse_generation_request(cached, Endpoint::LlamaCompletion, body).choices[0].sampling;
  const auto again = parse_generation_request(cached, Endpoint::LlamaCompletion, body).choices[0].sampling;
  EXPECT_EQ(first.grammar_vocabulary, again.grammar_vocabulary);
}

// Anthropic's Messages request becomes the chat request with the same meaning.
TEST(RequestParsing, AnthropicMessagesBecomeAChatRequest) {
  const json messages = json::parse(R"({"model": "claude", "max_tokens": 7, "system": [{"type": "text", "text": "S"}],
    "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                 {"role": "assistant", "content": "c"}],
    "stop_sequences": ["x"], "temperature": 0.5, "top_k": 3, "stream": true, "metadata": {"user_id": "u"},
    "thinking": {"type": "disabled"}})");
  const json expected = json::parse(R"({"messages": [{"role": "system", "content": [{"type": "text", "text": "S"}]},
    {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    {"role": "assistant", "content": "c"}], "max_tokens": 7, "stop": ["x"], "temperature": 0.5, "top_k": 3,
    "stream": true, "chat_template_kwargs": {"enable_thinking": false}})");
  EXPECT_EQ(chat_request_from_messages(messages), expected);
  Fixture f;
  ParseContext roomy = f.ctx;
  roomy.ctx = 4096;  // the tiny tokenizer spends a token per character
  const ParsedGeneration g = parse_generation_request(roomy, Endpoint::ChatCompletions, chat_request_from_messages(messages));
  EXPECT_EQ(g.choices.at(0).max_tokens, 7);
  EXPECT_EQ(g.choices[0].stop, std::vector<std::string>{"x"});
  EXPECT_EQ(anthropic_stop_reason("length"), "max_tokens");
  EXPECT_EQ(anthropic_stop_reason("stop_string"), "stop_sequence");
  EXPECT_EQ(anthropic_stop_reason("stop"), "end_turn");
  json counting = messages;
  counting.erase("max_tokens");
  EXPECT_THROW(chat_request_from_messages(counting), ApiError);
  EXPECT_FALSE(chat_request_from_messages(counting, true).contains("max_tokens"));
}

// Anthropic's tools, tool_use and tool_result blocks as OpenAI's tools, tool_calls and
// tool messages.
TEST(RequestParsing, AnthropicToolsBecomeChatTools) {
  const json messages = json::parse(R"({"max_tokens": 9, "messages": [
    {"role": "user", "content": "Add"},
    {"role": "assistant", "content": [{"type": "text", "text": "Sure."},
                                      {"type": "tool_use", "id": "t1", "name": "add", "input": {"a": 1}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "2"}]},
                                 {"type": "tool_result", "tool_use_id": "t2", "content": "x", "is_error": true},
                                 {"type": "text", "text": "Thanks"}]}],
    "tools": [{"name": "add", "description": "d", "input_schema": {"type": "object"}}],
    "tool_choice": {"type": "tool", "name": "add", "disable_parallel_tool_use": true}})");
  const json expected = json::parse(R"({"max_tokens": 9, "messages": [
    {"role": "user", "content": "Add"},
    {"role": "assistant", "content": [{"type": "text", "text": "Sure."}],
     "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "add", "arguments": "{\"a\":1}"}}]},
    {"role": "tool", "tool_call_id": "t1", "content": "2"},
    {"role": "tool", "tool_call_id": "t2", "content": "Error: x"},
    {"role": "user", "content": [{"type": "text", "text": "Thanks"}]}],
    "tools": [{"type": "function", "function": {"name": "add", "description": "d", "parameters": {"type": "object"}}}],
    "parallel_tool_calls": false, "tool_choice": {"type": "function", "function": {"name": "add"}}})");
  EXPECT_EQ(chat_request_from_messages(messages), expected);
  json any = messages;
  any["tool_choice"] = {{"type", "any"}};
  EXPECT_EQ(chat_request_from_messages(any)["tool_choice"], "required");
  EXPECT_EQ(chat_request_from_messages(any)["parallel_tool_calls"], true);
  // A bad tool name is named as Anthropic's field.
  json badly_named = messages;
  badly_named["tools"][0]["name"] = "add it";
  try {
    chat_request_from_messages(badly_named);
    ADD_FAILURE() << "a bad tool name was taken";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param, "tools[0].name");
  }
  // A tool_use in a user message is not a tool call.
  json misplaced = messages;
  misplaced["messages"][0]["content"] = json::parse(R"([{"type": "tool_use", "id": "t", "name": "add", "input": {}}])");
  EXPECT_THROW(chat_request_from_messages(misplaced), ApiError);
}

TEST(RequestParsing, NeutralValuesOfUnsupportedFieldsAreAccepted) {
  Fixture f;
  json body = base(Endpoint::ChatCompletions);
  body.update({{"tools", json::array()},
               {"tool_choice", "none"},
               {"response_format", {{"type", "text"}}},
               {"mirostat", 0},
               {"grammar", ""},
               {"lora", json::array()},
               {"n_keep", 0},
               {"id_slot", -1},
               {"top_n_sigma", -1},
               {"modalities", json::array({"text"})},
               {"store", false},
               {"samplers", json::array({"top_k", "dry", "xtc", "top_n_sigma", "temperature"})},
               {"unknown_field", "ignored as llama-server does"},
               {"temperature", nullptr}});  // null: the default
  const ParsedGeneration g = parse_generation_request(f.ctx, Endpoint::ChatCompletions, body);
  using sample::Stage;
  EXPECT_EQ(g.choices[0].sampling.stages,
            (std::vector<Stage>{Stage::TopK, Stage::Dry, Stage::Xtc, Stage::TopNSigma, Stage::Temperature}));
  EXPECT_EQ(g.choices[0].sampling.temperature, sample::SamplingParams{}.temperature);
}

// DRY's fields set it; its breakers become tokens (once per list with a cache), its
// base below 1 is the default and its window of -1 the context, as llama-server.
TEST(RequestParsing, ReadsDry) {
  Fixture f;
  json body = base(Endpoint::LlamaCompletion);
  body.update({{"dry_multiplier", 0.8},
               {"dry_base", 0.5},
               {"dry_allowed_length", 3},
               {"dry_penalty_last_n", -1},
               {"dry_sequence_breakers", json::array({"b", "zz"})}});
  const ParsedGeneration g = parse_generation_request(f.ctx, Endpoint::LlamaCompletion, body);
  const sample::SamplingParams& sp = g.choices.at(0).sampling;
  EXPECT_EQ(sp.dry_multiplier, 0.8f);
  EXPECT_EQ(sp.dry_base, 1.75f);
  EXPECT_EQ(sp.dry_allowed_length, 3);
  EXPECT_EQ(sp.dry_penalty_last_n, 64);  // the context
  ASSERT_NE(sp.dry_breakers, nullptr);
  const auto b = f.tok->encode("b", false, false);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_TRUE(sp.dry_breakers->breaks_alone(b[0]));
  EXPECT_FALSE(sp.dry_breakers->breaks_alone(f.tok->encode("a", false, false).at(0)));

  DryBreakerCache cache(*f.tok);
  ParseContext cached = f.ctx;
  cached.dry_breakers = &cache;
  body.erase("dry_sequence_breakers");  // llama.cpp's default list
  const auto first = parse_generation_request(cached, Endpoint::LlamaCompletion, body).choices.at(0).sampling.dry_breakers;
  const auto again = parse_generation_request(cached, Endpoint::LlamaCompletion, body).choices.at(0).sampling.dry_breakers;
  EXPECT_EQ(first, again);  // built once
  ASSERT_NE(first, nullptr);  // (this small vocabulary has no token of the default breakers)
}

TEST(RequestParsing, ReadsTheFieldsItAccepts) {
  Fixture f;
  json body = base(Endpoint::LlamaCompletion);
  body.update({{"n_predict", 0},
               {"max_tokens", 9},  // n_predict wins
               {"temperature", 0.5},
               {"top_k", 7},
               {"top_p", 0.5},
               {"min_p", 0.1},
               {"typical_p", 0.9},
               {"repeat_penalty", 1.1},
               {"repeat_last_n", 32},
               {"presence_penalty", 0.5},
               {"frequency_penalty", -0.5},
               {"seed", 5},
               {"min_keep", 2},
               {"top_n_sigma", 1.5},
               {"xtc_probability", 0.25},
               {"xtc_threshold", 0.2},
               {"dynatemp_range", 0.3},
               {"dynatemp_exponent", 2},
               {"mirostat", 2},
               {"mirostat_tau", 4},
               {"mirostat_eta", 0.2},
               {"stop", json::array({"x", ""})},
               {"n_probs", 3},
               {"stream", true},
               {"logit_bias", json::array({json::array({3, false}), json::array({"b", 2.5})})}});
  const ParsedGeneration g = parse_generation_request(f.ctx, Endpoint::LlamaCompletion, body);
  const OnlineRequest& r = g.choices.at(0);
  EXPECT_EQ(r.max_tokens, 0);
  EXPECT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_EQ(r.sampling.top_k, 7);
  EXPECT_EQ(r.sampling.top_p, 0.5f);
  EXPECT_EQ(r.sampling.min_p, 0.1f);
  EXPECT_EQ(r.sampling.typical_p, 0.9f);
  EXPECT_EQ(r.sampling.repeat_penalty, 1.1f);
  EXPECT_EQ(r.sampling.penalty_last_n, 32);
  EXPECT_EQ(r.sampling.presence_penalty, 0.5f);
  EXPECT_EQ(r.sampling.frequency_penalty, -0.5f);
  EXPECT_EQ(r.sampling.seed, 5u);
  EXPECT_EQ(r.sampling.min_keep, 2u);
  EXPECT_EQ(r.sampling.top_n_sigma, 1.5f);
  EXPECT_EQ(r.sampling.xtc_probability, 0.25f);
  EXPECT_EQ(r.sampling.xtc_threshold, 0.2f);
  EXPECT_EQ(r.sampling.dynatemp_range, 0.3f);
  EXPECT_EQ(r.sampling.dynatemp_exponent, 2.0f);
  EXPECT_EQ(r.sampling.mirostat, 2);
  EXPECT_EQ(r.sampling.mirostat_tau, 4.0f);
  EXPECT_EQ(r.sampling.mirostat_eta, 0.2f);
  EXPECT_EQ(r.sampling.dry_multiplier, 0.0f);
  EXPECT_EQ(r.sampling.dry_breakers, nullptr);  // DRY off: no breakers built
  EXPECT_EQ(r.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(g.n_probs, 3);
  EXPECT_EQ(r.logprobs, 3);
  EXPECT_TRUE(g.stream);
  const auto b_tokens = f.tok->encode("b", false, false);
  ASSERT_EQ(r.sampling.logit_bias.size(), 1 + b_tokens.size());
  EXPECT_EQ(r.sampling.logit_bias[0].token, 3);
  EXPECT_TRUE(std::isinf(r.sampling.logit_bias[0].bias) && r.sampling.logit_bias[0].bias < 0);
  EXPECT_EQ(r.sampling.logit_bias[1].token, b_tokens[0]);
  EXPECT_EQ(r.sampling.logit_bias[1].bias, 2.5f);

  // OpenAI: logit_bias by id, n choices with seeds seed + i, logprobs.
  json chat = base(Endpoint::ChatCompletions);
  chat.update({{"logit_bias", {{"4", -100}}},
               {"n", 3},
               {"seed", 9},
               {"logprobs", true},
               {"top_logprobs", 2},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}}});
  const ParsedGeneration c = parse_generation_request(f.ctx, Endpoint::ChatCompletions, chat);
  ASSERT_EQ(c.choices.size(), 3u);
  for (uint32_t i = 0; i < 3; ++i) EXPECT_EQ(c.choices[i].sampling.seed, 9 + i);
  ASSERT_EQ(c.choices[0].sampling.logit_bias.size(), 1u);
  EXPECT_EQ(c.choices[0].sampling.logit_bias[0].token, 4);
  EXPECT_EQ(c.choices[0].sampling.logit_bias[0].bias, -100.0f);
  EXPECT_TRUE(c.logprobs && c.include_usage);
  EXPECT_EQ(c.choices[0].logprobs, 2);
}

TEST(RequestParsing, DeveloperMessagesAreSystemMessages) {
  Fixture f;
  f.ctx.ctx = 4096;  // the template's text takes a token per byte with this vocabulary
  json a = base(Endpoint::ChatCompletions), b = a;
  a["messages"] = json::array({{{"role", "developer"}, {"content", "a"}}, {{"role", "user"}, {"content", "b"}}});
  b["messages"] = json::array({{{"role", "system"}, {"content", json::array({{{"type", "text"}, {"text", "a"}}})}},
                               {{"role", "user"}, {"content", "b"}}});
  const auto pa = parse_generation_request(f.ctx, Endpoint::ChatCompletions, a).choices[0].prompt;
  const auto pb = parse_generation_request(f.ctx, Endpoint::ChatCompletions, b).choices[0].prompt;
  EXPECT_EQ(pa, pb);
  EXPECT_EQ(pa, f.tok->encode(f.chat.apply({{"system", "a"}, {"user", "b"}}, true), true, true));
}

// Chat requests through the Qwen thinking formats: the prompt (written by hand from the
// templates, as chat_template_test.cpp), and how the reply's reasoning is to be split.
TEST(RequestParsing, ThinkingFormatsAndReasoning) {
  Fixture f;
  f.ctx.ctx = 4096;
  const tokenizer::ChatTemplate qwen35(tokenizer::ChatFormat::Qwen35), qwen3(tokenizer::ChatFormat::Qwen3);
  f.ctx.chat = &qwen35;
  json body = base(Endpoint::ChatCompletions);
  const auto prompt_of = [&](const json& b) {
    return parse_generation_request(f.ctx, Endpoint::ChatCompletions, b).choices[0].prompt;
  };
  const auto tokens = [&](const std::string& text) { return f.tok->encode(text, true, true); };

  ParsedGeneration g = parse_generation_request(f.ctx, Endpoint::ChatCompletions, body);
  EXPECT_EQ(g.choices[0].prompt, tokens("<|im_start|>user\na b<|im_end|>\n<|im_start|>assistant\n<think>\n"));
  EXPECT_TRUE(g.reasoning.separates());
  EXPECT_EQ(g.reasoning.format, ReasoningFormat::Deepseek);  // llama-server's default
  EXPECT_EQ(g.reasoning.open_tag, "<think>");
  EXPECT_EQ(g.reasoning.close_tag, "</think>");
  EXPECT_TRUE(g.reasoning.starts_inside);

  // Thinking off: the prompt closes an empty block, the reply is content.
  body["chat_template_kwargs"] = {{"enable_thinking", false}};
  g = parse_generation_request(f.ctx, Endpoint::ChatCompletions, body);
  EXPECT_EQ(g.choices[0].prompt,
            tokens("<|im_start|>user\na b<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(g.reasoning.separates());
  // reasoning_effort "none" turns thinking off, whatever the kwargs say.
  body["chat_template_kwargs"] = {{"enable_thinking", true}};
  body["reasoning_effort"] = "none";
  EXPECT_EQ(prompt_of(body), tokens("<|im_start|>user\na b<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  body.erase("reasoning_effort");
  body.erase("chat_template_kwargs");

  // reasoning_format per request, and the server's default.
  body["reasoning_format"] = "none";
  EXPECT_EQ(parse_generation_request(f.ctx, Endpoint::ChatCompletions, body).reasoning.format, ReasoningFormat::None);
  body["reasoning_format"] = "deepseek-legacy";
  EXPECT_EQ(parse_generation_request(f.ctx, Endpoint::ChatCompletions, body).reasoning.format,
            ReasoningFormat::DeepseekLegacy);
  body.erase("reasoning_format");
  f.ctx.reasoning_format = ReasoningFormat::None;
  EXPECT_FALSE(parse_generation_request(f.ctx, Endpoint::ChatCompletions, body).reasoning.separates());
  f.ctx.reasoning_format = ReasoningFormat::Deepseek;

  // An assistant message last is continued (llama-server's prefill): its reasoning_content
  // is rendered (after the last query) and the prompt ends with its text; the reply is content.
  json turns = body;
  turns["messages"] = json::array({{{"role", "user"}, {"content", "a"}},
                                   {{"role", "assistant"}, {"content", "b"}, {"reasoning_content", "c"}}});
  EXPECT_EQ(prompt_of(turns), tokens("<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\n<think>\nc\n</think>\n\nb"));
  EXPECT_FALSE(parse_generation_request(f.ctx, Endpoint::ChatCompletions, turns).reasoning.starts_inside);
  // Only reasoning: the reply goes on inside the block.
  turns["messages"][1]["content"] = "";
  EXPECT_EQ(prompt_of(turns), tokens("<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\n<think>\nc"));
  EXPECT_TRUE(parse_generation_request(f.ctx, Endpoint::ChatCompletions, turns).reasoning.starts_inside);
  // Neither: a new turn.
  turns["messages"][1].erase("reasoning_content");
  EXPECT_EQ(prompt_of(turns), tokens("<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\n<think>\n"));
  // What cannot be continued: 400 naming the messages.
  for (const json& ending : {json::array({{{"role", "assistant"}, {"content", "b"}}, {{"role", "assistant"}, {"content", "c"}}}),
                             json::array({{{"role", "assistant"},
                                           {"content", ""},
                                           {"tool_calls", json::array({{{"id", "x"},
                                                                        {"type", "function"},
                                                                        {"function", {{"name", "f"}, {"arguments", "{}"}}}}})}}})}) {
    json bad = turns;
    bad["messages"] = json::array({{{"role", "user"}, {"content", "a"}}});
    for (const json& m : ending) bad["messages"].push_back(m);
    try {
      parse_generation_request(f.ctx, Endpoint::ChatCompletions, bad);
      ADD_FAILURE() << "accepted " << bad.dump();
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.param, "messages");
      EXPECT_NE(std::string(e.what()).find("continue"), std::string::npos) << e.what();
    }
  }
  // A conversation the template refuses: 400 naming the messages.
  turns["messages"] = json::array({{{"role", "assistant"}, {"content", "b"}}});
  try {
    parse_generation_request(f.ctx, Endpoint::ChatCompletions, turns);
    ADD_FAILURE() << "accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "messages");
    EXPECT_NE(std::string(e.what()).find("No user query found"), std::string::npos) << e.what();
  }

  // Qwen3: the reply may open the block itself.
  f.ctx.chat = &qwen3;
  g = parse_generation_request(f.ctx, Endpoint::ChatCompletions, body);
  EXPECT_EQ(g.choices[0].prompt, tokens("<|im_start|>user\na b<|im_end|>\n<|im_start|>assistant\n"));
  EXPECT_TRUE(g.reasoning.separates());
  EXPECT_FALSE(g.reasoning.starts_inside);
  // ChatML does not think: nothing to split; enable_thinking changes nothing.
  f.ctx.chat = &f.chat;
  body["chat_template_kwargs"] = {{"enable_thinking", false}};
  g = parse_generation_request(f.ctx, Endpoint::ChatCompletions, body);
  EXPECT_FALSE(g.reasoning.separates());
  EXPECT_EQ(g.choices[0].prompt, tokens("<|im_start|>user\na b<|im_end|>\n<|im_start|>assistant\n"));
  // The completion endpoints accept a valid reasoning_format and keep the raw text.
  json completion = base(Endpoint::LlamaCompletion);
  completion["reasoning_format"] = "deepseek";
  EXPECT_FALSE(parse_generation_request(f.ctx, Endpoint::LlamaCompletion, completion).reasoning.separates());
}

TEST(RequestParsing, ApplyTemplate) {
  Fixture f;
  const tokenizer::ChatTemplate qwen35(tokenizer::ChatFormat::Qwen35);
  f.ctx.chat = &qwen35;
  const json body = {{"messages", kMessages}, {"chat_template_kwargs", {{"enable_thinking", false}}}};
  EXPECT_EQ(parse_apply_template_request(f.ctx, body),
            "<|im_start|>user\na b<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_EQ(parse_apply_template_request(f.ctx, {{"messages", kMessages}}),
            "<|im_start|>user\na b<|im_end|>\n<|im_start|>assistant\n<think>\n");
  EXPECT_THROW(parse_apply_template_request(f.ctx, {{"messages", "hi"}}), ApiError);
  EXPECT_THROW(parse_apply_template_request(f.ctx, {{"messages", kMessages}, {"chat_template_kwargs", {{"x", 1}}}}), ApiError);
  EXPECT_NO_THROW(parse_request(f.ctx, "/apply-template", R"({"messages": [{"role": "user", "content": "a"}]})"));
}

TEST(RequestParsing, TokenizeAndDetokenize) {
  Fixture f;
  EXPECT_EQ(parse_detokenize_request(f.ctx, {{"tokens", {1, 5}}}), (std::vector<int32_t>{1, 5}));
  for (const json& bad : {json::object(), json{{"tokens", "abc"}}, json{{"tokens", {6}}}, json{{"tokens", {-1}}},
                          json{{"tokens", {1ll << 40}}}, json{{"tokens", {1.5}}}}) {
    try {
      parse_detokenize_request(f.ctx, bad);
      ADD_FAILURE() << bad.dump() << ": accepted";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_NE(std::string(e.what()).find("tokens"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(parse_tokenize_request({{"content", "a"}, {"with_pieces", true}}).with_pieces, true);
  for (const json& bad : {json::object(), json{{"content", 5}}, json{{"content", "a"}, {"add_special", "yes"}},
                          json{{"content", "a"}, {"with_pieces", 1}}}) {
    EXPECT_THROW(parse_tokenize_request(bad), ApiError) << bad.dump();
  }
}

TEST(RequestParsing, ParseRequestDispatchesByPath) {
  Fixture f;
  EXPECT_NO_THROW(parse_request(f.ctx, "/completion", R"({"prompt": "a"})"));
  EXPECT_NO_THROW(parse_request(f.ctx, "/detokenize", R"({"tokens": [1]})"));
  EXPECT_THROW(parse_request(f.ctx, "/completion", "{not json"), ApiError);
  EXPECT_THROW(parse_request(f.ctx, "/completion", "[]"), ApiError);
  EXPECT_THROW(parse_request(f.ctx, "/v1/chat/completions", R"({"messages": []})"), ApiError);
  try {
    parse_request(f.ctx, "/nope", "{}");
    ADD_FAILURE();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 404);
  }
}

// A Mistral tekken-style vocabulary: the tool-call tags are control tokens.
std::unique_ptr<tokenizer::Tokenizer> mistral_tokenizer() {
  gguf::Metadata m;
  m.set("tokenizer.ggml.model", std::string("llama"));
  m.set("tokenizer.ggml.tokens",
        gguf::string_array({"<unk>", "<s>", "</s>", "\xE2\x96\x81" "a", "\xE2\x96\x81" "b", "c", "[TOOL_CALLS]", "[ARGS]",
                            "[CALL_ID]", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"}));
  std::vector<gguf::Value> scores(13, gguf::Value(0.0f));
  std::vector<gguf::Value> types(13, gguf::Value(int32_t{3}));
  for (size_t i = 3; i < 6; ++i) types[i] = gguf::Value(int32_t{1});
  m.set("tokenizer.ggml.scores", gguf::make_array(gguf::ValueType::Float32, scores));
  m.set("tokenizer.ggml.token_type", gguf::make_array(gguf::ValueType::Int32, types));
  return std::make_unique<tokenizer::Tokenizer>(tokenizer::Vocabulary::from_metadata(m));
}

// With tools, the call syntax's control tokens are shown in the reply (its parser reads
// them); the template's default system message opens a conversation without one.
TEST(RequestParsing, ToolTagsAreShownAndTheDefaultSystemMessageIsUsed) {
  auto tok = mistral_tokenizer();
  const tokenizer::ChatTemplate chat(tokenizer::ChatFormat::MistralSmall32, "Default.");
  ParseContext ctx{*tok, &chat, 4096, "M", "/models/M.gguf", 16, 4, 8};
  json body = {{"messages", json::array({{{"role", "user"}, {"content", "a"}}})}};
  EXPECT_EQ(parse_apply_template_request(ctx, body), "[SYSTEM_PROMPT]Default.[/SYSTEM_PROMPT][INST]a[/INST]");
  auto g = parse_generation_request(ctx, Endpoint::ChatCompletions, body);
  EXPECT_TRUE(g.choices[0].shown_tokens.empty()) << "no tools: nothing to parse";
  body["tools"] = json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}});
  g = parse_generation_request(ctx, Endpoint::ChatCompletions, body);
  std::vector<int32_t> shown = g.choices[0].shown_tokens;
  std::sort(shown.begin(), shown.end());
  EXPECT_EQ(shown, (std::vector<int32_t>{6, 7, 8}));
  EXPECT_EQ(parse_apply_template_request(ctx, body),
            "[SYSTEM_PROMPT]Default.[/SYSTEM_PROMPT][AVAILABLE_TOOLS][{\"type\": \"function\", \"function\": "
            "{\"name\": \"f\", \"description\": \"\", \"parameters\": {}}}][/AVAILABLE_TOOLS][INST]a[/INST]");
  // A system message of the request's own replaces the default.
  body["messages"] = json::array({{{"role", "system"}, {"content", "Mine."}}, {{"role", "user"}, {"content", "a"}}});
  body.erase("tools");
  EXPECT_EQ(parse_apply_template_request(ctx, body), "[SYSTEM_PROMPT]Mine.[/SYSTEM_PROMPT][INST]a[/INST]");
  // An assistant message last is continued: the prompt ends with its text.
  body["messages"].push_back({{"role", "assistant"}, {"content", "b c"}});
  EXPECT_EQ(parse_apply_template_request(ctx, body), "[SYSTEM_PROMPT]Mine.[/SYSTEM_PROMPT][INST]a[/INST]b c");
}

// A tokenizer with fill-in-the-middle tokens: <unk>, <s>, </s>, three words, then
// <|fim_prefix|> 6, <|fim_suffix|> 7, <|fim_middle|> 8, <|fim_repo|> 9, <|file_sep|> 10.
std::unique_ptr<tokenizer::Tokenizer> fim_tokenizer() {
  gguf::Metadata m;
  m.set("tokenizer.ggml.model", std::string("llama"));
  m.set("tokenizer.ggml.tokens",
        gguf::string_array({"<unk>", "<s>", "</s>", "\xE2\x96\x81" "a", "\xE2\x96\x81" "b", "c", "<|fim_prefix|>",
                            "<|fim_suffix|>", "<|fim_middle|>", "<|fim_repo|>", "<|file_sep|>"}));
  std::vector<gguf::Value> scores(11, gguf::Value(0.0f));
  std::vector<gguf::Value> types(11, gguf::Value(int32_t{3}));
  for (size_t i = 3; i < 6; ++i) types[i] = gguf::Value(int32_t{1});
  types[0] = gguf::Value(int32_t{2});
  m.set("tokenizer.ggml.scores", gguf::make_array(gguf::ValueType::Float32, scores));
  m.set("tokenizer.ggml.token_type", gguf::make_array(gguf::ValueType::Int32, types));
  return std::make_unique<tokenizer::Tokenizer>(tokenizer::Vocabulary::from_metadata(m));
}

// /infill's prompt as llama-server lays it out: [extra chunks] BOS [PRE] prefix prompt
// [SUF] suffix [MID], the extra chunks as [REP]myproject\n, [SEP]file\n text each,
// [SEP]filename\n; a batch's worth of prefix (its end) and suffix (its start), 3 : 1.
TEST(RequestParsing, InfillBuildsTheFillInTheMiddlePrompt) {
  const auto tok = fim_tokenizer();
  tokenizer::ChatTemplate chat{tokenizer::ChatFormat::ChatML};
  ParseContext ctx{*tok, &chat, 4096, "M", "/models/M.gguf", 16, 4, 8};
  const auto enc = [&](const std::string& text) { return tok->encode(text, false, false); };
  const json body = {{"input_prefix", "a b"},
                     {"input_suffix", json::array({"b", 5})},
                     {"prompt", "a"},
                     {"input_extra", json::array({{{"filename", "b"}, {"text", "a"}}})},
                     {"n_predict", 8},
                     {"temperature", 0}};
  const json out = infill_completion_body(ctx, body);
  EXPECT_FALSE(out.contains("input_prefix") || out.contains("input_suffix") || out.contains("input_extra"));
  EXPECT_EQ(out["temperature"], 0);
  std::vector<int32_t> expected{9};
  const auto add = [&](const std::vector<int32_t>& t) { expected.insert(expected.end(), t.begin(), t.end()); };
  add(enc("myproject\n"));
  expected.push_back(10);
  add(enc("b\n"));
  add(enc("a"));
  expected.push_back(10);
  add(enc("filename\n"));
  ASSERT_TRUE(tok->add_bos());
  expected.push_back(1);
  expected.push_back(6);
  add(enc("a b"));
  add(tok->encode("a", false, true));
  expected.push_back(7);
  add(enc("b"));
  expected.push_back(5);
  expected.push_back(8);
  EXPECT_EQ(out["prompt"].get<std::vector<int32_t>>(), expected);
  // It is a /completion request then.
  EXPECT_EQ(parse_generation_request(ctx, Endpoint::LlamaCompletion, out).choices.at(0).prompt, expected);

  // A small context: no extra chunks (no room past a batch and the reply), the
  // prefix's last 3/4 of a batch, the suffix's first quarter less the FIM tokens and
  // the prompt.
  ParseContext small{*tok, &chat, 64, "M", "/models/M.gguf", 16, 4, 8};
  json longer = body;
  longer["input_prefix"] = json::array();
  longer["input_suffix"] = json::array();
  for (int i = 0; i < 100; ++i) longer["input_prefix"].push_back(3 + i % 3);
  for (int i = 0; i < 100; ++i) longer["input_suffix"].push_back(5 - i % 3);
  const auto cut = infill_completion_body(small, longer)["prompt"].get<std::vector<int32_t>>();
  std::vector<int32_t> want{1, 6};
  for (int i = 100 - 48; i < 100; ++i) want.push_back(3 + i % 3);
  want.push_back(tok->encode("a", false, true).at(0));
  want.push_back(7);
  for (int i = 0; i < 16 - 2 - 1; ++i) want.push_back(5 - i % 3);
  want.push_back(8);
  EXPECT_EQ(cut, want);

  // Refusals, by field; a model without FIM tokens answers 501.
  const auto status_of = [&](const ParseContext& c, const json& b, std::string* param = nullptr) {
    try {
      infill_completion_body(c, b);
    } catch (const ApiError& e) {
      if (param) *param = e.param;
      return e.status;
    }
    return 200;
  };
  std::string param;
  for (const auto& [field, value, named] : std::vector<std::tuple<std::string, json, std::string>>{
           {"input_prefix", nullptr, "input_prefix"},
           {"input_suffix", nullptr, "input_suffix"},
           {"prompt", 5, "prompt"},
           {"input_extra", "x", "input_extra"},
           {"input_extra", json::array({{{"filename", "a"}}}), "input_extra[0].text"},
           {"input_extra", json::array({{{"text", "a"}, {"mode", 1}}}), "input_extra[0].mode"},
           {"input_prefix", json::array({99}), "input_prefix"}}) {
    json bad = body;
    if (value.is_null()) {
      bad.erase(field);
    } else {
      bad[field] = value;
    }
    EXPECT_EQ(status_of(ctx, bad, &param), 400) << field;
    EXPECT_EQ(param, named) << field;
  }
  Fixture f;
  EXPECT_EQ(status_of(f.ctx, body), 501);
}

// The Responses API's request as a chat request: items to messages in order (an
// assistant's text and calls in one message), flat function tools nested, a named
// tool_choice, max_output_tokens, text.format; refusals name the field.
TEST(RequestParsing, ResponsesBecomeAChatRequest) {
  const json body = json::parse(R"({
    "model": "m", "instructions": "be brief", "max_output_tokens": 7, "temperature": 0.5, "stream": true,
    "store": true, "metadata": {"k": "v"},
    "input": [
      {"role": "user", "content": "weather?"},
      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "checking"}]},
      {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"},
      {"type": "function_call_output", "call_id": "c1", "output": "21 C"},
      {"role": "developer", "content": [{"type": "input_text", "text": "answer in C"}]}
    ],
    "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}, "strict": true}],
    "tool_choice": {"type": "function", "name": "get_weather"},
    "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}, "strict": true}}
  })");
  const json chat = chat_request_from_responses(body);
  const json expected_messages = json::parse(R"([
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "weather?"},
    {"role": "assistant", "content": [{"type": "text", "text": "checking"}],
     "tool_calls": [{"id": "c1", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "21 C"},
    {"role": "developer", "content": [{"type": "text", "text": "answer in C"}]}
  ])");
  EXPECT_EQ(chat["messages"], expected_messages);
  EXPECT_EQ(chat["tools"], json::parse(R"([{"type": "function", "function": {"name": "get_weather",
                                            "parameters": {"type": "object"}, "strict": true}}])"));
  EXPECT_EQ(chat["tool_choice"], json::parse(R"({"type": "function", "function": {"name": "get_weather"}})"));
  EXPECT_EQ(chat["max_tokens"], 7);
  EXPECT_EQ(chat["temperature"], 0.5);
  EXPECT_EQ(chat["stream"], true);
  EXPECT_EQ(chat["response_format"], json::parse(R"({"type": "json_schema",
                                                    "json_schema": {"name": "w", "schema": {"type": "object"}, "strict": true}})"));
  EXPECT_FALSE(chat.contains("input") || chat.contains("store") || chat.contains("metadata") || chat.contains("text"));
  // It parses as a chat request (less the format: a named call has its own grammar).
  json parsable = chat;
  parsable.erase("response_format");
  const auto tok = small_tokenizer();
  tokenizer::ChatTemplate template_{tokenizer::ChatFormat::ChatML};
  ParseContext ctx{*tok, &template_, 4096, "M", "/models/M.gguf", 16, 4, 8};
  try {
    parse_generation_request(ctx, Endpoint::ChatCompletions, parsable);
  } catch (const ApiError& e) {
    ADD_FAILURE() << e.what();
  }

  const auto param_of = [](const json& b) -> std::string {
    try {
      chat_request_from_responses(b);
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      return e.param;
    }
    return "(accepted)";
  };
  EXPECT_EQ(param_of({{"input", "x"}}), "(accepted)");
  EXPECT_EQ(param_of(json::object()), "input");
  EXPECT_EQ(param_of({{"input", 5}}), "input");
  EXPECT_EQ(param_of({{"input", "x"}, {"previous_response_id", "resp_1"}}), "previous_response_id");
  EXPECT_EQ(param_of({{"input", "x"}, {"background", true}}), "background");
  EXPECT_EQ(param_of({{"input", "x"}, {"include", {"reasoning.encrypted_content"}}}), "include");
  EXPECT_EQ(param_of({{"input", "x"}, {"reasoning", {{"effort", "high"}}}}), "reasoning.effort");
  EXPECT_EQ(param_of({{"input", "x"}, {"frequency_whatever", 1}}), "frequency_whatever");
  EXPECT_EQ(param_of({{"input", "x"}, {"tools", {{{"type", "web_search"}}}}}), "tools[0].type");
  EXPECT_EQ(param_of({{"input", "x"}, {"tools", {{{"type", "function"}, {"name", "a b"}}}}}), "tools[0].name");
  EXPECT_EQ(param_of({{"input", "x"}, {"text", {{"format", {{"type", "xml"}}}}}}), "text.format.type");
  EXPECT_EQ(param_of({{"input", {{{"role", "user"}, {"content", {{{"type", "input_image"}}}}}}}}),
            "input[0].content[0].type");
  EXPECT_EQ(param_of({{"input", {{{"type", "function_call"}, {"name", "f"}, {"arguments", "{}"}}}}}), "input[0].call_id");
  EXPECT_EQ(param_of({{"input", {{{"type", "item_reference"}, {"id", "x"}}}}}), "input[0].type");
}

}  // namespace
}  // namespace pico::coordinator::http_api
