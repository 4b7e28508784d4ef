// Reasoning separated from a chat reply's content, as llama-server does it: the text
// between <think> and </think> goes to message.reasoning_content (delta.reasoning_content
// when streamed) and is taken out of the content. Only chat completions of formats that
// think (tokenizer::chat_format_thinking_tags) are split; /completion and
// /v1/completions keep the raw text, as llama-server's do.
//
//   ReasoningSplitter split("<think>", "</think>", /*starts_inside=*/true);
//   for (piece : tokens) { auto d = split.feed(piece); send(d.reasoning, d.content); }
//   auto rest = split.finish();
//
// What the text becomes (llama.cpp's common/chat.cpp parsers and their tests):
// * reasoning: the block's text with the whitespace around it removed; a block of only
//   whitespace gives none. A block the reply never closes is reasoning to its end.
// * content: what follows </think>, leading whitespace removed; a second block is
//   content. A reply that does not open with <think> (whitespace before it allowed) is
//   all content.
// * streamed, nothing is sent that might still change: a suffix that could be the start
//   of a tag, and whitespace that could end the reasoning, wait for the next piece.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace pico::coordinator::http_api {

// llama-server's --reasoning-format / "reasoning_format": none keeps the tags in the
// content; deepseek (its default) and auto (the same) separate the reasoning, streamed
// too; deepseek-legacy separates it in whole replies but streams it inline in the
// content, between the tags.
enum class ReasoningFormat { None, Auto, Deepseek, DeepseekLegacy };

std::optional<ReasoningFormat> reasoning_format_from_name(std::string_view name);
std::string_view reasoning_format_name(ReasoningFormat format);
inline constexpr std::string_view kReasoningFormatNames = "'none', 'auto', 'deepseek' or 'deepseek-legacy'";

// How one chat request's reply is split (parse_generation_request decides it).
struct ReplyReasoning {
  ReasoningFormat format = ReasoningFormat::Deepseek;
  std::string open_tag, close_tag;  // empty: the chat format does not think (content only)
  bool starts_inside = false;       // the prompt opened the block (llama.cpp: thinking forced open)
  bool separates() const { return format != ReasoningFormat::None && !open_tag.empty(); }
};

class ReasoningSplitter {
 public:
  struct Split {
    std::string reasoning, content;
    bool empty() const { return reasoning.empty() && content.empty(); }
  };

  // Content only: every piece passes through as content.
  ReasoningSplitter() = default;
  // inline_reasoning: the reasoning stays in the content between the tags (whitespace
  // around it still removed; deepseek-legacy's streams).
  ReasoningSplitter(std::string open_tag, std::string close_tag, bool starts_inside, bool inline_reasoning = false);
  // For a request: content only unless reply.separates(); inline when streamed with
  // deepseek-legacy.
  static ReasoningSplitter for_reply(const ReplyReasoning& reply, bool stream);

  // The next piece of the reply; returns what can be sent now.
  Split feed(std::string_view piece);
  // The reply ended: whatever was held back.
  Split finish();

 private:
  enum class State { Start, Reasoning, AfterReasoning, Content };
  void run(Split& out, bool final);
  void emit_reasoning(Split& out, std::string_view text, bool ends);
  void close_block(Split& out);

  std::string open_, close_;
  bool inline_ = false;
  State state_ = State::Content;
  std::string pending_;           // received, not yet sent
  bool reasoning_begun_ = false;  // some reasoning text was sent (its leading whitespace is gone)
};

}  // namespace pico::coordinator::http_api
