#include "tokenizer/pretokenizer.hpp"

#include <gtest/gtest.h>

#include "tokenizer/unicode.hpp"

namespace pico::tokenizer {
namespace {

// The words of `text` under `kind`, as UTF-8 strings.
std::vector<std::string> words(PreTokenizer kind, std::string_view text) {
  const std::vector<uint32_t> cps = decode_utf8_lossy(text);
  std::vector<std::string> out;
  size_t begin = 0;
  for (size_t n : pretokenize(kind, cps)) {
    out.push_back(encode_utf8(std::span<const uint32_t>(cps).subspan(begin, n)));
    begin += n;
  }
  EXPECT_EQ(begin, cps.size());
  return out;
}

using W = std::vector<std::string>;

TEST(Gpt2Split, WordsSpacesAndContractions) {
  EXPECT_EQ(words(PreTokenizer::Gpt2, "Hello world"), (W{"Hello", " world"}));
  EXPECT_EQ(words(PreTokenizer::Gpt2, "I'm here, it's 2024!"), (W{"I", "'m", " here", ",", " it", "'s", " 2024", "!"}));
  // Case-sensitive contractions: 'S is not one.
  EXPECT_EQ(words(PreTokenizer::Gpt2, "IT'S"), (W{"IT", "'", "S"}));
  // \s+(?!\S): the last space goes with the next word.
  EXPECT_EQ(words(PreTokenizer::Gpt2, "a   b"), (W{"a", "  ", " b"}));
  // Trailing whitespace stays together.
  EXPECT_EQ(words(PreTokenizer::Gpt2, "a  "), (W{"a", "  "}));
  EXPECT_EQ(words(PreTokenizer::Gpt2, "a\n\nb"), (W{"a", "\n", "\n", "b"}));
  EXPECT_EQ(words(PreTokenizer::Gpt2, " ?!x"), (W{" ?!", "x"}));
  EXPECT_EQ(words(PreTokenizer::Gpt2, "12345 678"), (W{"12345", " 678"}));
  EXPECT_TRUE(words(PreTokenizer::Gpt2, "").empty());
}

TEST(Llama3Split, DigitsInThreesAndLetterPrefix) {
  EXPECT_EQ(words(PreTokenizer::Llama3, "1234567"), (W{"123", "456", "7"}));
  EXPECT_EQ(words(PreTokenizer::Llama3, "Hello world"), (W{"Hello", " world"}));
  // [^\r\n\p{L}\p{N}]?\p{L}+ takes any one non-letter prefix, not only a space.
  EXPECT_EQ(words(PreTokenizer::Llama3, "(abc) \"def\""), (W{"(abc", ")", " \"", "def", "\""}));
  // Contractions are case-insensitive.
  EXPECT_EQ(words(PreTokenizer::Llama3, "IT'S"), (W{"IT", "'S"}));
  // \s*[\r\n]+ takes blanks up to the last newline.
  EXPECT_EQ(words(PreTokenizer::Llama3, "a  \n\n b"), (W{"a", "  \n\n", " b"}));
  // Symbols take the newlines after them.
  EXPECT_EQ(words(PreTokenizer::Llama3, "x;\n\ny"), (W{"x", ";\n\n", "y"}));
  EXPECT_EQ(words(PreTokenizer::Llama3, "a "), (W{"a", " "}));
  EXPECT_EQ(words(PreTokenizer::Llama3, " 42"), (W{" ", "42"}));
  EXPECT_EQ(words(PreTokenizer::Llama3, "\tfoo"), (W{"\tfoo"}));
}

TEST(Qwen2Split, OneDigitPerWord) {
  EXPECT_EQ(words(PreTokenizer::Qwen2, "x=1024"), (W{"x", "=", "1", "0", "2", "4"}));
  EXPECT_EQ(words(PreTokenizer::Qwen2, "你好世界"), (W{"你好世界"}));
}

TEST(Qwen35Split, MarksJoinLetters) {
  // "é" written as e + U+0301: one word with marks, split without.
  EXPECT_EQ(words(PreTokenizer::Qwen35, "e\xCC\x81t\xC3\xA9"), (W{"e\xCC\x81t\xC3\xA9"}));
  EXPECT_EQ(words(PreTokenizer::Qwen2, "e\xCC\x81t\xC3\xA9"), (W{"e", "\xCC\x81t\xC3\xA9"}));
}

TEST(DefaultSplit, PunctuationThenGpt2ThenNumbers) {
  EXPECT_EQ(words(PreTokenizer::Default, "a+=b"), (W{"a", "+=", "b"}));
  EXPECT_EQ(words(PreTokenizer::Default, "x 1234567"), (W{"x", " ", "123", "456", "7"}));
}

TEST(StarCoderSplit, EachDigitIsolated) {
  EXPECT_EQ(words(PreTokenizer::StarCoder, "v 12"), (W{"v", " ", "1", "2"}));
}

TEST(NewlineSplit, RunsOfNewlines) {
  EXPECT_EQ(words(PreTokenizer::Newlines, "a b\n\ncd\n"), (W{"a b", "\n\n", "cd", "\n"}));
}

TEST(PreTokenizerNames, MapsLlamaCppNames) {
  EXPECT_EQ(pretokenizer_for_name("llama-bpe")->kind, PreTokenizer::Llama3);
  EXPECT_TRUE(pretokenizer_for_name("llama-bpe")->ignore_merges);
  EXPECT_TRUE(pretokenizer_for_name("llama-bpe")->add_bos);
  EXPECT_EQ(pretokenizer_for_name("qwen2")->kind, PreTokenizer::Qwen2);
  EXPECT_FALSE(pretokenizer_for_name("qwen2")->clean_spaces);
  EXPECT_EQ(pretokenizer_for_name("gpt-2")->kind, PreTokenizer::Gpt2);
  EXPECT_TRUE(pretokenizer_for_name("gpt-2")->clean_spaces);
  EXPECT_EQ(pretokenizer_for_name("deepseek-r1-qwen")->kind, PreTokenizer::Qwen2);
  EXPECT_EQ(pretokenizer_for_name("smollm")->kind, PreTokenizer::StarCoder);
  EXPECT_EQ(pretokenizer_for_name("")->kind, PreTokenizer::Default);
  EXPECT_EQ(pretokenizer_for_name("default")->kind, PreTokenizer::Default);
  EXPECT_FALSE(pretokenizer_for_name("no-such-tokenizer").has_value());
}

}  // namespace
}  // namespace pico::tokenizer
