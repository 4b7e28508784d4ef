// Chat prompts without a Jinja engine: the common chat formats written out in code,
// chosen from the model's tokenizer.chat_template by the substring heuristics
// llama.cpp uses (llm_chat_detect_template), else from the vocabulary's special
// tokens, else ChatML; or by name. The text produced is what llama.cpp's
// llama_chat_apply_template produces for the same format; for the formats llama.cpp
// renders only through its Jinja engine (Qwen3, Qwen3.5), what their templates produce.
//
//   auto chat = ChatTemplate::from_metadata(model->metadata(), &tok->vocab());
//   std::string prompt = chat.apply({{"system", "Be brief."}, {"user", "Hi"}}, true);
//   auto ids = tok->encode(prompt, /*add_special=*/true, /*parse_special=*/true);
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/value.hpp"
#include "tokenizer/vocab.hpp"

namespace pico::tokenizer {

enum class ChatFormat {
  Unknown,
  ChatML,          // Qwen, Yi, OpenHermes...: <|im_start|>role\n...<|im_end|>\n
  Llama2,          // [INST] ... [/INST]; a system message is prepended to the first turn
  Llama2Sys,       // with <<SYS>>\n...\n<</SYS>>\n\n
  Llama2SysBos,    // ... and <s> before each later [INST]
  Llama2SysStrip,  // ... and message text trimmed
  Llama3,          // <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>
  Llama31,         // Llama 3.1 / 3.2 / 3.3: Llama 3's turns after a system block with the dates (and tools)
  MistralV1,       // " [INST] ... [/INST] ...</s>"
  MistralV3,       // "[INST] ...[/INST] ...</s>"
  MistralV3Tekken, // "[INST]...[/INST]...</s>"
  MistralV7,       // [SYSTEM_PROMPT] ...[/SYSTEM_PROMPT][INST] ...[/INST] ...</s>
  MistralV7Tekken,
  // Mistral Small 3.2: v7-tekken's turns; tool calls as [TOOL_CALLS]name[CALL_ID]id[ARGS]{...}
  MistralSmall32,
  // Ministral 3 / Magistral, Devstral Small: v7-tekken's turns; calls as
  // [TOOL_CALLS]name[ARGS]{...}; replies may open with [THINK]...[/THINK]
  Ministral3,
  Gemma,           // <start_of_turn>user\n...<end_of_turn>\n; assistant is "model"
  Zephyr,          // <|role|>\n...<|endoftext|>\n
  Phi3,            // <|role|>\n...<|end|>\n
  Alpaca,          // ### Instruction:\n...\n\n### Response:\n...
  Qwen3,           // ChatML; replies may open with <think>...</think>; history keeps reasoning after the last query
  Qwen35,          // Qwen3.5: ChatML, texts trimmed; the generation prompt opens <think>\n
};

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" (others pass through where the format allows)
  std::string content;
  // An assistant turn's reasoning given apart from its content (llama-server's
  // message.reasoning_content). Formats that think render it as their templates do
  // (else, as there, the reasoning is taken from <think>...</think> in content);
  // the others ignore it.
  std::optional<std::string> reasoning_content = std::nullopt;
};

struct ChatOptions {
  bool add_generation_prompt = true;  // open an assistant turn
  bool enable_thinking = true;        // chat_template_kwargs.enable_thinking (formats that think; others ignore it)
  bool tools = false;                 // the request has tools (Llama 3.1's system block then says "Environment: ipython")
};

// The tags a format's replies put their reasoning between.
struct ThinkingTags {
  std::string_view open, close;
};
// <think> and </think> for the formats that think (Qwen3, Qwen3.5), [THINK] and [/THINK]
// for Ministral 3; nothing for the others.
std::optional<ThinkingTags> chat_format_thinking_tags(ChatFormat format);

// How a reply to a prompt rendered with `options` begins.
enum class ReplyStart {
  Content,       // the format does not think, or the prompt holds a closed (empty) block
  MayThink,      // the reply itself may open the block (Qwen3)
  InsideThinking // the prompt opened the block (Qwen3.5; llama.cpp's "thinking forced open")
};
ReplyStart chat_format_reply_start(ChatFormat format, const ChatOptions& options);

std::string_view chat_format_name(ChatFormat format);
// "chatml", "llama2", "llama2-sys", "llama2-sys-bos", "llama2-sys-strip", "llama3", "llama3.1",
// "mistral-v1", "mistral-v3", "mistral-v3-tekken", "mistral-v7", "mistral-v7-tekken",
// "mistral-small-3.2", "ministral-3", "gemma", "zephyr", "phi3", "alpaca", "qwen3", "qwen3.5".
std::optional<ChatFormat> chat_format_from_name(std::string_view name);

// The format a template is written for: a format name, or Jinja text recognized by
// the substrings llama.cpp looks for. Unknown when nothing matches.
ChatFormat detect_chat_format(std::string_view template_text);

// The format a vocabulary's special tokens suggest (<|im_start|>, <|start_header_id|>,
// <start_of_turn>, [INST]); Unknown when none is present.
ChatFormat chat_format_from_vocabulary(const Vocabulary& vocab);

// The prompt for `messages`. With add_generation_prompt the header of an assistant
// turn follows (formats without one, llama2 and mistral, add nothing). Throws
// std::invalid_argument for a conversation the format's template refuses (Qwen3.5: no
// user message, a system message after the first, a role it does not know).
std::string apply_chat_format(ChatFormat format, std::span<const ChatMessage> messages, const ChatOptions& options);
std::string apply_chat_format(ChatFormat format, std::span<const ChatMessage> messages, bool add_generation_prompt);

// The system message a template writes when a conversation has none, where it says so
// as Mistral's recent templates do: `set default_system_message = ...` of string
// literals joined by '+', and of variables set to strftime_now("format") (today's date,
// as llama.cpp's template engine gives it); or as Qwen2.5's does, a literal
// '<|im_start|>system\n...<|im_end|>\n' of its own. Empty when there is none, or when
// the expression holds anything else.
std::string default_system_message(std::string_view template_text);

class ChatTemplate {
 public:
  explicit ChatTemplate(ChatFormat format = ChatFormat::ChatML, std::string default_system = {})
      : format_(format), default_system_(std::move(default_system)) {}

  // The format a template's text (or a format name) is written for, and its default
  // system message; ChatML when the format is not recognised.
  static ChatTemplate from_text(std::string_view text);

  // `override_name` (a format name, or template text) wins; else tokenizer.chat_template;
  // else the vocabulary's tokens; else ChatML. Throws std::invalid_argument for an
  // unknown override name.
  static ChatTemplate from_metadata(const gguf::Metadata& metadata, const Vocabulary* vocab = nullptr,
                                    std::string_view override_name = {});

  ChatFormat format() const { return format_; }
  // What a conversation without a system message gets as one (empty: nothing).
  const std::string& default_system() const { return default_system_; }
  std::string_view name() const { return chat_format_name(format_); }
  std::string apply(std::span<const ChatMessage> messages, bool add_generation_prompt) const {
    return apply_chat_format(format_, messages, add_generation_prompt);
  }
  std::string apply(std::span<const ChatMessage> messages, const ChatOptions& options) const {
    return apply_chat_format(format_, messages, options);
  }
  std::optional<ThinkingTags> thinking_tags() const { return chat_format_thinking_tags(format_); }
  ReplyStart reply_start(const ChatOptions& options) const { return chat_format_reply_start(format_, options); }
  std::string apply(std::initializer_list<ChatMessage> messages, bool add_generation_prompt) const {
    return apply_chat_format(format_, std::span<const ChatMessage>(messages.begin(), messages.size()),
                             add_generation_prompt);
  }

 private:
  ChatFormat format_;
  std::string default_system_;
};

}  // namespace pico::tokenizer
