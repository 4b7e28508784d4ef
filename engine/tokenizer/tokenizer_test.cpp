// Tokenizers on tiny hand-made vocabularies; the expected ids are worked out by hand in
// the comments.
#include "tokenizer/tokenizer.hpp"

#include <gtest/gtest.h>

namespace pico::tokenizer {
namespace {

using Ids = std::vector<int32_t>;

struct TokenSpec {
  std::string text;
  float score = 0.0f;
  TokenType type = TokenType::Normal;
};

gguf::Metadata make_metadata(const std::string& model, const std::string& pre, const std::vector<TokenSpec>& tokens,
                             const std::vector<std::string>& merges = {}) {
  gguf::Metadata m;
  m.set("tokenizer.ggml.model", model);
  if (!pre.empty()) m.set("tokenizer.ggml.pre", pre);
  std::vector<std::string> texts;
  std::vector<gguf::Value> scores, types;
  for (const auto& t : tokens) {
    texts.push_back(t.text);
    scores.emplace_back(t.score);
    types.emplace_back(static_cast<int32_t>(t.type));
  }
  m.set("tokenizer.ggml.tokens", gguf::string_array(texts));
  m.set("tokenizer.ggml.scores", gguf::make_array(gguf::ValueType::Float32, scores));
  m.set("tokenizer.ggml.token_type", gguf::make_array(gguf::ValueType::Int32, types));
  if (!merges.empty()) m.set("tokenizer.ggml.merges", gguf::string_array(merges));
  return m;
}

// SPM: 0 <unk>, 1 <s>, 2 </s>, 3..258 the bytes <0x00>..<0xFF> (byte b is 3 + b), then
// pieces with scores.
std::vector<TokenSpec> spm_tokens() {
  std::vector<TokenSpec> t = {{"<unk>", 0, TokenType::Unknown}, {"<s>", 0, TokenType::Control}, {"</s>", 0, TokenType::Control}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    t.push_back({name, 0, TokenType::Byte});
  }
  const std::vector<TokenSpec> pieces = {
      {"\xE2\x96\x81", -10},              // 259 ▁
      {"h", -10},                         // 260
      {"e", -10},                         // 261
      {"l", -10},                         // 262
      {"o", -10},                         // 263
      {"ll", -1},                         // 264
      {"he", -2},                         // 265
      {"\xE2\x96\x81he", -3},             // 266 ▁he
      {"llo", -4},                        // 267
      {"\xE2\x96\x81hello", -5},          // 268 ▁hello
      {"bcd", 0, TokenType::UserDefined},  // 269
      {"ab", 0, TokenType::UserDefined},   // 270
  };
  t.insert(t.end(), pieces.begin(), pieces.end());
  return t;
}

constexpr int32_t kByte0 = 3;

TEST(SpmTokenizer, MergesByScore) {
  Tokenizer tok(Vocabulary::from_metadata(make_metadata("llama", "default", spm_tokens())));
  // "▁hello": ll(-1) first, then he(-2) -> ▁he(-3), llo(-4), ▁hello(-5).
  EXPECT_EQ(tok.encode("hello", false, false), (Ids{268}));
  // add_bos defaults to true for SPM.
  EXPECT_EQ(tok.encode("hello", true, false), (Ids{1, 268}));
  // "▁hel": ▁he + l.
  EXPECT_EQ(tok.encode("hel", false, false), (Ids{266, 262}));
  EXPECT_TRUE(tok.encode("", false, false).empty());
  EXPECT_EQ(tok.encode("", true, false), (Ids{1}));
}

TEST(SpmTokenizer, HigherScoreWinsOverLongerToken) {
  auto tokens = spm_tokens();
  tokens.push_back({"el", -0.5f});  // 271: beats ll, so ll never forms
  Tokenizer tok(Vocabulary::from_metadata(make_metadata("llama", "", tokens)));
  // ▁ h e l l o -> ▁ h [el] l o; then nothing merges (▁h, hel, ell, lo are no tokens).
  EXPECT_EQ(tok.encode("hello", false, false), (Ids{259, 260, 271, 262, 263}));
}

TEST(SpmTokenizer, ByteFallback) {
  Tokenizer tok(Vocabulary::from_metadata(make_metadata("llama", "", spm_tokens())));
  EXPECT_EQ(tok.encode("hi", false, false), (Ids{259, 260, kByte0 + 'i'}));
  EXPECT_EQ(tok.encode("\xC3\xA9", false, false), (Ids{259, kByte0 + 0xC3, kByte0 + 0xA9}));
  // A space inside the text is U+2581 too; newline is a byte.
  EXPECT_EQ(tok.encode("hello hello\n", false, false), (Ids{268, 268, kByte0 + '\n'}));
}

TEST(SpmTokenizer, SpecialTokens) {
  Tokenizer tok(Vocabulary::from_metadata(make_metadata("llama", "", spm_tokens())));
  // Parsed: <s>, then "hello" gets the space prefix as text after a special token.
  EXPECT_EQ(tok.encode("<s>hello", false, true), (Ids{1, 268}));
  // Not parsed: "▁<s>hello" -> ▁ < s > he llo.
  EXPECT_EQ(tok.encode("<s>hello", false, false),
            (Ids{259, kByte0 + '<', kByte0 + 's', kByte0 + '>', 265, 267}));
  // User-defined tokens always match, the longest first: "bcd" before "ab".
  EXPECT_EQ(tok.encode("abcd", false, false), (Ids{259, kByte0 + 'a', 269}));
}

TEST(SpmTokenizer, Phi3StripsSpacesAfterSpecialTokens) {
  auto metadata = make_metadata("llama", "", spm_tokens());
  Tokenizer plain(Vocabulary::from_metadata(metadata));
  // " " prefix + "  hello" -> ▁▁▁hello.
  EXPECT_EQ(plain.encode("</s>  hello", false, true), (Ids{2, 259, 259, 268}));
  metadata.set("general.name", "Phi-3-mini");
  Tokenizer phi3(Vocabulary::from_metadata(metadata));
  EXPECT_EQ(phi3.encode("</s>  hello", false, true), (Ids{2, 268}));
}

TEST(SpmTokenizer, Decode) {
  Tokenizer tok(Vocabulary::from_metadata(make_metadata("llama", "", spm_tokens())));
  EXPECT_EQ(tok.decode(Ids{268}), "hello");  // the first token's prefix space is dropped
  EXPECT_EQ(tok.decode(Ids{268, 268}), "hello hello");
  // After BOS (which takes the drop) the space stays, as in llama.cpp.
  EXPECT_EQ(tok.decode(Ids{1, 268}), " hello");
  EXPECT_EQ(tok.decode(Ids{1, 268, 2}, true), "<s> hello</s>");
  EXPECT_EQ(tok.decode(Ids{259, kByte0 + 0xC3, kByte0 + 0xA9}), "\xC3\xA9");
  EXPECT_EQ(tok.piece(268), " hello");
  EXPECT_EQ(tok.piece(1), "");
  EXPECT_EQ(tok.piece(1, true), "<s>");
  EXPECT_EQ(tok.piece(kByte0 + '\n'), "\n");
  EXPECT_EQ(tok.piece(269), "bcd");
}

TEST(SpmTokenizer, VocabularyDefaults) {
  Tokenizer tok(Vocabulary::from_metadata(make_metadata("llama", "", spm_tokens())));
  EXPECT_EQ(tok.bos(), 1);
  EXPECT_EQ(tok.eos(), 2);
  EXPECT_TRUE(tok.is_eog(2));   // </s> is EOS
  EXPECT_FALSE(tok.is_eog(1));
  EXPECT_TRUE(tok.add_bos());
  EXPECT_EQ(tok.vocab().special().unk, 0);
  EXPECT_EQ(tok.vocab().special().newline, kByte0 + '\n');
  EXPECT_EQ(tok.vocab_size(), 271u);
}

// Byte-level BPE: "Ġ" is the space byte.
std::vector<TokenSpec> bpe_tokens() {
  return {
      {"<|endoftext|>", 0, TokenType::Control},  // 0
      {"h"}, {"e"}, {"l"}, {"o"},                // 1-4
      {"\xC4\xA0"},                              // 5 Ġ
      {"w"}, {"r"}, {"d"},                       // 6-8
      {"ll"}, {"he"}, {"hell"}, {"hello"},       // 9-12
      {"\xC4\xA0w"}, {"or"}, {"\xC4\xA0wor"},    // 13-15
      {"\xC4\xA0worl"}, {"\xC4\xA0world"},       // 16-17
      {"!"},                                     // 18
      {"\xC4\x8A"},                              // 19 Ċ (newline)
      {"\xC4\xA0wo"},                            // 20: no merge makes it
      {"\xC3\x83"}, {"\xC2\xA9"},                // 21 Ã (byte C3), 22 © (byte A9)
      {"<tool>", 0, TokenType::UserDefined},     // 23
  };
}

std::vector<std::string> bpe_merges() {
  return {"l l", "h e", "he ll", "hell o", "\xC4\xA0 w", "o r", "\xC4\xA0w or", "\xC4\xA0wor l", "\xC4\xA0worl d"};
}

gguf::Metadata bpe_metadata(const std::string& pre) {
  auto m = make_metadata("gpt2", pre, bpe_tokens(), bpe_merges());
  m.set("tokenizer.ggml.bos_token_id", uint32_t{0});
  m.set("tokenizer.ggml.eos_token_id", uint32_t{0});
  return m;
}

TEST(BpeTokenizer, MergesByRank) {
  Tokenizer tok(Vocabulary::from_metadata(bpe_metadata("gpt-2")));
  // "hello": ll(0), he(1), hell(2), hello(3). " world": Ġw(4), or(5), Ġwor(6), Ġworl(7), Ġworld(8).
  EXPECT_EQ(tok.encode("hello world!", false, false), (Ids{12, 17, 18}));
  // "hel": he, then "he l" has no merge.
  EXPECT_EQ(tok.encode("hel", false, false), (Ids{10, 3}));
  // " wo": Ġw + o (Ġwo exists but no merge leads to it).
  EXPECT_EQ(tok.encode(" wo", false, false), (Ids{13, 4}));
  // A byte without a token is dropped, as llama.cpp does.
  EXPECT_EQ(tok.encode("hz", false, false), (Ids{1}));
  EXPECT_EQ(tok.encode("\xC3\xA9", false, false), (Ids{21, 22}));
  EXPECT_EQ(tok.encode("\n", false, false), (Ids{19}));
}

TEST(BpeTokenizer, IgnoreMergesTakesWholeWords) {
  Tokenizer tok(Vocabulary::from_metadata(bpe_metadata("llama-bpe")));
  EXPECT_EQ(tok.encode(" wo", false, false), (Ids{20}));
  EXPECT_EQ(tok.encode("hello world!", false, false), (Ids{12, 17, 18}));
  // llama-bpe turns add_bos on.
  EXPECT_EQ(tok.encode("hello", true, false), (Ids{0, 12}));
}

TEST(BpeTokenizer, AddBosFollowsMetadata) {
  auto m = bpe_metadata("gpt-2");
  Tokenizer plain(Vocabulary::from_metadata(m));
  EXPECT_EQ(plain.encode("hello", true, false), (Ids{12}));
  m.set("tokenizer.ggml.add_bos_token", true);
  m.set("tokenizer.ggml.add_eos_token", true);
  Tokenizer both(Vocabulary::from_metadata(m));
  EXPECT_EQ(both.encode("hello", true, false), (Ids{0, 12, 0}));
  EXPECT_EQ(both.encode("hello", false, false), (Ids{12}));
}

TEST(BpeTokenizer, SpecialTokens) {
  Tokenizer tok(Vocabulary::from_metadata(bpe_metadata("gpt-2")));
  EXPECT_EQ(tok.encode("hello<|endoftext|>", false, true), (Ids{12, 0}));
  EXPECT_EQ(tok.encode("<tool>hello", false, false), (Ids{23, 12}));
  EXPECT_TRUE(tok.is_eog(0));
  EXPECT_TRUE(tok.is_control(0));
}

TEST(BpeTokenizer, DecodeAndCleanUp) {
  Tokenizer tok(Vocabulary::from_metadata(bpe_metadata("gpt-2")));
  EXPECT_EQ(tok.decode(Ids{12, 17, 18}), "hello world!");
  EXPECT_EQ(tok.decode(Ids{21, 22}), "\xC3\xA9");
  // gpt-2 cleans up " !" to "!"; qwen2 does not.
  EXPECT_EQ(tok.decode(Ids{12, 5, 18}), "hello!");
  Tokenizer qwen(Vocabulary::from_metadata(bpe_metadata("qwen2")));
  EXPECT_EQ(qwen.decode(Ids{12, 5, 18}), "hello !");
  EXPECT_EQ(tok.decode(Ids{12, 0}), "hello");
  EXPECT_EQ(tok.decode(Ids{12, 0}, true), "hello<|endoftext|>");
  EXPECT_EQ(tok.piece(19), "\n");
}

TEST(BpeTokenizer, UnsupportedPreTokenizerThrows) {
  EXPECT_THROW(Vocabulary::from_metadata(bpe_metadata("no-such-pre")), VocabError);
  EXPECT_THROW(Vocabulary::from_metadata(make_metadata("gpt2", "gpt-2", bpe_tokens())), VocabError);  // no merges
  EXPECT_THROW(Vocabulary::from_metadata(make_metadata("t5", "", bpe_tokens())), VocabError);
}

TEST(StreamDecoder, HoldsPartialUtf8) {
  Tokenizer tok(Vocabulary::from_metadata(bpe_metadata("gpt-2")));
  StreamDecoder stream(tok);
  EXPECT_EQ(stream.push(12), "hello");
  EXPECT_EQ(stream.push(21), "");  // C3: waits for its continuation
  EXPECT_EQ(stream.pending_bytes(), 1u);
  EXPECT_EQ(stream.push(22), "\xC3\xA9");
  EXPECT_EQ(stream.push(0), "");   // control: hidden
  EXPECT_EQ(stream.push(21), "");
  EXPECT_EQ(stream.flush(), "\xC3");
  EXPECT_EQ(stream.pending_bytes(), 0u);
  // A control token asked for is shown (a chat format's tool-call tag); the others stay hidden.
  StreamDecoder shown(tok, false, {0});
  EXPECT_EQ(shown.push(12), "hello");
  EXPECT_EQ(shown.push(0), "<|endoftext|>");
}

TEST(SpmTokenizer, InvalidUtf8SplitsByLeadByte) {
  Tokenizer tok(Vocabulary::from_metadata(make_metadata("llama", "", spm_tokens())));
  // 0xFF announces a 4-byte sequence: it takes "hel" with it into one symbol, which
  // no token covers, so all four become byte tokens (llama.cpp does the same).
  EXPECT_EQ(tok.encode("\xFFhello", false, false),
            (Ids{259, kByte0 + 0xFF, kByte0 + 'h', kByte0 + 'e', kByte0 + 'l', 262, 263}));
}

TEST(BpeTokenizer, InvalidUtf8BecomesReplacementCharacters) {
  auto tokens = bpe_tokens();
  tokens.push_back({"\xC3\xAF"});                  // 24 ï (byte EF)
  tokens.push_back({"\xC2\xBF"});                  // 25 ¿ (byte BF)
  tokens.push_back({"\xC2\xBD"});                  // 26 ½ (byte BD)
  tokens.push_back({"\xC3\xAF\xC2\xBF"});          // 27 ï¿
  tokens.push_back({"\xC3\xAF\xC2\xBF\xC2\xBD"});  // 28 ï¿½: U+FFFD's bytes
  auto merges = bpe_merges();
  merges.push_back("\xC3\xAF \xC2\xBF");
  merges.push_back("\xC3\xAF\xC2\xBF \xC2\xBD");
  auto m = make_metadata("gpt2", "gpt-2", tokens, merges);
  Tokenizer tok(Vocabulary::from_metadata(m));
  // Each invalid byte is U+FFFD (EF BF BD); two of them make one word.
  EXPECT_EQ(tok.encode("\x80\xFF", false, false), (Ids{28, 28}));
  EXPECT_EQ(tok.encode("\xC3" "hello", false, false), (Ids{28, 12}));
  EXPECT_EQ(tok.encode("\xEF\xBF\xBD", false, false), (Ids{28}));
}

TEST(BpeTokenizer, Gemma4StyleBpeOnRawUtf8) {
  // tokenizer.ggml.model "gemma4": spaces become U+2581, words split only at newlines,
  // merges on raw UTF-8, byte fallback through <0xXX>, BOS always added.
  std::vector<TokenSpec> tokens = {{"<bos>", 0, TokenType::Control},
                                   {"\xE2\x96\x81"},
                                   {"h"},
                                   {"i"},
                                   {"\xE2\x96\x81h"},
                                   {"\xE2\x96\x81hi"},
                                   {"\n"},
                                   {"\n\n"},
                                   {"<0x41>", 0, TokenType::Byte}};
  auto m = make_metadata("gemma4", "", tokens, {"\xE2\x96\x81 h", "\xE2\x96\x81h i"});
  m.set("tokenizer.ggml.bos_token_id", uint32_t{0});
  Tokenizer tok(Vocabulary::from_metadata(m));
  EXPECT_EQ(tok.encode(" hi\n\nA", true, false), (Ids{0, 5, 7, 8}));
  EXPECT_EQ(tok.decode(Ids{5, 7, 8}), " hi\n\nA");
}

TEST(CleanSpaces, LlamaCppRules) {
  // Pieces with spaces before punctuation and contractions, through a gpt-2 vocabulary.
  std::vector<TokenSpec> t = {{"a"}, {"\xC4\xA0"}, {"'"}, {"s"}, {"t"}, {"."}, {"?"}, {"r"}, {"e"}};
  Tokenizer tok(Vocabulary::from_metadata(make_metadata("gpt2", "gpt-2", t, {"a a"})));
  auto text = [&](std::vector<int32_t> ids) { return tok.decode(ids); };
  EXPECT_EQ(text({0, 1, 5}), "a.");          // " ." -> "."
  EXPECT_EQ(text({0, 1, 6}), "a?");
  EXPECT_EQ(text({0, 1, 2, 1, 0}), "a'a");   // " ' " -> "'"
  EXPECT_EQ(text({0, 1, 2, 3}), "a's");      // " 's" -> "'s"
  EXPECT_EQ(text({0, 1, 2, 4}), "a 't");     // " 't" stays
  EXPECT_EQ(text({0, 1, 2, 7, 8}), "a're");  // " 're" -> "'re"
  EXPECT_EQ(text({1, 5}), ".");
}

}  // namespace
}  // namespace pico::tokenizer
