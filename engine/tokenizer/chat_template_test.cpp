// Each format on one conversation (system, user, assistant, then the generation
// prompt); the expected strings are the formats as their model cards document them,
// and for Qwen3 / Qwen3.5 as their Jinja templates (testdata/*.jinja) write them,
// worked out by hand from the template text.
#include "tokenizer/chat_template.hpp"

#include <ctime>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

namespace pico::tokenizer {
namespace {

// A template of testdata/ (PICO_TOKENIZER_TESTDATA: its folder).
std::string template_file(const std::string& name) {
  std::ifstream in(std::string(PICO_TOKENIZER_TESTDATA) + "/" + name);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

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
  // Llama 3.1: a system block always, with today's date as llama.cpp gives it; a tool
  // result as a JSON string.
  const std::string date = [] {
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char buffer[32];
    return std::string(buffer, std::strftime(buffer, sizeof buffer, "%d %b %Y", &local));
  }();
  const std::vector<ChatMessage> with_result = {{"user", "Hello"}, {"ipython", "said \"hi\"\n"}};
  EXPECT_EQ(apply_chat_format(ChatFormat::Llama31, with_result, ChatOptions{true, true, true}),
            "<|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nCutting Knowledge Date: December 2023\n"
            "Today Date: " + date + "\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
            "<|start_header_id|>ipython<|end_header_id|>\n\n\"said \\\"hi\\\"\\n\"<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(render(ChatFormat::Llama31),
            "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: " + date +
                "\n\nYou are helpful.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(detect_chat_format("<|start_header_id|>{{ 'Cutting Knowledge Date: December 2023' }}<|end_header_id|>"),
            ChatFormat::Llama31);
}

TEST(ChatFormats, Mistral) {
  EXPECT_EQ(render(ChatFormat::MistralV1), " [INST] You are helpful.\n\nHello [/INST] Hi there</s>");
  // Mistral 7B v0.3's and Nemo's templates give the system message to the last message
  // when it is the user's, and write it nowhere otherwise.
  EXPECT_EQ(render(ChatFormat::MistralV3), "[INST] Hello[/INST] Hi there</s>");
  EXPECT_EQ(render(ChatFormat::MistralV3Tekken), "[INST]Hello[/INST]Hi there</s>");
  std::vector<ChatMessage> asking = kChat;
  asking.push_back({"user", "And you?"});
  EXPECT_EQ(apply_chat_format(ChatFormat::MistralV3, asking, true),
            "[INST] Hello[/INST] Hi there</s>[INST] You are helpful.\n\nAnd you?[/INST]");
  EXPECT_EQ(apply_chat_format(ChatFormat::MistralV3Tekken, asking, true),
            "[INST]Hello[/INST]Hi there</s>[INST]You are helpful.\n\nAnd you?[/INST]");
  EXPECT_EQ(render(ChatFormat::MistralV7),
            "[SYSTEM_PROMPT] You are helpful.[/SYSTEM_PROMPT][INST] Hello[/INST] Hi there</s>");
  EXPECT_EQ(render(ChatFormat::MistralV7Tekken),
            "[SYSTEM_PROMPT]You are helpful.[/SYSTEM_PROMPT][INST]Hello[/INST]Hi there</s>");
  EXPECT_EQ(render(ChatFormat::MistralSmall32), render(ChatFormat::MistralV7Tekken));
  // Ministral 3 writes an assistant turn's thinking before its text.
  std::vector<ChatMessage> thought = kChat;
  thought[2].reasoning_content = "Greet back.";
  EXPECT_EQ(apply_chat_format(ChatFormat::Ministral3, thought, true),
            "[SYSTEM_PROMPT]You are helpful.[/SYSTEM_PROMPT][INST]Hello[/INST][THINK]Greet back.[/THINK]Hi there</s>");
}

TEST(ChatDetect, DefaultSystemMessages) {
  // Ministral 3's and Devstral's: one literal; Mistral Small 3.2's: literals and today's date.
  EXPECT_EQ(default_system_message("{%- set default_system_message = 'First line.\\n\\nIt\\'s \"quoted\"' %}"),
            "First line.\n\nIt's \"quoted\"");
  EXPECT_EQ(default_system_message("{%- set today = strftime_now(\"%Y\") %}\n"
                                   "{%- set default_system_message = \"Year \" + today + \".\" %}"),
            "Year " + std::to_string(1900 + [] {
              const std::time_t now = std::time(nullptr);
              std::tm local{};
              localtime_r(&now, &local);
              return local.tm_year;
            }()) + ".");
  // Anything else in the expression, or no such variable: none.
  EXPECT_EQ(default_system_message("{%- set default_system_message = name | upper %}"), "");
  EXPECT_EQ(default_system_message("{%- set default_system_message = 'a' + unknown %}"), "");
  EXPECT_EQ(default_system_message("{%- set default_system_message = 'unterminated %}"), "");
  EXPECT_EQ(default_system_message("{{ messages }}"), "");
  const ChatTemplate ministral = ChatTemplate::from_text(
      "{%- set default_system_message = 'Think first.' %}[SYSTEM_PROMPT][TOOL_CALLS][ARGS][INST]");
  EXPECT_EQ(ministral.format(), ChatFormat::Ministral3);
  EXPECT_EQ(ministral.default_system(), "Think first.");
  EXPECT_EQ(ChatTemplate::from_text("[SYSTEM_PROMPT][TOOL_CALLS][CALL_ID][ARGS][INST]").format(),
            ChatFormat::MistralSmall32);
  EXPECT_EQ(ChatTemplate::from_text("{{ messages }}").format(), ChatFormat::ChatML);
  // Qwen2.5's: its own system turn written as one literal.
  EXPECT_EQ(default_system_message("{%- else %}{{- '<|im_start|>system\\nYou are Qwen.<|im_end|>\\n' }}"
                                   "{{- '<|im_start|>system\\n' + message.content }}"),
            "You are Qwen.");
  EXPECT_EQ(default_system_message("{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"), "");
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

// A thinking conversation: a system text with spaces around it, an earlier answer that
// kept its reasoning inline, a second question.
const std::vector<ChatMessage> kThinkingChat = {
    {"system", " You are helpful. \n"},
    {"user", "Hello"},
    {"assistant", "<think>\nLet me think.\n</think>\n\nHi there"},
    {"user", "And now?"},
};

TEST(ChatFormats, Qwen35) {
  // Texts trimmed; the earlier answer loses its reasoning (it comes before the last
  // query); the generation prompt opens the think block.
  const std::string history =
      "<|im_start|>system\nYou are helpful.<|im_end|>\n"
      "<|im_start|>user\nHello<|im_end|>\n"
      "<|im_start|>assistant\nHi there<|im_end|>\n"
      "<|im_start|>user\nAnd now?<|im_end|>\n";
  EXPECT_EQ(apply_chat_format(ChatFormat::Qwen35, kThinkingChat, ChatOptions{}),
            history + "<|im_start|>assistant\n<think>\n");
  EXPECT_EQ(apply_chat_format(ChatFormat::Qwen35, kThinkingChat, ChatOptions{true, false}),
            history + "<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_EQ(apply_chat_format(ChatFormat::Qwen35, kThinkingChat, ChatOptions{false, true}), history);

  // Turns after the last query keep a think block, empty or not: reasoning_content when
  // given (trimmed), else the inline one.
  const std::vector<ChatMessage> after = {
      {"user", "Q"},
      {"assistant", "A1", "  R1 \n"},
      {"assistant", "\n<think>\nR2\n\n</think>\n\nA2"},
      {"assistant", "A3"},
  };
  EXPECT_EQ(apply_chat_format(ChatFormat::Qwen35, after, false),
            "<|im_start|>user\nQ<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nR1\n</think>\n\nA1<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nR2\n</think>\n\nA2<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\nA3<|im_end|>\n");
  // A reasoning_content given wins over the tags, which then stay in the content.
  const std::vector<ChatMessage> given = {{"user", "Q"}, {"assistant", "<think>x</think>A", "R"}};
  EXPECT_EQ(apply_chat_format(ChatFormat::Qwen35, given, false),
            "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\nR\n</think>\n\n<think>x</think>A<|im_end|>\n");

  // What the template refuses.
  const std::vector<ChatMessage> no_user = {{"system", "S"}, {"assistant", "A"}};
  const std::vector<ChatMessage> late_system = {{"user", "Q"}, {"system", "S"}};
  const std::vector<ChatMessage> odd_role = {{"user", "Q"}, {"robot", "R"}};
  EXPECT_THROW(apply_chat_format(ChatFormat::Qwen35, no_user, true), std::invalid_argument);
  EXPECT_THROW(apply_chat_format(ChatFormat::Qwen35, late_system, true), std::invalid_argument);
  EXPECT_THROW(apply_chat_format(ChatFormat::Qwen35, odd_role, true), std::invalid_argument);
  EXPECT_THROW(apply_chat_format(ChatFormat::Qwen35, std::vector<ChatMessage>{}, true), std::invalid_argument);
}

TEST(ChatFormats, Qwen3) {
  // Texts as given; the earlier answer loses its reasoning; the generation prompt is
  // plain ChatML unless thinking is off.
  const std::string history =
      "<|im_start|>system\n You are helpful. \n<|im_end|>\n"
      "<|im_start|>user\nHello<|im_end|>\n"
      "<|im_start|>assistant\nHi there<|im_end|>\n"
      "<|im_start|>user\nAnd now?<|im_end|>\n";
  EXPECT_EQ(apply_chat_format(ChatFormat::Qwen3, kThinkingChat, ChatOptions{}), history + "<|im_start|>assistant\n");
  EXPECT_EQ(apply_chat_format(ChatFormat::Qwen3, kThinkingChat, ChatOptions{true, false}),
            history + "<|im_start|>assistant\n<think>\n\n</think>\n\n");

  // After the last query: the last turn always has a block, the others only with
  // reasoning; the reasoning loses its newlines on both sides, the content on the left.
  const std::vector<ChatMessage> after = {
      {"user", "Q"},
      {"assistant", "A1"},
      {"assistant", "<think>\n\nR2 \n</think>\n\nA2\n"},
      {"assistant", "\nA3", "\n R3\n"},
      {"assistant", "A4"},
  };
  EXPECT_EQ(apply_chat_format(ChatFormat::Qwen3, after, false),
            "<|im_start|>user\nQ<|im_end|>\n"
            "<|im_start|>assistant\nA1<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nR2 \n</think>\n\nA2\n<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n R3\n</think>\n\nA3<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\nA4<|im_end|>\n");
  // A second system message is a turn of its own; no user message is no error (the
  // last query is then taken to be the last message: no turn comes after it).
  const std::vector<ChatMessage> systems = {{"system", "S1"}, {"system", "S2"}, {"assistant", "A"}};
  EXPECT_EQ(apply_chat_format(ChatFormat::Qwen3, systems, true),
            "<|im_start|>system\nS1<|im_end|>\n<|im_start|>system\nS2<|im_end|>\n"
            "<|im_start|>assistant\nA<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatFormats, ThinkingTagsAndHowRepliesStart) {
  ASSERT_TRUE(chat_format_thinking_tags(ChatFormat::Qwen35));
  EXPECT_EQ(chat_format_thinking_tags(ChatFormat::Qwen35)->open, "<think>");
  EXPECT_EQ(chat_format_thinking_tags(ChatFormat::Qwen3)->close, "</think>");
  EXPECT_FALSE(chat_format_thinking_tags(ChatFormat::ChatML));
  EXPECT_EQ(chat_format_reply_start(ChatFormat::Qwen35, {}), ReplyStart::InsideThinking);
  EXPECT_EQ(chat_format_reply_start(ChatFormat::Qwen35, {true, false}), ReplyStart::Content);
  EXPECT_EQ(chat_format_reply_start(ChatFormat::Qwen3, {}), ReplyStart::MayThink);
  EXPECT_EQ(chat_format_reply_start(ChatFormat::Qwen3, {true, false}), ReplyStart::Content);
  EXPECT_EQ(chat_format_reply_start(ChatFormat::ChatML, {}), ReplyStart::Content);
  EXPECT_EQ(chat_format_reply_start(ChatFormat::Llama3, {true, false}), ReplyStart::Content);
  ASSERT_TRUE(chat_format_thinking_tags(ChatFormat::Ministral3));
  EXPECT_EQ(chat_format_thinking_tags(ChatFormat::Ministral3)->open, "[THINK]");
  EXPECT_EQ(chat_format_thinking_tags(ChatFormat::Ministral3)->close, "[/THINK]");
  EXPECT_EQ(chat_format_reply_start(ChatFormat::Ministral3, {true, false}), ReplyStart::MayThink);  // no switch in its prompt
  EXPECT_FALSE(chat_format_thinking_tags(ChatFormat::MistralSmall32));
}

TEST(ChatDetect, QwenThinkingTemplates) {
  const std::string qwen35 = template_file("Qwen3.5-4B.jinja"), qwen3 = template_file("Qwen-Qwen3-0.6B.jinja");
  ASSERT_GT(qwen35.size(), 1000u);
  ASSERT_GT(qwen3.size(), 1000u);
  EXPECT_EQ(detect_chat_format(qwen35), ChatFormat::Qwen35);
  EXPECT_EQ(detect_chat_format(qwen3), ChatFormat::Qwen3);
  EXPECT_EQ(detect_chat_format("qwen3.5"), ChatFormat::Qwen35);
  EXPECT_EQ(chat_format_name(ChatFormat::Qwen35), "qwen3.5");
  EXPECT_EQ(chat_format_name(ChatFormat::Qwen3), "qwen3");
  // MiniCPM5's template shares Qwen3's history expression but not its rule for the
  // turns after the last query (and Qwen2.5's has no thinking at all): ChatML.
  EXPECT_EQ(detect_chat_format("{%- if enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
                               "{{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + "
                               "'\\n</think>\\n\\n' + content.lstrip('\\n') }}{%- if reasoning_content %}"),
            ChatFormat::ChatML);
  EXPECT_EQ(detect_chat_format("{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] }}"), ChatFormat::ChatML);
  gguf::Metadata m;
  m.set("tokenizer.chat_template", qwen35);
  EXPECT_EQ(ChatTemplate::from_metadata(m).name(), "qwen3.5");
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
  EXPECT_EQ(detect_chat_format("[SYSTEM_PROMPT][INST][TOOL_CALLS]' + name + '[CALL_ID]' + id + '[ARGS]"),
            ChatFormat::MistralSmall32);
  EXPECT_EQ(detect_chat_format("[SYSTEM_PROMPT][INST][TOOL_CALLS]' + name + '[ARGS]"), ChatFormat::Ministral3);
  EXPECT_EQ(detect_chat_format("mistral-small-3.2"), ChatFormat::MistralSmall32);
  EXPECT_EQ(detect_chat_format("ministral-3"), ChatFormat::Ministral3);
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
