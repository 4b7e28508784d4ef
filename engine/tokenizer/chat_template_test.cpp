// Each format on one conversation (system, user, assistant, then the generation
// prompt); the expected strings are the formats as their model cards document them.
#include "tokenizer/chat_template.hpp"

#include <gtest/gtest.h>

namespace pico::tokenizer {
namespace {

const std::vector<ChatMessage> kChat = {
    {"system", "You are helpful."},
    {"user", "Hello"},
    {"assistant", "Hi there"},
};

std::string render(ChatFormat format, bool add_generation_prompt = true) {
  return apply_chat_format(format, kChat, add_generation_prompt);
}

TEST(ChatFormats, ChatML) {
  EXPECT_EQ(render(ChatFormat::ChatML),
            "<|im_start|>system\nYou are helpful.<|im_end|>\n"
            "<|im_start|>user\nHello<|im_end|>\n"
            "<|im_start|>assistant\nHi there<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(render(ChatFormat::ChatML, false),
            "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
            "<|im_start|>assistant\nHi there<|im_end|>\n");
}

TEST(ChatFormats, Llama2) {
  EXPECT_EQ(render(ChatFormat::Llama2), "[INST] You are helpful.\nHello [/INST]Hi there</s>");
  EXPECT_EQ(render(ChatFormat::Llama2Sys), "[INST] <<SYS>>\nYou are helpful.\n<</SYS>>\n\nHello [/INST]Hi there</s>");
  // A second turn: [INST] again, with <s> in the -bos variant.
  std::vector<ChatMessage> two = kChat;
  two.push_back({"user", "  Again  "});
  EXPECT_EQ(apply_chat_format(ChatFormat::Llama2SysBos, two, true),
            "[INST] <<SYS>>\nYou are helpful.\n<</SYS>>\n\nHello [/INST]Hi there</s><s>[INST]   Again   [/INST]");
  EXPECT_EQ(apply_chat_format(ChatFormat::Llama2SysStrip, two, true),
            "[INST] <<SYS>>\nYou are helpful.\n<</SYS>>\n\nHello [/INST]Hi there</s>[INST] Again [/INST]");
}

TEST(ChatFormats, Llama3) {
  EXPECT_EQ(render(ChatFormat::Llama3),
            "<|start_header_id|>system<|end_header_id|>\n\nYou are helpful.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatFormats, Mistral) {
  EXPECT_EQ(render(ChatFormat::MistralV1), " [INST] You are helpful.\n\nHello [/INST] Hi there</s>");
  EXPECT_EQ(render(ChatFormat::MistralV3), "[INST] You are helpful.\n\nHello[/INST] Hi there</s>");
  EXPECT_EQ(render(ChatFormat::MistralV3Tekken), "[INST]You are helpful.\n\nHello[/INST]Hi there</s>");
  EXPECT_EQ(render(ChatFormat::MistralV7),
            "[SYSTEM_PROMPT] You are helpful.[/SYSTEM_PROMPT][INST] Hello[/INST] Hi there</s>");
  EXPECT_EQ(render(ChatFormat::MistralV7Tekken),
            "[SYSTEM_PROMPT]You are helpful.[/SYSTEM_PROMPT][INST]Hello[/INST]Hi there</s>");
}

TEST(ChatFormats, Gemma) {
  // No system role: its text opens the first user turn; the assistant is "model".
  EXPECT_EQ(render(ChatFormat::Gemma),
            "<start_of_turn>user\nYou are helpful.\n\nHello<end_of_turn>\n"
            "<start_of_turn>model\nHi there<end_of_turn>\n"
            "<start_of_turn>model\n");
}

TEST(ChatFormats, ZephyrPhi3Alpaca) {
  EXPECT_EQ(render(ChatFormat::Zephyr),
            "<|system|>\nYou are helpful.<|endoftext|>\n<|user|>\nHello<|endoftext|>\n"
            "<|assistant|>\nHi there<|endoftext|>\n<|assistant|>\n");
  EXPECT_EQ(render(ChatFormat::Phi3),
            "<|system|>\nYou are helpful.<|end|>\n<|user|>\nHello<|end|>\n<|assistant|>\nHi there<|end|>\n"
            "<|assistant|>\n");
  EXPECT_EQ(render(ChatFormat::Alpaca),
            "You are helpful.\n\n### Instruction:\nHello\n\n### Response:\nHi there\n\n### Response:\n");
  EXPECT_THROW(render(ChatFormat::Unknown), std::invalid_argument);
}

TEST(ChatDetect, FromTemplateText) {
  EXPECT_EQ(detect_chat_format("chatml"), ChatFormat::ChatML);
  EXPECT_EQ(detect_chat_format("mistral-v7-tekken"), ChatFormat::MistralV7Tekken);
  // Fragments of the models' Jinja templates.
  EXPECT_EQ(detect_chat_format("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
                               "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"),
            ChatFormat::ChatML);
  EXPECT_EQ(detect_chat_format("{{ '<|im_start|>' }}{{ '<|im_sep|>' }}"), ChatFormat::Unknown);  // phi4
  EXPECT_EQ(detect_chat_format("{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}<<SYS>>"),
            ChatFormat::Llama2SysStrip);
  EXPECT_EQ(detect_chat_format("{{ bos_token + '[INST] ' + content + ' [/INST]' }}<<SYS>>"), ChatFormat::Llama2SysBos);
  EXPECT_EQ(detect_chat_format("{{ '[INST] <<SYS>>\\n' + system }}"), ChatFormat::Llama2Sys);
  EXPECT_EQ(detect_chat_format("{{ '[INST] ' + content + ' [/INST]' }}"), ChatFormat::Llama2);
  EXPECT_EQ(detect_chat_format("{{ bos_token }}{{ ' [INST] ' + system_message }}"), ChatFormat::MistralV1);
  EXPECT_EQ(detect_chat_format("[AVAILABLE_TOOLS] {{ '[INST] ' + content }}"), ChatFormat::MistralV3);
  EXPECT_EQ(detect_chat_format("[AVAILABLE_TOOLS] {{ \"[INST]\" + content }}"), ChatFormat::MistralV3Tekken);
  EXPECT_EQ(detect_chat_format("[SYSTEM_PROMPT]{{ x }}[INST]"), ChatFormat::MistralV7);
  EXPECT_EQ(detect_chat_format("{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"),
            ChatFormat::Llama3);
  EXPECT_EQ(detect_chat_format("{{ '<start_of_turn>' + role + '\\n' }}"), ChatFormat::Gemma);
  EXPECT_EQ(detect_chat_format("<|user|>\n{{ x }}<|endoftext|>"), ChatFormat::Zephyr);
  EXPECT_EQ(detect_chat_format("<|user|>{{ x }}<|end|><|assistant|>"), ChatFormat::Phi3);
  EXPECT_EQ(detect_chat_format("### Instruction:\n{{ x }}\n\n### Response:\n"), ChatFormat::Alpaca);
  EXPECT_EQ(detect_chat_format("### Instruction:\n{{ x }}<|EOT|>### Response:"), ChatFormat::Unknown);  // deepseek
  EXPECT_EQ(detect_chat_format("{{ messages }}"), ChatFormat::Unknown);
}

TEST(ChatDetect, FromMetadataAndOverride) {
  gguf::Metadata m;
  EXPECT_EQ(ChatTemplate::from_metadata(m).format(), ChatFormat::ChatML);  // nothing known: ChatML
  m.set("tokenizer.chat_template", "{{ '<start_of_turn>user\\n' }}");
  EXPECT_EQ(ChatTemplate::from_metadata(m).format(), ChatFormat::Gemma);
  EXPECT_EQ(ChatTemplate::from_metadata(m, nullptr, "llama3").format(), ChatFormat::Llama3);
  EXPECT_EQ(ChatTemplate::from_metadata(m, nullptr, "llama3").name(), "llama3");
  EXPECT_THROW(ChatTemplate::from_metadata(m, nullptr, "no-such-format"), std::invalid_argument);
}

TEST(ChatDetect, FromVocabulary) {
  gguf::Metadata m;
  m.set("tokenizer.ggml.model", "gpt2");
  m.set("tokenizer.ggml.pre", "qwen2");
  m.set("tokenizer.ggml.tokens", gguf::string_array({"a", "b", "<|im_start|>", "<|im_end|>"}));
  m.set("tokenizer.ggml.merges", gguf::string_array({"a b"}));
  const Vocabulary vocab = Vocabulary::from_metadata(m);
  EXPECT_EQ(chat_format_from_vocabulary(vocab), ChatFormat::ChatML);
  EXPECT_EQ(ChatTemplate::from_metadata(m, &vocab).format(), ChatFormat::ChatML);
  m.set("tokenizer.ggml.tokens", gguf::string_array({"a", "b", "<start_of_turn>", "<end_of_turn>"}));
  const Vocabulary gemma = Vocabulary::from_metadata(m);
  EXPECT_EQ(ChatTemplate::from_metadata(m, &gemma).format(), ChatFormat::Gemma);
}

}  // namespace
}  // namespace pico::tokenizer
