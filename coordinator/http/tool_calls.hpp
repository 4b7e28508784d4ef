// Tool calling on /v1/chat/completions, as llama-server does it for the chat formats
// pico writes: the tools, and the calls and results of the history, rendered into the
// prompt the way each format's template writes them; the calls of the reply parsed
// back out of its text; `tool_choice` required or a named function enforced by a
// grammar, so that the call is well-formed.
//
// The syntax of a call, by chat format (tool_style):
//   Hermes   ChatML, Qwen3 (Qwen2.5 / Qwen3 / Hermes 2 Pro templates), and the fallback
//            for formats without a tool syntax of their own:
//              <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
//   QwenXml  Qwen3.5 (its template's XML):
//              <tool_call>\n<function=f>\n<parameter=p>\nvalue\n</parameter>\n</function>\n</tool_call>
//   Llama3   Llama 3.1+: the whole reply is {"name": "f", "parameters": {...}}; results
//            come back in `ipython` turns; the tools open the first user message.
//   Mistral  Mistral v0.3, Nemo, Small (mistral-v3, -v3-tekken, -v7, -v7-tekken): the
//            tools in [AVAILABLE_TOOLS] before the last user turn, calls as
//            [TOOL_CALLS] [{"name": "f", "arguments": {...}, "id": "abcdef123"}], results
//            in [TOOL_RESULTS]; these prompts are written whole (render_tool_prompt).
//   MistralArgs  Mistral Small 3.2 (mistral-small-3.2), Ministral 3 / Magistral and
//            Devstral Small (ministral-3): each call [TOOL_CALLS]f[ARGS]{...} (Small 3.2's
//            with [CALL_ID]abcdef123 before [ARGS]); the tools in [AVAILABLE_TOOLS] (Small
//            3.2: before the last user turn; the others: after the system prompt), results
//            in [TOOL_RESULTS] (Small 3.2's: id[TOOL_CONTENT]text); written whole too.
//
//   ToolCallSplitter split(calling, make_id);
//   for (piece : reply) { auto part = split.feed(piece); send(part.content, part.calls); }
//   auto rest = split.finish();
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/chat_template.hpp"

namespace pico::coordinator::http_api {

struct ToolFunction {
  std::string name, description;
  nlohmann::json parameters = nlohmann::json::object();  // a JSON Schema of the arguments object
};

struct ToolCall {
  std::string id, name;
  std::string arguments;  // JSON text of an object
  bool streamed = false;  // its header and arguments went out as ToolCallSplitter::Part::pieces already
};

enum class ToolStyle { Hermes, QwenXml, Llama3, Mistral, MistralArgs };
ToolStyle tool_style(tokenizer::ChatFormat format);

enum class ToolChoice { None, Auto, Required, Named };

// One chat request's tools and what it allows.
struct ToolCalling {
  std::vector<ToolFunction> tools;
  ToolChoice choice = ToolChoice::Auto;
  std::string named;      // ToolChoice::Named: the function it must call
  bool parallel = false;  // parallel_tool_calls: several calls in one reply
  ToolStyle style = ToolStyle::Hermes;
  // The tools reach the prompt and the reply is parsed for calls.
  bool active() const { return !tools.empty() && choice != ToolChoice::None; }
  // The reply must be calls (the grammar of tool_call_grammar).
  bool forced() const { return active() && (choice == ToolChoice::Required || choice == ToolChoice::Named); }
  const ToolFunction* find(std::string_view name) const;
};

// A request's message with its tool parts.
struct RequestMessage {
  tokenizer::ChatMessage message;  // role (developer already as system), content, reasoning
  std::vector<ToolCall> tool_calls;  // an assistant's calls
  std::string tool_call_id;          // a tool result's
};

// The messages the chat format renders: with active tools, their block in the system
// message (Llama 3: the first user message); every assistant turn's calls in its text
// and every tool result in the format's tool turn, in the call syntax of `format`.
std::vector<tokenizer::ChatMessage> render_tool_messages(tokenizer::ChatFormat format, const ToolCalling& calling,
                                                         const std::vector<RequestMessage>& messages);

// The whole prompt where the format's tool template differs from its plain one in more
// than the messages' text (Mistral's: the system message joins the last user turn, the
// tools come before it): when the request has active tools or a history with calls or
// results. nullopt otherwise (render_tool_messages and the format's renderer then).
std::optional<std::string> render_tool_prompt(tokenizer::ChatFormat format, const ToolCalling& calling,
                                              const std::vector<RequestMessage>& messages);

// A new call's id: "call_" and 24 letters and digits, or for Mistral's templates,
// which take them back, 9 letters and digits.
std::string tool_call_id(ToolStyle style);

// JSON as Jinja's tojson writes it (Python's json.dumps: ", " and ": " separators).
std::string python_json(const nlohmann::json& value);
std::string python_json(const nlohmann::ordered_json& value);

// A tool as llama.cpp hands it to a template: {"type": "function", "function": {"name",
// "description" ("" when none), "parameters" ({} when none)}}, in that order.
nlohmann::ordered_json tool_definition(const ToolFunction& tool);

// The start rule of tool_call_grammar's text.
inline constexpr std::string_view kToolCallsRule = "pico-tool-calls";

// GBNF whose start rule is kToolCallsRule: a reply of calls only, one (several, separated by a
// newline, when parallel) of the allowed tools (every tool, or the named one), with
// arguments that validate against the tool's parameters (Hermes, Llama 3; Qwen3.5's XML:
// the parameters the schema requires, each once, in its order; MistralArgs: one
// [TOOL_CALLS] per call, several with no separator). Throws SchemaError
// (json_schema_grammar.hpp) when a tool's parameters cannot be expressed.
std::string tool_call_grammar(const ToolCalling& calling);

// The tags of a style's call syntax (<tool_call>, [TOOL_CALLS], [ARGS], ...): where a
// vocabulary has them as control tokens, the reply must show their text to be parsed.
std::vector<std::string> tool_syntax_tags(ToolStyle style);

// The texts that open a call (tool_choice auto: the grammar of calls holds from one of
// them on, a lazy grammar, so that a call the model starts is well-formed).
std::vector<std::string> tool_call_triggers(ToolStyle style);

// A reply split into content and calls as it streams: content passes through, except
// what may be the start of a call (held until known); a call leaves only once whole and
// valid (a known tool, arguments a JSON object); a block that does not parse stays
// content. Without parallel calls, what follows the first call is content.
// A JSON call ({"name": N, "arguments": {...}}: Hermes; Llama 3's first call, with
// "parameters"; a Mistral list's first call; every [TOOL_CALLS]f[ARGS]{...} call) of an allowed tool also streams while it
// comes, as OpenAI streams calls: its header (index, id, name) once the name is known,
// then its arguments' text piece by piece (whitespace outside strings dropped), which
// is then the whole call's `arguments` (marked `streamed`). A streamed call that then
// does not parse (a reply cut inside it) stays content as well.
class ToolCallSplitter {
 public:
  struct CallPiece {
    size_t index = 0;       // the call's, among the reply's calls
    std::string id, name;   // set on its first piece only
    std::string arguments;  // the next piece of its arguments' text
  };
  struct Part {
    std::string content;
    std::vector<CallPiece> pieces;  // of calls still coming (before `calls`)
    std::vector<ToolCall> calls;
    bool empty() const { return content.empty() && pieces.empty() && calls.empty(); }
  };
  ToolCallSplitter() = default;  // content only
  ToolCallSplitter(ToolCalling calling, std::function<std::string()> make_id);

  Part feed(std::string_view piece);
  // The reply ended (its last piece given here, if any): whatever was held back.
  Part finish(std::string_view last = {});
  size_t calls() const { return calls_; }

 private:
  enum class State { Content, InCall, Llama3Start };
  void run(Part& out, bool final);
  bool take_call(Part& out, std::string_view body);  // false: not a call
  void emit_content(Part& out, std::string_view text);
  size_t find_close(std::string_view text) const;

  ToolCalling calling_;
  std::function<std::string()> make_id_;
  bool active_ = false;
  State state_ = State::Content;
  std::string pending_;
  std::string held_space_;  // whitespace after content: dropped if a call follows
  bool after_call_ = false;  // the whitespace that follows a call is dropped too
  size_t calls_ = 0;
  // The JSON call in pending_ as it streams (stream_call).
  struct Streaming {
    bool decided = false;    // its head was read, or it will not stream
    bool on = false;         // its header went out: its arguments follow
    bool ended = false;      // its arguments' object closed
    size_t scanned = 0;      // bytes of pending_ looked at
    int depth = 0;           // of the arguments' JSON
    bool in_string = false, escaped = false;
    std::string id, name, arguments;  // arguments: as sent
  } streaming_;
  void stream_call(Part& out);
};

}  // namespace pico::coordinator::http_api
