// Writes http_request_fuzz's seed corpus: valid bodies of every endpoint using each
// field family (sampling, logit_bias in both forms, stop, n, logprobs, messages with
// content parts, token-id prompts), behind the byte that selects the endpoint.
//   http_request_fuzz_seeds DIR
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "http_request_paths.hpp"
#include "seed_corpus.hpp"

int main(int argc, char** argv) {
  return pico::fuzz::seed_corpus_main(argc, argv, [](const std::filesystem::path& dir) {
    const std::vector<std::pair<int, std::string>> seeds = {
        {0, R"({"prompt":"t3 t4","n_predict":4,"temperature":0})"},
        {0, R"({"prompt":[1,3,4,5],"n_predict":0,"cache_prompt":false})"},
        {0, R"({"prompt":"t5","n_probs":3,"top_k":5,"top_p":0.9,"min_p":0.1,"typical_p":0.8,"repeat_penalty":1.1,)"
            R"("repeat_last_n":16,"presence_penalty":0.5,"frequency_penalty":0.2,"seed":7,"stop":["t6","\n"],)"
            R"("logit_bias":[[3,-1.5],[4,false],["t5",2]],"ignore_eos":true,"stream":true,"mirostat":0})"},
        {1, R"({"model":"fuzz-model","prompt":"t3","max_tokens":3,"n":2,"logprobs":2,"logit_bias":{"4":-100},)"
            R"("stop":"t7","stream":true,"stream_options":{"include_usage":true}})"},
        {2, R"({"messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text",)"
            R"("text":"t3 t4"}]},{"role":"assistant","content":"t5"},{"role":"developer","content":"t6"}],)"
            R"("max_completion_tokens":5,"logprobs":true,"top_logprobs":3,"response_format":{"type":"text"},)"
            R"("tool_choice":"none","tools":[],"temperature":0.7})"},
        {3, R"({"content":"t3 t4 t5","add_special":true,"with_pieces":true})"},
        {4, R"({"tokens":[1,3,4,63]})"},
        {5, R"({})"},
        {2, R"({"messages":[{"role":"user","content":"t3"},{"role":"assistant","content":"<think>t4</think>t5",)"
            R"("reasoning_content":"t6"}],"chat_template_kwargs":{"enable_thinking":false},)"
            R"("reasoning_format":"deepseek-legacy","stream":true})"},
        {6, R"({"messages":[{"role":"user","content":"t3"}],"chat_template_kwargs":{"enable_thinking":true}})"},
        // Grammars: GBNF (rules, classes, repetitions, escapes) and JSON Schemas.
        {0, R"({"prompt":"t3","n_predict":4,"grammar":"root ::= item{1,3} (\"t4\" | [a-z\\x41-\\u00ff]+)? # c\nitem ::= (\"t5\" | .)* \"\\n\""})"},
        {1, R"({"prompt":"t3","max_tokens":3,"json_schema":{"type":"object","properties":{"a":{"type":"integer",)"
            R"("minimum":-5,"maximum":120},"b":{"type":"array","items":{"$ref":"#/$defs/s"},"minItems":1,"maxItems":3},)"
            R"("c":{"anyOf":[{"type":"null"},{"enum":["x",1,true]}]},"d":{"type":"string","pattern":"^[a-c]+(x|y)?$"},)"
            R"("e":{"type":"string","format":"date-time"}},"required":["a"],"additionalProperties":false,)"
            R"("$defs":{"s":{"type":"string","maxLength":4}}}})"},
        {2, R"({"messages":[{"role":"user","content":"t3"}],"response_format":{"type":"json_schema",)"
            R"("json_schema":{"name":"n","strict":true,"schema":{"type":"object","properties":{"t":{"$ref":"#"}}}}}})"},
        {2, R"({"messages":[{"role":"user","content":"t3"}],"response_format":{"type":"json_object"}})"},
        // Tools: definitions, a forced call (its grammar), a history of calls and results.
        {2, R"({"messages":[{"role":"user","content":"t3"},{"role":"assistant","content":null,"tool_calls":[)"
            R"({"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},)"
            R"({"role":"tool","tool_call_id":"c1","content":"t4"}],"tools":[{"type":"function","function":{"name":"f",)"
            R"("parameters":{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}}},)"
            R"({"type":"function","function":{"name":"g"}}],"tool_choice":"required","parallel_tool_calls":true})"},
        {2, R"({"messages":[{"role":"user","content":"t3"}],"tools":[{"type":"function","function":{"name":"f"}}],)"
            R"("tool_choice":{"type":"function","function":{"name":"f"}}})"},
        // Anthropic's Messages API.
        {7, R"({"model":"m","max_tokens":5,"system":[{"type":"text","text":"t4"}],"messages":[{"role":"user",)"
            R"("content":[{"type":"text","text":"t3"}]},{"role":"assistant","content":"t5"}],"stop_sequences":["t6"],)"
            R"("temperature":0.5,"top_k":3,"stream":true,"thinking":{"type":"disabled"}})"},
        {8, R"({"system":"t4","messages":[{"role":"user","content":"t3 t4"}]})"},
        // Embeddings: one input, several, token ids, mixed, llama-server's 'content'.
        {9, R"({"model":"m","input":["t3 t4",[1,2,3],"t5"],"encoding_format":"base64","embd_normalize":1})"},
        {9, R"({"input":[1,"t3",2],"dimensions":64})"},
        {10, R"({"content":"t3 t4","embd_normalize":-1})"},
        // Infill (a 501 unless the fuzz model has FIM tokens).
        {11, R"({"input_prefix":"t3","input_suffix":["t4",5],"prompt":"t5","input_extra":[{"filename":"f","text":"t6"}],)"
             R"("n_predict":4})"},
        // The Responses API: text, items with a call and its output, tools, a format.
        {12, R"({"input":"t3","instructions":"t4","max_output_tokens":3})"},
        {12, R"({"input":[{"role":"user","content":"t3"},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},)"
             R"({"type":"function_call_output","call_id":"c","output":"t5"}],"tools":[{"type":"function","name":"f",)"
             R"("parameters":{"type":"object"}}],"tool_choice":"required","text":{"format":{"type":"json_object"}}})"},
    };
    for (size_t i = 0; i < seeds.size(); ++i) {
      const auto& [endpoint, body] = seeds[i];
      std::string input(1, static_cast<char>(endpoint % pico::fuzz::kHttpRequestPaths.size()));
      input += body;
      std::ofstream(dir / ("seed-" + std::to_string(i)), std::ios::binary) << input;
    }
  });
}
