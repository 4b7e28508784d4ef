// The reasoning splitter: whole replies (expected values written from llama.cpp's
// tests/test-chat.cpp cases and the rules in reasoning.hpp), then the same replies fed
// in every split into two pieces and character by character, which must give the same
// result and never send anything it later takes back.
#include "http/reasoning.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace pico::coordinator::http_api {
namespace {

struct Case {
  const char* what;
  bool starts_inside;
  std::string reply;
  std::string reasoning, content;  // expected
  bool inline_reasoning = false;
};

const std::vector<Case> kCases = {
    // Qwen3.5: the prompt opened the block (llama.cpp's message_assist_thoughts).
    {"forced open", true, "I'm\nthinking\n</think>\n\nHello, world!\nWhat's up?", "I'm\nthinking",
     "Hello, world!\nWhat's up?"},
    {"forced open, never closed", true, "\nstill thinking \n", "still thinking", ""},
    {"forced open, empty block", true, "\n\n</think>\n\nHi", "", "Hi"},
    {"forced open, a partial tag at the end", true, "R</thi", "R</thi", ""},
    {"forced open, a tag-like text inside", true, "a </b> and </thin k></think>C", "a </b> and </thin k>", "C"},
    {"forced open, a second block is content", true, "R</think>C <think>x</think> D", "R", "C <think>x</think> D"},
    {"forced open, content's trailing whitespace stays", true, "R</think>  C \n", "R", "C \n"},
    // Qwen3: the reply opens the block itself, or does not.
    {"opened by the reply", false, "<think>\nR1\nR2\n</think>\n\nAnswer", "R1\nR2", "Answer"},
    {"opened after whitespace", false, "\n <think>R</think>A", "R", "A"},
    {"empty block", false, "<think>\n\n</think>\n\nHello", "", "Hello"},
    {"no block", false, "Hello <think>x</think>", "", "Hello <think>x</think>"},
    {"no block, a tag-like start", false, "<thing>", "", "<thing>"},
    {"no block, whitespace first", false, "\n\nHi", "", "\n\nHi"},
    {"only the start of a tag", false, "<thi", "", "<thi"},
    {"opened, never closed", false, "<think>abc", "abc", ""},
    {"empty reply", false, "", "", ""},
    {"empty reply, forced open", true, "", "", ""},
    // deepseek-legacy streamed: the reasoning stays in the content between the tags.
    {"inline, forced open", true, "\nR\n</think>\n\nC", "", "<think>R</think>C", true},
    {"inline, opened by the reply", false, "<think>R</think> C", "", "<think>R</think>C", true},
    {"inline, empty block", true, "\n</think>\n\nC", "", "C", true},
    {"inline, never closed", true, "R ", "", "<think>R</think>", true},
};

ReasoningSplitter splitter(const Case& c) {
  return ReasoningSplitter("<think>", "</think>", c.starts_inside, c.inline_reasoning);
}

// Feeds the pieces; checks that what has been sent is, at every point, a prefix of the
// expected result.
void feed_pieces(const Case& c, const std::vector<std::string>& pieces, const std::string& how) {
  ReasoningSplitter split = splitter(c);
  std::string reasoning, content;
  for (const auto& piece : pieces) {
    const auto d = split.feed(piece);
    reasoning += d.reasoning;
    content += d.content;
    ASSERT_TRUE(c.reasoning.starts_with(reasoning)) << c.what << ", " << how << ": sent reasoning [" << reasoning << "]";
    ASSERT_TRUE(c.content.starts_with(content)) << c.what << ", " << how << ": sent content [" << content << "]";
  }
  const auto rest = split.finish();
  EXPECT_EQ(reasoning + rest.reasoning, c.reasoning) << c.what << ", " << how;
  EXPECT_EQ(content + rest.content, c.content) << c.what << ", " << how;
}

TEST(ReasoningSplitter, WholeReplies) {
  for (const Case& c : kCases) feed_pieces(c, {c.reply}, "whole");
}

TEST(ReasoningSplitter, EverySplitInTwoPieces) {
  for (const Case& c : kCases) {
    for (size_t at = 0; at <= c.reply.size(); ++at) {
      feed_pieces(c, {c.reply.substr(0, at), c.reply.substr(at)}, "split at " + std::to_string(at));
    }
  }
}

TEST(ReasoningSplitter, CharacterByCharacter) {
  for (const Case& c : kCases) {
    std::vector<std::string> pieces;
    for (char ch : c.reply) pieces.emplace_back(1, ch);
    feed_pieces(c, pieces, "by character");
  }
}

TEST(ReasoningSplitter, HoldsBackOnlyWhatMayChange) {
  ReasoningSplitter split("<think>", "</think>", true);
  auto d = split.feed("Let me");
  EXPECT_EQ(d.reasoning, "Let me");
  d = split.feed(" see  ");  // the trailing spaces may end the block
  EXPECT_EQ(d.reasoning, " see");
  d = split.feed("now</th");  // "</th" may begin the closing tag
  EXPECT_EQ(d.reasoning, "  now");
  EXPECT_TRUE(d.content.empty());
  d = split.feed("ink>\n\n");  // closed; the content's leading whitespace goes
  EXPECT_TRUE(d.empty());
  d = split.feed("Hi");
  EXPECT_EQ(d.content, "Hi");
  EXPECT_TRUE(d.reasoning.empty());
  EXPECT_TRUE(split.finish().empty());

  ReasoningSplitter start("<think>", "</think>", false);
  EXPECT_TRUE(start.feed("<th").empty());  // may open the block
  d = start.feed("e");                     // "<the": it does not
  EXPECT_EQ(d.content, "<the");
}

TEST(ReasoningSplitter, ContentOnly) {
  ReasoningSplitter plain;
  EXPECT_EQ(plain.feed("<think>x</think>").content, "<think>x</think>");
  EXPECT_TRUE(plain.finish().empty());

  ReplyReasoning reply;
  reply.open_tag = "<think>";
  reply.close_tag = "</think>";
  reply.starts_inside = true;
  EXPECT_TRUE(reply.separates());
  EXPECT_EQ(ReasoningSplitter::for_reply(reply, false).feed("R</think>C").reasoning, "R");
  EXPECT_EQ(ReasoningSplitter::for_reply(reply, true).feed("R</think>C").reasoning, "R");
  reply.format = ReasoningFormat::DeepseekLegacy;  // inline when streamed only
  EXPECT_EQ(ReasoningSplitter::for_reply(reply, false).feed("R</think>C").reasoning, "R");
  EXPECT_EQ(ReasoningSplitter::for_reply(reply, true).feed("R</think>C").content, "<think>R</think>C");
  reply.format = ReasoningFormat::None;  // the tags stay in the content
  EXPECT_FALSE(reply.separates());
  EXPECT_EQ(ReasoningSplitter::for_reply(reply, false).feed("R</think>C").content, "R</think>C");
  ReplyReasoning no_tags;  // a format that does not think
  EXPECT_FALSE(no_tags.separates());
  EXPECT_EQ(ReasoningSplitter::for_reply(no_tags, true).feed("<think>R</think>C").content, "<think>R</think>C");
}

TEST(ReasoningFormats, Names) {
  EXPECT_EQ(reasoning_format_from_name("none"), ReasoningFormat::None);
  EXPECT_EQ(reasoning_format_from_name("auto"), ReasoningFormat::Auto);
  EXPECT_EQ(reasoning_format_from_name("deepseek"), ReasoningFormat::Deepseek);
  EXPECT_EQ(reasoning_format_from_name("deepseek-legacy"), ReasoningFormat::DeepseekLegacy);
  EXPECT_FALSE(reasoning_format_from_name("DeepSeek"));
  EXPECT_FALSE(reasoning_format_from_name(""));
  EXPECT_EQ(reasoning_format_name(ReasoningFormat::DeepseekLegacy), "deepseek-legacy");
}

}  // namespace
}  // namespace pico::coordinator::http_api
