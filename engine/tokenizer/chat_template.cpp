#include "tokenizer/chat_template.hpp"

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
    {"mistral-v1", ChatFormat::MistralV1},
    {"mistral-v3", ChatFormat::MistralV3},
    {"mistral-v3-tekken", ChatFormat::MistralV3Tekken},
    {"mistral-v7", ChatFormat::MistralV7},
    {"mistral-v7-tekken", ChatFormat::MistralV7Tekken},
    {"gemma", ChatFormat::Gemma},
    {"zephyr", ChatFormat::Zephyr},
    {"phi3", ChatFormat::Phi3},
    {"alpaca", ChatFormat::Alpaca},
};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'; }

std::string trim(std::string_view s) {
  size_t begin = 0, end = s.size();
  while (begin < end && is_space(s[begin])) ++begin;
  while (end > begin && is_space(s[end - 1])) --end;
  return std::string(s.substr(begin, end - begin));
}

void chatml(std::string& out, std::span<const ChatMessage> messages, bool add_generation_prompt) {
  for (const auto& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
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
  if (format == ChatFormat::MistralV7 || format == ChatFormat::MistralV7Tekken) {
    const std::string space = format == ChatFormat::MistralV7 ? " " : "";
    for (const auto& m : messages) {
      if (m.role == "system") {
        out += "[SYSTEM_PROMPT]" + space + m.content + "[/SYSTEM_PROMPT]";
      } else if (m.role == "user") {
        out += "[INST]" + space + m.content + "[/INST]";
      } else {
        out += space + m.content + "</s>";
      }
    }
    return;
  }
  const std::string leading = format == ChatFormat::MistralV1 ? " " : "";
  const std::string trailing = format == ChatFormat::MistralV3Tekken ? "" : " ";
  const bool trim_assistant = format == ChatFormat::MistralV3;
  bool in_turn = false;
  for (const auto& m : messages) {
    if (!in_turn) {
      out += leading + "[INST]" + trailing;
      in_turn = true;
    }
    if (m.role == "system") {
      out += m.content + "\n\n";
    } else if (m.role == "user") {
      out += m.content + leading + "[/INST]";
    } else {
      out += trailing + (trim_assistant ? trim(m.content) : m.content) + "</s>";
      in_turn = false;
    }
  }
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
    return has("<|im_sep|>") || has("<end_of_utterance>") ? ChatFormat::Unknown : ChatFormat::ChatML;
  }
  if (text.starts_with("mistral") || has("[INST]")) {
    if (has("[SYSTEM_PROMPT]")) return ChatFormat::MistralV7;
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
  if (has("<|start_header_id|>") && has("<|end_header_id|>")) return ChatFormat::Llama3;
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

std::string apply_chat_format(ChatFormat format, std::span<const ChatMessage> messages, bool add_generation_prompt) {
  std::string out;
  switch (format) {
    case ChatFormat::ChatML:
      chatml(out, messages, add_generation_prompt);
      break;
    case ChatFormat::Llama2:
    case ChatFormat::Llama2Sys:
    case ChatFormat::Llama2SysBos:
    case ChatFormat::Llama2SysStrip:
      llama2(out, format, messages);
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

ChatTemplate ChatTemplate::from_metadata(const gguf::Metadata& metadata, const Vocabulary* vocab,
                                         std::string_view override_name) {
  if (!override_name.empty()) {
    const ChatFormat format = detect_chat_format(override_name);
    if (format == ChatFormat::Unknown) {
      throw std::invalid_argument("unknown chat template '" + std::string(override_name) + "'");
    }
    return ChatTemplate(format);
  }
  if (auto text = metadata.get_string("tokenizer.chat_template")) {
    const ChatFormat format = detect_chat_format(*text);
    if (format != ChatFormat::Unknown) return ChatTemplate(format);
  }
  if (vocab) {
    const ChatFormat format = chat_format_from_vocabulary(*vocab);
    if (format != ChatFormat::Unknown) return ChatTemplate(format);
  }
  return ChatTemplate(ChatFormat::ChatML);
}

}  // namespace pico::tokenizer
