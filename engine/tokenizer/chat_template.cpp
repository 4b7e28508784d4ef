#include "tokenizer/chat_template.hpp"

#include <cctype>
#include <cstdio>
#include <ctime>
#include <stdexcept>

namespace pico::tokenizer {

namespace {

struct NamedFormat {
  std::string_view name;
  ChatFormat format;
};

constexpr NamedFormat kFormats[] = {
    {"chatml", ChatFormat::ChatML},
    {"llama2", ChatFormat::Llama2},
    {"llama2-sys", ChatFormat::Llama2Sys},
    {"llama2-sys-bos", ChatFormat::Llama2SysBos},
    {"llama2-sys-strip", ChatFormat::Llama2SysStrip},
    {"llama3", ChatFormat::Llama3},
    {"llama3.1", ChatFormat::Llama31},
    {"mistral-v1", ChatFormat::MistralV1},
    {"mistral-v3", ChatFormat::MistralV3},
    {"mistral-v3-tekken", ChatFormat::MistralV3Tekken},
    {"mistral-v7", ChatFormat::MistralV7},
    {"mistral-v7-tekken", ChatFormat::MistralV7Tekken},
    {"mistral-small-3.2", ChatFormat::MistralSmall32},
    {"ministral-3", ChatFormat::Ministral3},
    {"gemma", ChatFormat::Gemma},
    {"zephyr", ChatFormat::Zephyr},
    {"phi3", ChatFormat::Phi3},
    {"alpaca", ChatFormat::Alpaca},
    {"qwen3", ChatFormat::Qwen3},
    {"qwen3.5", ChatFormat::Qwen35},
};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'; }

std::string trim(std::string_view s) {
  size_t begin = 0, end = s.size();
  while (begin < end && is_space(s[begin])) ++begin;
  while (end > begin && is_space(s[end - 1])) --end;
  return std::string(s.substr(begin, end - begin));
}

// Today's date in the local time zone, as strftime writes it with `format`.
std::string today(const char* format) {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char buffer[128];
  const size_t n = std::strftime(buffer, sizeof buffer, format, &local);
  return std::string(buffer, n);
}

// A string as JSON text (tojson of a string).
std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned>(c));
          out += escaped;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

void chatml(std::string& out, std::span<const ChatMessage> messages, bool add_generation_prompt) {
  for (const auto& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
}

// The pieces of Python's str methods the Qwen templates use.
std::string_view strip_newlines(std::string_view s, bool left, bool right) {
  while (left && !s.empty() && s.front() == '\n') s.remove_prefix(1);
  while (right && !s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}
std::string_view before_first(std::string_view s, std::string_view separator) {  // s.split(separator)[0]
  return s.substr(0, s.find(separator));
}
std::string_view after_last(std::string_view s, std::string_view separator) {  // s.split(separator)[-1]
  const size_t at = s.rfind(separator);
  return at == std::string_view::npos ? s : s.substr(at + separator.size());
}
bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

// An assistant turn's reasoning and content as both Qwen templates take them: its
// reasoning_content when given, else the text before </think> (after <think>), the
// content being what follows the last </think>.
struct ReasonedTurn {
  std::string reasoning, content;
};
ReasonedTurn split_assistant_turn(const ChatMessage& m, std::string_view content) {
  if (m.reasoning_content) return {*m.reasoning_content, std::string(content)};
  if (!contains(content, "</think>")) return {"", std::string(content)};
  const std::string_view before = strip_newlines(before_first(content, "</think>"), false, true);
  return {std::string(strip_newlines(after_last(before, "<think>"), true, false)),
          std::string(strip_newlines(after_last(content, "</think>"), true, false))};
}

// The index of the last user message that is not a tool response wrapped in a user
// turn (the templates' ns.last_query_index); nullopt when there is none.
template <class TextOf>
std::optional<size_t> last_query_index(std::span<const ChatMessage> messages, TextOf text_of) {
  for (size_t i = messages.size(); i-- > 0;) {
    if (messages[i].role != "user") continue;
    const std::string text = text_of(messages[i].content);
    if (!(text.starts_with("<tool_response>") && text.ends_with("</tool_response>"))) return i;
  }
  return std::nullopt;
}

// Qwen3's template (Qwen3-0.6B ... 235B-A22B, hybrid thinking). Texts are not trimmed;
// a first system message opens the prompt, a later one is a turn of its own.
void qwen3(std::string& out, std::span<const ChatMessage> messages, const ChatOptions& options) {
  const size_t n = messages.size();
  if (n > 0 && messages[0].role == "system") out += "<|im_start|>system\n" + messages[0].content + "<|im_end|>\n";
  const size_t last_query = last_query_index(messages, [](const std::string& s) { return s; }).value_or(n - 1);
  for (size_t i = 0; i < n; ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user" || (m.role == "system" && i > 0)) {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    } else if (m.role == "assistant") {
      const ReasonedTurn turn = split_assistant_turn(m, m.content);
      // Turns after the last query (a tool loop's) keep their reasoning: the last one
      // always, the others when they have some.
      if (i > last_query && (i + 1 == n || !turn.reasoning.empty())) {
        out += "<|im_start|>assistant\n<think>\n" + std::string(strip_newlines(turn.reasoning, true, true)) +
               "\n</think>\n\n" + std::string(strip_newlines(turn.content, true, false));
      } else {
        out += "<|im_start|>assistant\n" + turn.content;
      }
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {  // consecutive tool responses share one user turn
      if (i == 0 || messages[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n" + m.content + "\n</tool_response>";
      if (i + 1 == n || messages[i + 1].role != "tool") out += "<|im_end|>\n";
    }  // other roles: the template writes nothing
  }
  if (options.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (!options.enable_thinking) out += "<think>\n\n</think>\n\n";
  }
}

// Qwen3.5's template: every text trimmed; turns after the last query always carry
// their (possibly empty) think block; the generation prompt opens one.
void qwen35(std::string& out, std::span<const ChatMessage> messages, const ChatOptions& options) {
  if (messages.empty()) throw std::invalid_argument("No messages provided.");
  const size_t n = messages.size();
  if (messages[0].role == "system") out += "<|im_start|>system\n" + trim(messages[0].content) + "<|im_end|>\n";
  const auto last_query = last_query_index(messages, [](const std::string& s) { return trim(s); });
  if (!last_query) throw std::invalid_argument("No user query found in messages.");
  for (size_t i = 0; i < n; ++i) {
    const ChatMessage& m = messages[i];
    const std::string content = trim(m.content);
    if (m.role == "system") {
      if (i > 0) throw std::invalid_argument("System message must be at the beginning.");
    } else if (m.role == "user") {
      out += "<|im_start|>user\n" + content + "<|im_end|>\n";
    } else if (m.role == "assistant") {
      const ReasonedTurn turn = split_assistant_turn(m, content);
      if (i > *last_query) {
        out += "<|im_start|>assistant\n<think>\n" + trim(turn.reasoning) + "\n</think>\n\n" + turn.content;
      } else {
        out += "<|im_start|>assistant\n" + turn.content;
      }
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {  // consecutive tool responses share one user turn
      if (i > 0 && messages[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n" + content + "\n</tool_response>";
      if (i + 1 == n || messages[i + 1].role != "tool") out += "<|im_end|>\n";
    } else {
      throw std::invalid_argument("Unexpected message role.");
    }
  }
  if (options.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    out += options.enable_thinking ? "<think>\n" : "<think>\n\n</think>\n\n";
  }
}

void llama2(std::string& out, ChatFormat format, std::span<const ChatMessage> messages) {
  const bool system_block = format != ChatFormat::Llama2;
  const bool bos_in_history = format == ChatFormat::Llama2SysBos;
  const bool strip = format == ChatFormat::Llama2SysStrip;
  bool in_turn = true;  // the first [INST] is written up front, without BOS
  out += "[INST] ";
  for (const auto& m : messages) {
    const std::string content = strip ? trim(m.content) : m.content;
    if (!in_turn) {
      in_turn = true;
      out += bos_in_history ? "<s>[INST] " : "[INST] ";
    }
    if (m.role == "system") {
      out += system_block ? "<<SYS>>\n" + content + "\n<</SYS>>\n\n" : content + "\n";
    } else if (m.role == "user") {
      out += content + " [/INST]";
    } else {
      out += content + "</s>";
      in_turn = false;
    }
  }
}

void mistral(std::string& out, ChatFormat format, std::span<const ChatMessage> messages) {
  if (format == ChatFormat::MistralV7 || format == ChatFormat::MistralV7Tekken || format == ChatFormat::MistralSmall32 ||
      format == ChatFormat::Ministral3) {
    const std::string space = format == ChatFormat::MistralV7 ? " " : "";
    for (const auto& m : messages) {
      if (m.role == "system") {
        out += "[SYSTEM_PROMPT]" + space + m.content + "[/SYSTEM_PROMPT]";
      } else if (m.role == "user") {
        out += "[INST]" + space + m.content + "[/INST]";
      } else {
        // Ministral 3's template writes an assistant's thinking block before its text.
        const bool thinking = format == ChatFormat::Ministral3 && m.reasoning_content && !m.reasoning_content->empty();
        out += space + (thinking ? "[THINK]" + *m.reasoning_content + "[/THINK]" : std::string()) + m.content + "</s>";
      }
    }
    return;
  }
  if (format == ChatFormat::MistralV3 || format == ChatFormat::MistralV3Tekken) {
    // Their templates (Mistral 7B v0.3, Nemo) give the first system message to the
    // last message when it is the user's; otherwise it is not written.
    const std::string space = format == ChatFormat::MistralV3 ? " " : "";
    const size_t first = !messages.empty() && messages[0].role == "system" ? 1 : 0;
    for (size_t i = first; i < messages.size(); ++i) {
      const ChatMessage& m = messages[i];
      if (m.role == "user" || m.role == "system") {
        const bool with_system = first == 1 && m.role == "user" && i + 1 == messages.size();
        out += "[INST]" + space + (with_system ? messages[0].content + "\n\n" : "") + m.content + "[/INST]";
      } else {
        out += space + (format == ChatFormat::MistralV3 ? trim(m.content) : m.content) + "</s>";
      }
    }
    return;
  }
  const std::string leading = format == ChatFormat::MistralV1 ? " " : "";
  bool in_turn = false;
  for (const auto& m : messages) {
    if (!in_turn) {
      out += leading + "[INST] ";
      in_turn = true;
    }
    if (m.role == "system") {
      out += m.content + "\n\n";
    } else if (m.role == "user") {
      out += m.content + leading + "[/INST]";
    } else {
      out += " " + m.content + "</s>";
      in_turn = false;
    }
  }
}

// Llama 3.1's template (3.2's and 3.3's write the same without builtin tools): a system
// block always, with the knowledge and today's date (llama.cpp gives templates
// date_string, "%d %b %Y"); texts trimmed; tool results ("ipython") as JSON strings.
void llama31(std::string& out, std::span<const ChatMessage> messages, const ChatOptions& options) {
  size_t first = 0;
  std::string system;
  if (!messages.empty() && messages[0].role == "system") {
    system = trim(messages[0].content);
    first = 1;
  }
  out += "<|start_header_id|>system<|end_header_id|>\n\n";
  if (options.tools) out += "Environment: ipython\n";
  out += "Cutting Knowledge Date: December 2023\nToday Date: " + today("%d %b %Y") + "\n\n" + system + "<|eot_id|>";
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const bool result = m.role == "ipython" || m.role == "tool";
    out += "<|start_header_id|>" + std::string(result ? "ipython" : m.role) + "<|end_header_id|>\n\n" +
           (result ? json_string(m.content) : trim(m.content)) + "<|eot_id|>";
  }
  if (options.add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
}

void gemma(std::string& out, std::span<const ChatMessage> messages, bool add_generation_prompt) {
  // No system turn: the system text opens the next user turn.
  std::string system;
  for (const auto& m : messages) {
    if (m.role == "system") {
      system += trim(m.content);
      continue;
    }
    const std::string role = m.role == "assistant" ? "model" : m.role;
    out += "<start_of_turn>" + role + "\n";
    if (!system.empty() && role != "model") {
      out += system + "\n\n";
      system.clear();
    }
    out += trim(m.content) + "<end_of_turn>\n";
  }
  if (add_generation_prompt) out += "<start_of_turn>model\n";
}

void alpaca(std::string& out, std::span<const ChatMessage> messages, bool add_generation_prompt) {
  for (const auto& m : messages) {
    if (m.role == "system") {
      out += m.content + "\n\n";
    } else if (m.role == "user") {
      out += "### Instruction:\n" + m.content + "\n\n";
    } else {
      out += "### Response:\n" + m.content + "\n\n";
    }
  }
  if (add_generation_prompt) out += "### Response:\n";
}

}  // namespace

std::string_view chat_format_name(ChatFormat format) {
  for (const auto& f : kFormats) {
    if (f.format == format) return f.name;
  }
  return "unknown";
}

std::optional<ChatFormat> chat_format_from_name(std::string_view name) {
  for (const auto& f : kFormats) {
    if (f.name == name) return f.format;
  }
  return std::nullopt;
}

ChatFormat detect_chat_format(std::string_view text) {
  if (auto named = chat_format_from_name(text)) return *named;
  const auto has = [text](std::string_view s) { return text.find(s) != std::string_view::npos; };
  // The order of llama.cpp's checks; the formats it knows and pico does not write
  // (phi4, smolvlm, chatglm, glmedge, falcon3, monarch, orion, openchat, vicuna,
  // deepseek, command-r, ...) are Unknown here rather than something close.
  if (has("<|im_start|>")) {
    if (has("<|im_sep|>") || has("<end_of_utterance>")) return ChatFormat::Unknown;
    // Not in llama.cpp's list (it runs these templates through its Jinja engine): the
    // Qwen thinking templates, recognised by the expressions that make them what pico
    // writes: the closed block of enable_thinking=false, and how a turn after the last
    // query carries its reasoning; Qwen3.5 also opens the block in its generation prompt.
    if (has("enable_thinking") && has("'<think>\\n\\n</think>\\n\\n'")) {
      if (has("'\\n<think>\\n' + reasoning_content + '\\n</think>\\n\\n' + content") && has("'<think>\\n'")) {
        return ChatFormat::Qwen35;
      }
      if (has("'\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n')") &&
          has("loop.last or (not loop.last and reasoning_content)")) {
        return ChatFormat::Qwen3;
      }
    }
    return ChatFormat::ChatML;
  }
  if (text.starts_with("mistral") || has("[INST]")) {
    if (has("[SYSTEM_PROMPT]")) {
      // Not in llama.cpp's list (its Jinja engine runs them): the templates whose calls
      // name the function before [ARGS]; Mistral Small 3.2's also carry [CALL_ID].
      if (has("[TOOL_CALLS]") && has("[ARGS]")) return has("[CALL_ID]") ? ChatFormat::MistralSmall32 : ChatFormat::Ministral3;
      return ChatFormat::MistralV7;
    }
    if (has("' [INST] ' + system_message") || has("[AVAILABLE_TOOLS]")) {
      if (has(" [INST]")) return ChatFormat::MistralV1;
      if (has("\"[INST]\"")) return ChatFormat::MistralV3Tekken;
      return ChatFormat::MistralV3;
    }
    if (has("content.strip()")) return ChatFormat::Llama2SysStrip;
    if (has("bos_token + '[INST]")) return ChatFormat::Llama2SysBos;
    if (has("<<SYS>>")) return ChatFormat::Llama2Sys;
    return ChatFormat::Llama2;
  }
  if (has("<|assistant|>") && has("<|end|>")) return ChatFormat::Phi3;
  if (has("[gMASK]<sop>")) return ChatFormat::Unknown;
  if (has("<|assistant|>") && has("<|user|>")) return ChatFormat::Unknown;
  if (has("<|{{ item['role'] }}|>") && has("<|begin_of_image|>")) return ChatFormat::Unknown;
  if (has("<|user|>") && has("<|endoftext|>")) return ChatFormat::Zephyr;
  if (has("bos_token + message['role']")) return ChatFormat::Unknown;
  if (has("<start_of_turn>")) return ChatFormat::Gemma;
  if (has("'\\n\\nAssistant: ' + eos_token") || has("GPT4 Correct ") || (has("USER: ") && has("ASSISTANT: ")) ||
      (has("### Instruction:") && has("<|EOT|>")) || (has("<|START_OF_TURN_TOKEN|>") && has("<|USER_TOKEN|>"))) {
    return ChatFormat::Unknown;
  }
  if (has("<|start_header_id|>") && has("<|end_header_id|>")) {
    // Not in llama.cpp's list: 3.1's system block, which 3.0's template has not.
    return has("Cutting Knowledge Date") ? ChatFormat::Llama31 : ChatFormat::Llama3;
  }
  // Not in llama.cpp: Alpaca-style instruction templates.
  if (has("### Instruction:") && has("### Response:")) return ChatFormat::Alpaca;
  return ChatFormat::Unknown;
}

ChatFormat chat_format_from_vocabulary(const Vocabulary& vocab) {
  const auto has = [&vocab](std::string_view text) { return vocab.find(text) != kNoToken; };
  if (has("<|im_start|>") && has("<|im_end|>")) return ChatFormat::ChatML;
  if (has("<|start_header_id|>") && has("<|end_header_id|>")) return ChatFormat::Llama3;
  if (has("<start_of_turn>") && has("<end_of_turn>")) return ChatFormat::Gemma;
  if (has("[SYSTEM_PROMPT]")) return ChatFormat::MistralV7;
  if (has("[INST]") && has("[/INST]")) return ChatFormat::MistralV3;
  return ChatFormat::Unknown;
}

std::optional<ThinkingTags> chat_format_thinking_tags(ChatFormat format) {
  if (format == ChatFormat::Qwen3 || format == ChatFormat::Qwen35) return ThinkingTags{"<think>", "</think>"};
  if (format == ChatFormat::Ministral3) return ThinkingTags{"[THINK]", "[/THINK]"};
  return std::nullopt;
}

ReplyStart chat_format_reply_start(ChatFormat format, const ChatOptions& options) {
  if (!chat_format_thinking_tags(format)) return ReplyStart::Content;
  if (!options.add_generation_prompt) return ReplyStart::MayThink;  // a continued turn: nothing known
  if (format == ChatFormat::Ministral3) return ReplyStart::MayThink;  // its prompt has no switch for it
  if (!options.enable_thinking) return ReplyStart::Content;         // the prompt closed an empty block
  return format == ChatFormat::Qwen35 ? ReplyStart::InsideThinking : ReplyStart::MayThink;
}

std::string apply_chat_format(ChatFormat format, std::span<const ChatMessage> messages, bool add_generation_prompt) {
  return apply_chat_format(format, messages, ChatOptions{add_generation_prompt, true});
}

std::string apply_chat_format(ChatFormat format, std::span<const ChatMessage> messages, const ChatOptions& options) {
  const bool add_generation_prompt = options.add_generation_prompt;
  std::string out;
  switch (format) {
    case ChatFormat::Qwen3:
      qwen3(out, messages, options);
      break;
    case ChatFormat::Qwen35:
      qwen35(out, messages, options);
      break;
    case ChatFormat::ChatML:
      chatml(out, messages, add_generation_prompt);
      break;
    case ChatFormat::Llama2:
    case ChatFormat::Llama2Sys:
    case ChatFormat::Llama2SysBos:
    case ChatFormat::Llama2SysStrip:
      llama2(out, format, messages);
      break;
    case ChatFormat::Llama31:
      llama31(out, messages, options);
      break;
    case ChatFormat::Llama3:
      for (const auto& m : messages) {
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + trim(m.content) + "<|eot_id|>";
      }
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      break;
    case ChatFormat::MistralV1:
    case ChatFormat::MistralV3:
    case ChatFormat::MistralV3Tekken:
    case ChatFormat::MistralV7:
    case ChatFormat::MistralV7Tekken:
    case ChatFormat::MistralSmall32:
    case ChatFormat::Ministral3:
      mistral(out, format, messages);
      break;
    case ChatFormat::Gemma:
      gemma(out, messages, add_generation_prompt);
      break;
    case ChatFormat::Zephyr:
      for (const auto& m : messages) out += "<|" + m.role + "|>\n" + m.content + "<|endoftext|>\n";
      if (add_generation_prompt) out += "<|assistant|>\n";
      break;
    case ChatFormat::Phi3:
      for (const auto& m : messages) out += "<|" + m.role + "|>\n" + m.content + "<|end|>\n";
      if (add_generation_prompt) out += "<|assistant|>\n";
      break;
    case ChatFormat::Alpaca:
      alpaca(out, messages, add_generation_prompt);
      break;
    case ChatFormat::Unknown:
      throw std::invalid_argument("no chat format to apply");
  }
  return out;
}

namespace {

// A Jinja string literal at text[i] ('...' or "...", Python's escapes): its value, i
// moved past it; nullopt when there is none.
std::optional<std::string> jinja_string(std::string_view text, size_t& i) {
  if (i >= text.size() || (text[i] != '\'' && text[i] != '"')) return std::nullopt;
  const char quote = text[i];
  std::string out;
  for (size_t j = i + 1; j < text.size(); ++j) {
    const char c = text[j];
    if (c == quote) {
      i = j + 1;
      return out;
    }
    if (c != '\\' || j + 1 == text.size()) {
      out += c;
      continue;
    }
    const char e = text[++j];
    switch (e) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case '\\': case '\'': case '"': out += e; break;
      default: out += '\\'; out += e;  // Python keeps an unknown escape as written
    }
  }
  return std::nullopt;
}

bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// The value of `{%- set name = strftime_now("format") %}` in the template: today's date.
std::optional<std::string> strftime_variable(std::string_view text, std::string_view name) {
  const std::string set = "set " + std::string(name) + " = strftime_now(";
  const size_t at = text.find(set);
  if (at == std::string_view::npos) return std::nullopt;
  size_t i = at + set.size();
  const auto format = jinja_string(text, i);
  if (!format || i >= text.size() || text[i] != ')') return std::nullopt;
  return today(format->c_str());
}

// Qwen2.5's: a whole system turn as one literal, written when a conversation has none.
std::string literal_system_turn(std::string_view text) {
  constexpr std::string_view kOpen = "<|im_start|>system\n", kClose = "<|im_end|>\n";
  for (const std::string_view quote : {"'<|im_start|>system\\n", "\"<|im_start|>system\\n"}) {
    for (size_t at = text.find(quote); at != std::string_view::npos; at = text.find(quote, at + 1)) {
      size_t i = at;
      const auto literal = jinja_string(text, i);
      if (literal && literal->size() > kOpen.size() + kClose.size() && literal->starts_with(kOpen) &&
          literal->ends_with(kClose)) {
        return literal->substr(kOpen.size(), literal->size() - kOpen.size() - kClose.size());
      }
    }
  }
  return {};
}

}  // namespace

std::string default_system_message(std::string_view text) {
  constexpr std::string_view kSet = "set default_system_message = ";
  const size_t at = text.find(kSet);
  if (at == std::string_view::npos) return literal_system_turn(text);
  std::string out;
  size_t i = at + kSet.size();
  while (true) {
    while (i < text.size() && is_space(text[i])) ++i;
    if (auto literal = jinja_string(text, i)) {
      out += *literal;
    } else if (i < text.size() && is_name_char(text[i])) {
      const size_t begin = i;
      while (i < text.size() && is_name_char(text[i])) ++i;
      const auto value = strftime_variable(text.substr(0, at), text.substr(begin, i - begin));
      if (!value) return {};
      out += *value;
    } else {
      return {};
    }
    while (i < text.size() && is_space(text[i])) ++i;
    if (i < text.size() && text[i] == '+') {
      ++i;
      continue;
    }
    return text.substr(i).starts_with("%}") || text.substr(i).starts_with("-%}") ? out : std::string();
  }
}

ChatTemplate ChatTemplate::from_text(std::string_view text) {
  const ChatFormat format = detect_chat_format(text);
  return ChatTemplate(format == ChatFormat::Unknown ? ChatFormat::ChatML : format, default_system_message(text));
}

ChatTemplate ChatTemplate::from_metadata(const gguf::Metadata& metadata, const Vocabulary* vocab,
                                         std::string_view override_name) {
  if (!override_name.empty()) {
    const ChatFormat format = detect_chat_format(override_name);
    if (format == ChatFormat::Unknown) {
      throw std::invalid_argument("unknown chat template '" + std::string(override_name) + "'");
    }
    return ChatTemplate(format, default_system_message(override_name));
  }
  if (auto text = metadata.get_string("tokenizer.chat_template")) {
    const ChatFormat format = detect_chat_format(*text);
    if (format != ChatFormat::Unknown) return ChatTemplate(format, default_system_message(*text));
  }
  if (vocab) {
    const ChatFormat format = chat_format_from_vocabulary(*vocab);
    if (format != ChatFormat::Unknown) return ChatTemplate(format);
  }
  return ChatTemplate(ChatFormat::ChatML);
}

}  // namespace pico::tokenizer
