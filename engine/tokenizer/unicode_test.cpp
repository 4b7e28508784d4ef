#include "tokenizer/unicode.hpp"

#include <gtest/gtest.h>

namespace pico::tokenizer {
namespace {

std::vector<uint32_t> cps(std::string_view s) { return decode_utf8_lossy(s); }

TEST(Utf8, DecodesEachLength) {
  EXPECT_EQ(cps("a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80"), (std::vector<uint32_t>{'a', 0xE9, 0x20AC, 0x1F600}));
  EXPECT_TRUE(cps("").empty());
}

TEST(Utf8, InvalidBytesBecomeReplacementOneByteAtATime) {
  // A stray continuation byte, a lead byte without its continuation, and F8..FF.
  EXPECT_EQ(cps("\x80"), (std::vector<uint32_t>{0xFFFD}));
  EXPECT_EQ(cps("\xC3" "a"), (std::vector<uint32_t>{0xFFFD, 'a'}));
  EXPECT_EQ(cps("\xE2\x82" "a"), (std::vector<uint32_t>{0xFFFD, 0xFFFD, 'a'}));
  EXPECT_EQ(cps("\xFF\xFE"), (std::vector<uint32_t>{0xFFFD, 0xFFFD}));
  // Truncated at the end of the text.
  EXPECT_EQ(cps("a\xF0\x9F\x98"), (std::vector<uint32_t>{'a', 0xFFFD, 0xFFFD, 0xFFFD}));
}

TEST(Utf8, OverlongAndSurrogatesDecodeAsLlamaCppDoes) {
  EXPECT_EQ(cps("\xC0\x80"), (std::vector<uint32_t>{0}));
  EXPECT_EQ(cps("\xED\xA0\x80"), (std::vector<uint32_t>{0xD800}));
  // Above U+10FFFF: replacement for each byte.
  EXPECT_EQ(cps("\xF4\x90\x80\x80"), (std::vector<uint32_t>{0xFFFD, 0xFFFD, 0xFFFD, 0xFFFD}));
}

TEST(Utf8, EncodeRoundTrips) {
  for (uint32_t cp : {0x0u, 0x41u, 0x7Fu, 0x80u, 0x7FFu, 0x800u, 0xFFFFu, 0x10000u, 0x10FFFFu}) {
    const std::string s = encode_utf8(cp);
    EXPECT_EQ(cps(s), std::vector<uint32_t>{cp}) << cp;
  }
  EXPECT_THROW(encode_utf8(0x110000u), std::invalid_argument);
  EXPECT_EQ(encode_utf8(std::vector<uint32_t>{'h', 0xE9}), "h\xC3\xA9");
}

TEST(Utf8, SequenceLengthFromLeadByte) {
  EXPECT_EQ(utf8_sequence_length('a'), 1u);
  EXPECT_EQ(utf8_sequence_length(0x80), 1u);  // continuation: one byte
  EXPECT_EQ(utf8_sequence_length(0xC3), 2u);
  EXPECT_EQ(utf8_sequence_length(0xE2), 3u);
  EXPECT_EQ(utf8_sequence_length(0xF0), 4u);
  EXPECT_EQ(utf8_sequence_length(0xFF), 4u);
}

TEST(Utf8, IncompleteSuffix) {
  EXPECT_EQ(utf8_incomplete_suffix(""), 0u);
  EXPECT_EQ(utf8_incomplete_suffix("abc"), 0u);
  EXPECT_EQ(utf8_incomplete_suffix("a\xC3"), 1u);
  EXPECT_EQ(utf8_incomplete_suffix("a\xC3\xA9"), 0u);
  EXPECT_EQ(utf8_incomplete_suffix("\xE2\x82"), 2u);
  EXPECT_EQ(utf8_incomplete_suffix("\xF0\x9F\x98"), 3u);
  EXPECT_EQ(utf8_incomplete_suffix("\xF0\x9F\x98\x80"), 0u);
  EXPECT_EQ(utf8_incomplete_suffix("\x80\x80\x80\x80"), 0u);  // no lead byte: nothing to wait for
}

TEST(UnicodeFlags, Categories) {
  EXPECT_TRUE(codepoint_flags('a').letter());
  EXPECT_TRUE(codepoint_flags(0x4E2D).letter());   // 中
  EXPECT_TRUE(codepoint_flags(0x0416).letter());   // Ж
  EXPECT_TRUE(codepoint_flags('7').number());
  EXPECT_TRUE(codepoint_flags(0x0663).number());   // Arabic-Indic three
  EXPECT_TRUE(codepoint_flags(0x00BD).number());   // ½ (No)
  EXPECT_TRUE(codepoint_flags(0x2167).number());   // Ⅷ (Nl)
  EXPECT_TRUE(codepoint_flags('!').punctuation());
  EXPECT_TRUE(codepoint_flags(0x3002).punctuation());  // 。
  EXPECT_TRUE(codepoint_flags('$').symbol());
  EXPECT_TRUE(codepoint_flags('`').symbol());
  EXPECT_TRUE(codepoint_flags(0x1F600).symbol());  // 😀
  EXPECT_TRUE(codepoint_flags(0x0301).mark());     // combining acute
  EXPECT_TRUE(codepoint_flags(0x093F).mark());     // Devanagari vowel sign I (Mc)
  EXPECT_FALSE(codepoint_flags(0x0301).letter());
  EXPECT_EQ(codepoint_flags(0x0378).bits, kUnassigned);
  EXPECT_EQ(codepoint_flags(0x10FFFF).bits, kUnassigned);
  EXPECT_EQ(codepoint_flags(0x110000).bits, kUnassigned);
  EXPECT_EQ(codepoint_flags(0xE000).bits, kControl);  // private use
  EXPECT_EQ(codepoint_flags(0x200D).bits, kControl);  // ZWJ (Cf)
  // Unicode 15.1 additions.
  EXPECT_TRUE(codepoint_flags(0x2EBF0).letter());
  EXPECT_TRUE(codepoint_flags(0x31EF).symbol());
}

TEST(UnicodeFlags, Whitespace) {
  for (uint32_t cp : {0x09u, 0x0Au, 0x0Bu, 0x0Cu, 0x0Du, 0x20u, 0x85u, 0xA0u, 0x1680u, 0x2000u, 0x200Au, 0x2028u,
                      0x2029u, 0x202Fu, 0x205Fu, 0x3000u}) {
    EXPECT_TRUE(codepoint_flags(cp).whitespace()) << std::hex << cp;
  }
  for (uint32_t cp : {0x08u, 0x0Eu, 0x200Bu, 0xFEFFu, 0x61u}) EXPECT_FALSE(codepoint_flags(cp).whitespace()) << cp;
  EXPECT_TRUE(codepoint_flags(' ').bits & kSeparator);
  EXPECT_TRUE(codepoint_flags('\n').bits & kControl);
}

TEST(ByteLevel, Gpt2Mapping) {
  EXPECT_EQ(byte_to_codepoint('!'), uint32_t{'!'});
  EXPECT_EQ(byte_to_codepoint(' '), 0x120u);   // Ġ
  EXPECT_EQ(byte_to_codepoint('\n'), 0x10Au);  // Ċ
  EXPECT_EQ(byte_to_codepoint(0), 0x100u);
  EXPECT_EQ(byte_to_codepoint(0xAD), 0x143u);
  EXPECT_EQ(byte_to_codepoint(0xE9), 0xE9u);
  EXPECT_EQ(byte_to_utf8(' '), "\xC4\xA0");
  for (int b = 0; b < 256; ++b) EXPECT_EQ(codepoint_to_byte(byte_to_codepoint(static_cast<uint8_t>(b))), b);
  EXPECT_EQ(codepoint_to_byte(0x144), -1);
  EXPECT_EQ(codepoint_to_byte(0x4E2D), -1);
}

}  // namespace
}  // namespace pico::tokenizer
