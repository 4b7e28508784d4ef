// The GBNF parser and matcher against the GBNF definition (llama.cpp's grammars/README.md and
// src/llama-grammar.cpp): every construct, the errors with their positions, the limits on
// untrusted grammars, and token matching over small hand-made vocabularies. Expected values are
// worked out by hand from the grammars.
#include "sample/grammar.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace pico::sample {
namespace {

// Token b (0..255) is the single byte b; token 256 ends generation.
constexpr int32_t kByteEnd = 256;
std::shared_ptr<const GrammarVocabulary> byte_vocabulary() {
  static const auto vocabulary = [] {
    std::vector<std::string> pieces;
    for (int b = 0; b < 256; ++b) pieces.emplace_back(1, static_cast<char>(b));
    pieces.emplace_back("</s>");
    std::vector<bool> end(pieces.size(), false);
    end.back() = true;
    return std::make_shared<const GrammarVocabulary>(std::move(pieces), std::move(end));
  }();
  return vocabulary;
}

// Feeds `text` byte by byte; whether every byte was allowed and the grammar may end after it.
bool matches(const std::shared_ptr<const Grammar>& grammar, std::string_view text) {
  GrammarMatcher m(grammar, byte_vocabulary());
  for (const char c : text) {
    const auto token = static_cast<int32_t>(static_cast<uint8_t>(c));
    if (!m.allows(token)) return false;
    m.accept(token);
  }
  return m.complete() && m.allows(kByteEnd);
}

bool matches(std::string_view grammar_text, std::string_view text) { return matches(Grammar::parse(grammar_text), text); }

GrammarError parse_error(std::string_view text, std::string_view root = "root") {
  try {
    Grammar::parse(text, root);
  } catch (const GrammarError& e) {
    return e;
  }
  ADD_FAILURE() << "no error for: " << text;
  return GrammarError("", 0);
}

bool contains(std::string_view haystack, std::string_view needle) { return haystack.find(needle) != std::string_view::npos; }

// ---------------------------------------------------------------------------------------
// Parser

TEST(GrammarParse, RulesOverSeveralLinesWithCommentsAndAlternatives) {
  const auto g = Grammar::parse(R"(# a comment line
root ::= greeting |  # a newline after '|' continues the rule
  "x" |
    "y"
greeting ::= (
  "hi" |   # inside parentheses newlines are free
  "yo"
) name
name::="!"
)");
  EXPECT_EQ(g->rule_count(), 4u);  // root, greeting, its group, name
  EXPECT_EQ(g->to_string(),
            "root ::= greeting | [x] | [y]\n"
            "greeting ::= greeting_2 name\n"
            "greeting_2 ::= [h] [i] | [y] [o]\n"
            "name ::= [!]\n");
  EXPECT_TRUE(matches(g, "hi!"));
  EXPECT_TRUE(matches(g, "yo!"));
  EXPECT_TRUE(matches(g, "x"));
  EXPECT_TRUE(matches(g, "y"));
  EXPECT_FALSE(matches(g, "hi"));
  EXPECT_FALSE(matches(g, "xy"));
  // Outside parentheses a newline ends the rule: a '|' starting the next line is an error.
  const GrammarError e = parse_error("root ::= \"a\"\n  | \"b\"");
  EXPECT_EQ(e.offset(), 15u);
  EXPECT_TRUE(contains(e.what(), "line 2, column 3: expected a rule name, found '|'")) << e.what();
}

TEST(GrammarParse, LaterDefinitionReplacesEarlierAndCrLfEndsRules) {
  const auto g = Grammar::parse("root ::= a\r\na ::= \"1\"\r\na ::= \"2\"\r\n");
  EXPECT_TRUE(matches(g, "2"));
  EXPECT_FALSE(matches(g, "1"));
}

TEST(GrammarParse, LiteralEscapes) {
  const auto g = Grammar::parse(R"(root ::= "\x41\u00e9\U0001F600\t\n\r\\\"\[\]\-z")");
  EXPECT_TRUE(matches(g, "A\xC3\xA9\xF0\x9F\x98\x80\t\n\r\\\"[]-z"));
  EXPECT_FALSE(matches(g, "A\xC3\xA9"));
  EXPECT_EQ(g->to_string(), "root ::= [A] [\\u00E9] [\\U0001F600] [\\t] [\\n] [\\r] [\\\\] [\\\"] [\\[] [\\]] [\\-] [z]\n");
}

TEST(GrammarParse, RawUtf8InLiteralsAndClasses) {
  const auto g = Grammar::parse("root ::= \"é\" [ぁ-ゟ]+");
  EXPECT_TRUE(matches(g, "éぁゟ"));
  EXPECT_FALSE(matches(g, "éア"));  // katakana, outside the range
}

TEST(GrammarParse, CharacterClasses) {
  const auto g = Grammar::parse(R"(root ::= [a-cx] [^0-9\n] [-+] [a-] .)");
  EXPECT_EQ(g->to_string(), "root ::= [a-cx] [^0-9\\n] [\\-+] [a\\-] .\n");
  EXPECT_TRUE(matches(g, "bZ-a\xE2\x82\xAC"));  // '.' takes any character, here the euro sign
  EXPECT_TRUE(matches(g, "xé+-!"));
  EXPECT_FALSE(matches(g, "d#-a!"));   // d is outside [a-cx]
  EXPECT_FALSE(matches(g, "a5-a!"));   // 5 is excluded
  EXPECT_FALSE(matches(g, "a\n-a!"));  // so is a newline
  EXPECT_FALSE(matches(g, "a#*a!"));   // * is not in [-+]
  EXPECT_FALSE(matches(g, "a#-a"));    // '.' needs a character
}

TEST(GrammarParse, EmptyClassAndEmptyLiteralMatchNothingAtAll) {
  // llama.cpp emits no element for [] or "": they match the empty string.
  EXPECT_TRUE(matches("root ::= \"a\" [] \"\" \"b\"", "ab"));
}

TEST(GrammarParse, RepetitionOperators) {
  EXPECT_EQ(Grammar::parse("root ::= \"ab\"*")->to_string(), "root ::= root_1\nroot_1 ::= [a] [b] root_1 |\n");
  EXPECT_EQ(Grammar::parse("root ::= \"a\"+")->to_string(), "root ::= [a] root_1\nroot_1 ::= [a] root_1 |\n");
  EXPECT_EQ(Grammar::parse("root ::= \"a\"?")->to_string(), "root ::= root_1\nroot_1 ::= [a] |\n");
  EXPECT_EQ(Grammar::parse("root ::= \"a\"{2,4}")->to_string(),
            "root ::= [a] [a] root_2\nroot_1 ::= [a] |\nroot_2 ::= [a] root_1 |\n");
  EXPECT_EQ(Grammar::parse("root ::= \"a\"{2,}")->to_string(), "root ::= [a] [a] root_1\nroot_1 ::= [a] root_1 |\n");
  EXPECT_EQ(Grammar::parse("root ::= \"a\"{3}")->to_string(), "root ::= [a] [a] [a]\n");
  EXPECT_EQ(Grammar::parse("root ::= (\"x\" | y)+\ny ::= \"y\"")->to_string(),
            "root ::= root_1 root_3\nroot_1 ::= [x] | y\ny ::= [y]\nroot_3 ::= root_1 root_3 |\n");

  const auto star = Grammar::parse("root ::= \"ab\"*");
  EXPECT_TRUE(matches(star, ""));
  EXPECT_TRUE(matches(star, "abab"));
  EXPECT_FALSE(matches(star, "aba"));
  const auto plus = Grammar::parse("root ::= [0-9]+ \";\"");
  EXPECT_FALSE(matches(plus, ";"));
  EXPECT_TRUE(matches(plus, "7;"));
  EXPECT_TRUE(matches(plus, "123;"));
  const auto optional = Grammar::parse("root ::= \"a\"? \"b\"");
  EXPECT_TRUE(matches(optional, "b"));
  EXPECT_TRUE(matches(optional, "ab"));
  EXPECT_FALSE(matches(optional, "aab"));
  const auto exact = Grammar::parse("root ::= [ab]{3}");
  EXPECT_FALSE(matches(exact, "ab"));
  EXPECT_TRUE(matches(exact, "aba"));
  EXPECT_FALSE(matches(exact, "abab"));
  const auto at_least = Grammar::parse("root ::= \"x\"{2,}");
  EXPECT_FALSE(matches(at_least, "x"));
  EXPECT_TRUE(matches(at_least, "xx"));
  EXPECT_TRUE(matches(at_least, "xxxxxxx"));
  const auto between = Grammar::parse("root ::= \"x\"{1,3} \"y\"");
  EXPECT_FALSE(matches(between, "y"));
  EXPECT_TRUE(matches(between, "xy"));
  EXPECT_TRUE(matches(between, "xxxy"));
  EXPECT_FALSE(matches(between, "xxxxy"));
  const auto at_most = Grammar::parse("root ::= \"x\"{0,2}");
  EXPECT_TRUE(matches(at_most, ""));
  EXPECT_TRUE(matches(at_most, "xx"));
  EXPECT_FALSE(matches(at_most, "xxx"));
  const auto spaced = Grammar::parse("root ::= \"x\"{ 1 , 2 }");
  EXPECT_TRUE(matches(spaced, "xx"));
  const auto zero = Grammar::parse("root ::= \"a\" \"x\"{0} \"b\"");
  EXPECT_TRUE(matches(zero, "ab"));
}

TEST(GrammarParse, MaximumAboveTheThresholdMeansUnbounded) {
  // llama.cpp treats a maximum above 2000 as no maximum.
  const auto g = Grammar::parse("root ::= \"x\"{1,5000}");
  EXPECT_EQ(g->to_string(), "root ::= [x] root_1\nroot_1 ::= [x] root_1 |\n");
}

TEST(GrammarParse, CustomRoot) {
  const auto g = Grammar::parse("start ::= \"s\" more\nmore ::= \"!\"", "start");
  EXPECT_TRUE(matches(g, "s!"));
}

TEST(GrammarErrors, UnterminatedLiteral) {
  const GrammarError e = parse_error("root ::= \"abc");
  EXPECT_EQ(e.offset(), 9u);
  EXPECT_TRUE(contains(e.what(), "line 1, column 10:")) << e.what();
  EXPECT_TRUE(contains(e.what(), "unterminated literal")) << e.what();
}

TEST(GrammarErrors, UnterminatedClass) {
  const GrammarError e = parse_error("root ::= \"a\"\nx ::= [a-");
  EXPECT_EQ(e.offset(), 19u);
  EXPECT_TRUE(contains(e.what(), "line 2, column 7:")) << e.what();
  EXPECT_TRUE(contains(e.what(), "unterminated character class")) << e.what();
}

TEST(GrammarErrors, BadEscapes) {
  const GrammarError unknown = parse_error("root ::= \"a\\q\"");
  EXPECT_EQ(unknown.offset(), 11u);
  EXPECT_TRUE(contains(unknown.what(), "line 1, column 12: unknown escape '\\q'")) << unknown.what();
  const GrammarError short_hex = parse_error("root ::=\n  [\\x4]");
  EXPECT_EQ(short_hex.offset(), 12u);
  EXPECT_TRUE(contains(short_hex.what(), "line 2, column 4: expected 2 hex digits after '\\x'")) << short_hex.what();
  const GrammarError short_u = parse_error("root ::= \"\\u12G4\"");
  EXPECT_EQ(short_u.offset(), 10u);
}

TEST(GrammarErrors, MissingDefinitionSign) {
  const GrammarError e = parse_error("root ::= a\na = \"x\"");
  EXPECT_EQ(e.offset(), 13u);
  EXPECT_TRUE(contains(e.what(), "line 2, column 3: expected '::=' after the rule name 'a'")) << e.what();
}

TEST(GrammarErrors, SyntaxErrors) {
  const GrammarError stray = parse_error("root ::= \"a\" @");
  EXPECT_EQ(stray.offset(), 13u);
  EXPECT_TRUE(contains(stray.what(), "expected the end of the line")) << stray.what();
  const GrammarError unclosed = parse_error("root ::= (\"a\" \"b\"\n");
  EXPECT_EQ(unclosed.offset(), 18u);
  EXPECT_TRUE(contains(unclosed.what(), "expected ')'")) << unclosed.what();
  const GrammarError no_name = parse_error("::= \"a\"");
  EXPECT_EQ(no_name.offset(), 0u);
  const GrammarError nothing_to_repeat = parse_error("root ::= * \"a\"");
  EXPECT_EQ(nothing_to_repeat.offset(), 9u);
  const GrammarError open_count = parse_error("root ::= \"a\"{,3}");  // llama.cpp needs the minimum
  EXPECT_EQ(open_count.offset(), 13u);
  EXPECT_TRUE(contains(open_count.what(), "expected a number after '{'")) << open_count.what();
  const GrammarError tokens = parse_error("root ::= <[12]> \"a\"");
  EXPECT_EQ(tokens.offset(), 9u);
  EXPECT_TRUE(contains(tokens.what(), "not supported")) << tokens.what();
  EXPECT_EQ(parse_error("root ::= !<think>").offset(), 9u);
  const GrammarError nul = parse_error(std::string_view("root ::= \"a\0\"", 13));
  EXPECT_EQ(nul.offset(), 11u);
  const GrammarError utf8 = parse_error("root ::= \"\xC3(\"");
  EXPECT_EQ(utf8.offset(), 10u);
  EXPECT_TRUE(contains(utf8.what(), "invalid UTF-8")) << utf8.what();
}

TEST(GrammarErrors, UndefinedRule) {
  const GrammarError e = parse_error("root ::= \"x\" item\nitem ::= foo");
  EXPECT_EQ(e.offset(), 27u);
  EXPECT_TRUE(contains(e.what(), "line 2, column 10: undefined rule 'foo'")) << e.what();
}

TEST(GrammarErrors, MissingRoot) {
  const GrammarError e = parse_error("start ::= \"x\"");
  EXPECT_TRUE(contains(e.what(), "no rule 'root'")) << e.what();
  EXPECT_TRUE(contains(parse_error("").what(), "no rule 'root'"));
  EXPECT_TRUE(contains(parse_error("root ::= \"x\"", "main").what(), "no rule 'main'"));
}

TEST(GrammarErrors, LeftRecursion) {
  const GrammarError direct = parse_error("root ::= expr\nexpr ::= expr \"+\" num | num\nnum ::= [0-9]+");
  EXPECT_EQ(direct.offset(), 14u);
  EXPECT_TRUE(contains(direct.what(), "line 2, column 1: left recursion: rule 'expr'")) << direct.what();
  // Through rules that may match nothing: b matches "" only by way of c.
  const GrammarError nullable = parse_error("root ::= a\na ::= b a \"x\" | \"y\"\nb ::= c\nc ::= \"\"");
  EXPECT_TRUE(contains(nullable.what(), "left recursion: rule 'a'")) << nullable.what();
  // A repeated item that may be empty: (x?)* would repeat forever.
  EXPECT_TRUE(contains(parse_error("root ::= \"x\"?*").what(), "left recursion"));
  // Not left recursion: the recursion comes after a character.
  EXPECT_NO_THROW(Grammar::parse("root ::= \"(\" root \")\" | \"\""));
}

TEST(GrammarErrors, Limits) {
  std::string deep = "root ::= ";
  for (int i = 0; i < 257; ++i) deep += '(';
  deep += "\"a\"";
  for (int i = 0; i < 257; ++i) deep += ')';
  const GrammarError nesting = parse_error(deep);
  EXPECT_EQ(nesting.offset(), 9u + 256u);
  EXPECT_TRUE(contains(nesting.what(), "nested deeper than 256")) << nesting.what();
  std::string ok_depth = "root ::= " + std::string(256, '(') + "\"a\"" + std::string(256, ')');
  EXPECT_TRUE(matches(ok_depth, "a"));

  const GrammarError minimum = parse_error("root ::= \"a\"{2001}");
  EXPECT_EQ(minimum.offset(), 12u);
  EXPECT_TRUE(contains(minimum.what(), "repetition minimum 2001 is above the limit 2000")) << minimum.what();
  const GrammarError product = parse_error("root ::= \"a\"{0,2000}");
  EXPECT_TRUE(contains(product.what(), "repetition too large")) << product.what();
  const GrammarError nested_product = parse_error("root ::= (\"a\"{0,100}){0,100}");
  EXPECT_TRUE(contains(nested_product.what(), "repetition too large")) << nested_product.what();
  EXPECT_TRUE(contains(parse_error("root ::= \"a\"{3,2}").what(), "below the minimum"));
  EXPECT_TRUE(contains(parse_error("root ::= \"a\"{99999999999999999999999}").what(), "above the limit"));

  const std::string long_literal = "\"" + std::string(600, 'z') + "\"";
  const GrammarError elements = parse_error("root ::= " + long_literal + "{1999}");
  EXPECT_TRUE(contains(elements.what(), "more than 1000000 elements")) << elements.what();
  EXPECT_LE(Grammar::parse("root ::= " + long_literal + "{1000}")->element_count(), kGrammarMaxElements);
}

TEST(GrammarErrors, TooAmbiguousAtTheStart) {
  // 10,001 alternatives give as many stacks before the first character.
  std::string text = "root ::= \"w0\"";
  for (int i = 1; i <= 10'000; ++i) text += " | \"w" + std::to_string(i) + "\"";
  EXPECT_TRUE(contains(parse_error(text).what(), "too ambiguous"));
}

// ---------------------------------------------------------------------------------------
// Matcher over a tiny vocabulary

enum Tok : int32_t {
  kOpen, kQuote, kA, kAb, kClose, kSpace, kEHigh, kELow, kEmpty, kEnd, kE, kQuoteClose, kNulA, kBadUtf8, kTokCount
};
std::shared_ptr<const GrammarVocabulary> tiny_vocabulary() {
  std::vector<std::string> pieces(kTokCount);
  pieces[kOpen] = "{";
  pieces[kQuote] = "\"";
  pieces[kA] = "a";
  pieces[kAb] = "ab";
  pieces[kClose] = "}";
  pieces[kSpace] = " ";
  pieces[kEHigh] = "\xC3";  // the two halves of é
  pieces[kELow] = "\xA9";
  pieces[kEmpty] = "";
  pieces[kEnd] = "</s>";
  pieces[kE] = "\xC3\xA9";
  pieces[kQuoteClose] = "\"}";
  pieces[kNulA] = std::string("\0a", 2);
  pieces[kBadUtf8] = "a\xC3(";
  std::vector<bool> end(kTokCount, false);
  end[kEnd] = true;
  return std::make_shared<const GrammarVocabulary>(std::move(pieces), std::move(end));
}

// The tokens allows() accepts, and a check that constrain() bans exactly the others.
std::vector<int32_t> allowed_tokens(const GrammarMatcher& m, size_t vocabulary_size) {
  std::vector<int32_t> ids, allowed;
  for (int32_t t = 0; t < static_cast<int32_t>(vocabulary_size); ++t) {
    ids.push_back(t);
    if (m.allows(t)) allowed.push_back(t);
  }
  std::vector<float> logits(ids.size(), 1.0f);
  m.constrain(ids, logits);
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(std::isinf(logits[i]), !m.allows(ids[i])) << "token " << ids[i];
  }
  return allowed;
}

TEST(GrammarMatcher, JsonLikeObjectWithSplitCharacters) {
  const auto g = Grammar::parse(R"(root ::= "{" ( " "? "\"" [a-zé]+ "\"" )? "}")");
  GrammarMatcher m(g, tiny_vocabulary());
  EXPECT_EQ(allowed_tokens(m, kTokCount), (std::vector<int32_t>{kOpen}));
  EXPECT_FALSE(m.complete());
  EXPECT_FALSE(m.finished());
  m.accept(kOpen);
  EXPECT_EQ(allowed_tokens(m, kTokCount), (std::vector<int32_t>{kQuote, kClose, kSpace}));
  m.accept(kQuote);
  // Letters, é whole or its first half (which can still become é), not the lone second half.
  EXPECT_EQ(allowed_tokens(m, kTokCount), (std::vector<int32_t>{kA, kAb, kEHigh, kE}));
  m.accept(kEHigh);
  EXPECT_EQ(allowed_tokens(m, kTokCount), (std::vector<int32_t>{kELow}));
  m.accept(kELow);
  EXPECT_EQ(allowed_tokens(m, kTokCount), (std::vector<int32_t>{kQuote, kA, kAb, kEHigh, kE, kQuoteClose}));
  m.accept(kAb);
  m.accept(kQuoteClose);
  EXPECT_TRUE(m.complete());
  EXPECT_TRUE(m.finished());
  EXPECT_EQ(allowed_tokens(m, kTokCount), (std::vector<int32_t>{kEnd}));
  m.accept(kEnd);  // allowed: leaves the matcher as it is
  EXPECT_TRUE(m.finished());
}

TEST(GrammarMatcher, AcceptRefusesWhatAllowsRefuses) {
  const auto g = Grammar::parse(R"(root ::= "{" "}")");
  GrammarMatcher m(g, tiny_vocabulary());
  EXPECT_THROW(m.accept(kClose), std::logic_error);
  EXPECT_THROW(m.accept(kEnd), std::logic_error);
  EXPECT_THROW(m.accept(kEmpty), std::logic_error);
  EXPECT_THROW(m.accept(-1), std::logic_error);
  EXPECT_THROW(m.accept(kTokCount), std::logic_error);
  EXPECT_FALSE(m.allows(-1));
  EXPECT_FALSE(m.allows(kTokCount));
  m.accept(kOpen);  // the refusals left it at the start
  m.accept(kClose);
  EXPECT_TRUE(m.finished());
}

TEST(GrammarMatcher, EmptyNulAndInvalidPiecesAreNeverAllowed) {
  const auto g = Grammar::parse("root ::= .*");
  GrammarMatcher m(g, tiny_vocabulary());
  EXPECT_TRUE(m.complete());
  EXPECT_FALSE(m.finished());
  EXPECT_FALSE(m.allows(kEmpty));
  EXPECT_FALSE(m.allows(kNulA));
  EXPECT_FALSE(m.allows(kBadUtf8));
  EXPECT_FALSE(m.allows(kELow));  // a continuation byte with nothing to continue
  EXPECT_TRUE(m.allows(kEHigh));
  EXPECT_TRUE(m.allows(kEnd));
  m.accept(kEHigh);
  EXPECT_EQ(allowed_tokens(m, kTokCount), (std::vector<int32_t>{kELow, kEnd}));
}

TEST(GrammarMatcher, PartialCharacterMustFitTheClass) {
  GrammarMatcher ascii(Grammar::parse("root ::= [a-z]+"), tiny_vocabulary());
  EXPECT_FALSE(ascii.allows(kEHigh));  // \xC3 can only become U+00C0..U+00FF
  GrammarMatcher negated(Grammar::parse("root ::= [^\\u00E0]+"), tiny_vocabulary());
  EXPECT_FALSE(negated.allows(kEHigh));  // llama.cpp: one excluded completion refuses a negated class
  EXPECT_TRUE(negated.allows(kE));
  GrammarMatcher other(Grammar::parse("root ::= [^\\u0100]+"), tiny_vocabulary());
  EXPECT_TRUE(other.allows(kEHigh));
}

TEST(GrammarMatcher, CopiesAdvanceIndependently) {
  const auto g = Grammar::parse(R"(root ::= "{" ("a" | "ab")* "}")");
  GrammarMatcher m(g, tiny_vocabulary());
  m.accept(kOpen);
  GrammarMatcher fork = m;
  fork.accept(kAb);
  fork.accept(kClose);
  EXPECT_TRUE(fork.finished());
  EXPECT_FALSE(m.complete());
  EXPECT_TRUE(m.allows(kA));
  m.accept(kA);
  m.accept(kA);
  EXPECT_FALSE(m.complete());
  m.accept(kClose);
  EXPECT_TRUE(m.complete());
}

TEST(GrammarMatcher, ArithmeticGrammar) {
  const auto g = Grammar::parse(R"gbnf(root  ::= (expr "=" ws term "\n")+
expr  ::= term ([-+*/] term)*
term  ::= ident | num | "(" ws expr ")" ws
ident ::= [a-z] [a-z0-9_]* ws
num   ::= [0-9]+ ws
ws    ::= [ \t\n]*)gbnf");
  EXPECT_TRUE(matches(g, "1+2=3\n"));
  EXPECT_TRUE(matches(g, "(a +b_1)*c= 42\nx=y\n"));
  EXPECT_FALSE(matches(g, "1+=2\n"));
  EXPECT_FALSE(matches(g, "1+ 2=3\n"));  // no space after an operator
  EXPECT_FALSE(matches(g, "1=2"));  // the newline is missing
  EXPECT_FALSE(matches(g, "A=1\n"));
  EXPECT_FALSE(matches(g, "(1=1\n"));
}

TEST(GrammarMatcher, RepetitionGrammar) {
  const auto g = Grammar::parse(R"(root ::= [ab]{2,3} "c"?)");
  EXPECT_FALSE(matches(g, "a"));
  EXPECT_TRUE(matches(g, "ab"));
  EXPECT_TRUE(matches(g, "abc"));
  EXPECT_TRUE(matches(g, "abac"));
  EXPECT_FALSE(matches(g, "abab"));
  EXPECT_FALSE(matches(g, "abacc"));
  GrammarMatcher m(g, byte_vocabulary());
  for (const char c : std::string("bab")) m.accept(c);
  EXPECT_TRUE(m.complete());
  EXPECT_FALSE(m.finished());
  m.accept('c');
  EXPECT_TRUE(m.finished());
}

TEST(GrammarMatcher, ExponentiallyAmbiguousGrammarHitsTheStackCap) {
  // After n a's every sequence of n closers (b or c) is a live stack: 3 * 2^n stacks.
  const auto g = Grammar::parse("root ::= s\ns ::= \"a\" s \"b\" | \"a\" s \"c\" | \"\"");
  GrammarMatcher m(g, byte_vocabulary());
  EXPECT_EQ(m.stack_count(), 3u);
  for (int i = 0; i < 11; ++i) m.accept('a');
  EXPECT_EQ(m.stack_count(), 6144u);
  EXPECT_FALSE(m.allows('a'));  // 12288 stacks would pass 10,000
  std::vector<int32_t> ids{'a', 'b'};
  std::vector<float> logits{0.0f, 0.0f};
  m.constrain(ids, logits);
  EXPECT_TRUE(std::isinf(logits[0]));
  EXPECT_FALSE(std::isinf(logits[1]));
  try {
    m.accept('a');
    ADD_FAILURE() << "no error";
  } catch (const GrammarAmbiguityError& e) {
    EXPECT_TRUE(contains(e.what(), "too ambiguous")) << e.what();
  }
  EXPECT_EQ(m.stack_count(), 6144u);  // unchanged
  m.accept('b');
  EXPECT_TRUE(m.allows('c'));
}

TEST(GrammarMatcher, VocabularySizesMustAgree) {
  EXPECT_THROW(GrammarVocabulary({"a", "b"}, {false}), std::invalid_argument);
  GrammarMatcher m(Grammar::parse("root ::= \"a\""), tiny_vocabulary());
  std::vector<int32_t> ids{kA};
  std::vector<float> logits{0.0f, 0.0f};
  EXPECT_THROW(m.constrain(ids, logits), std::invalid_argument);
}

TEST(GrammarMatcher, ConstrainBansIdsOutsideTheVocabulary) {
  GrammarMatcher m(Grammar::parse("root ::= \"{\""), tiny_vocabulary());
  std::vector<int32_t> ids{-1, kTokCount, kOpen, kClose};
  std::vector<float> logits{0.5f, 0.5f, 0.5f, 0.5f};
  m.constrain(ids, logits);
  EXPECT_TRUE(std::isinf(logits[0]));
  EXPECT_TRUE(std::isinf(logits[1]));
  EXPECT_EQ(logits[2], 0.5f);
  EXPECT_TRUE(std::isinf(logits[3]));
}

// llama.cpp's grammars/list.gbnf, japanese.gbnf and chess.gbnf.
TEST(GrammarMatcher, SmallGrammarsFromLlamaCpp) {
  const auto list = Grammar::parse(R"gbnf(root ::= item+

# Excludes various line break characters
item ::= "- " [^\r\n\x0b\x0c\x85\u2028\u2029]+ "\n"
)gbnf");
  EXPECT_TRUE(matches(list, "- milk\n- eggs\n"));
  EXPECT_FALSE(matches(list, "- \n"));
  EXPECT_FALSE(matches(list, "-milk\n"));
  EXPECT_FALSE(matches(list, "- a\xE2\x80\xA8" "b\n"));  // U+2028 is excluded

  const auto japanese = Grammar::parse(R"gbnf(# A probably incorrect grammar for Japanese
root        ::= jp-char+ ([ \t\n] jp-char+)*
jp-char     ::= hiragana | katakana | punctuation | cjk
hiragana    ::= [ぁ-ゟ]
katakana    ::= [ァ-ヿ]
punctuation ::= [、-〾]
cjk         ::= [一-鿿]
)gbnf");
  EXPECT_TRUE(matches(japanese, "こんにちは 世界、カタカナ"));
  EXPECT_FALSE(matches(japanese, "abc"));
  EXPECT_FALSE(matches(japanese, "こんにちは  世界"));  // one separator at a time

  const auto chess = Grammar::parse(R"gbnf(root    ::= "1. " move " " move "\n" ([1-9] [0-9]? ". " move " " move "\n")+
move    ::= (pawn | nonpawn | castle) [+#]?
nonpawn ::= [NBKQR] [a-h]? [1-8]? "x"? [a-h] [1-8]
pawn    ::= ([a-h] "x")? [a-h] [1-8] ("=" [NBKQR])?
castle  ::= "O-O" "-O"?
)gbnf");
  EXPECT_TRUE(matches(chess, "1. e4 e5\n2. Nf3 Nc6\n3. O-O exd4+\n"));
  EXPECT_FALSE(matches(chess, "1. e4 e5\n"));  // at least one more numbered line
  EXPECT_FALSE(matches(chess, "1. e9 e5\n2. a3 a6\n"));
}

// ---------------------------------------------------------------------------------------
// llama.cpp's grammars/json.gbnf

constexpr std::string_view kJsonGbnf = R"gbnf(root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
)gbnf";

// Single bytes plus multi-character pieces; text is cut greedily into the longest pieces.
struct JsonVocabulary {
  std::vector<std::string> pieces;
  std::shared_ptr<const GrammarVocabulary> vocabulary;
  JsonVocabulary() {
    for (int b = 1; b < 256; ++b) pieces.emplace_back(1, static_cast<char>(b));
    for (const char* p : {"{\"", "\":", "\": ", "\",", ", \"", "true", "null", "false", "12", "\\u00", "\xC3\xA9\"",
                          "}}", "[1", "\n  "}) {
      pieces.emplace_back(p);
    }
    std::vector<bool> end(pieces.size() + 1, false);
    end.back() = true;
    std::vector<std::string> all = pieces;
    all.emplace_back("<eos>");
    vocabulary = std::make_shared<const GrammarVocabulary>(std::move(all), std::move(end));
  }
  std::vector<int32_t> tokenize(std::string_view text) const {
    std::vector<int32_t> out;
    while (!text.empty()) {
      size_t best = 0, best_length = 0;
      for (size_t t = 0; t < pieces.size(); ++t) {
        if (pieces[t].size() > best_length && text.substr(0, pieces[t].size()) == pieces[t]) {
          best = t;
          best_length = pieces[t].size();
        }
      }
      out.push_back(static_cast<int32_t>(best));
      text.remove_prefix(best_length);
    }
    return out;
  }
  int32_t end_token() const { return static_cast<int32_t>(pieces.size()); }
};

// Whether the grammar takes the whole document, checking constrain() against allows() on the way.
bool json_accepts(const JsonVocabulary& v, std::string_view document) {
  GrammarMatcher m(Grammar::parse(kJsonGbnf), v.vocabulary);
  std::vector<int32_t> ids(v.pieces.size() + 1);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  for (const int32_t token : v.tokenize(document)) {
    std::vector<float> logits(ids.size(), 0.0f);
    m.constrain(ids, logits);
    for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(std::isinf(logits[i]), !m.allows(ids[i]));
    if (!m.allows(token)) return false;
    m.accept(token);
  }
  return m.allows(v.end_token());
}

TEST(GrammarJson, AcceptsValidDocuments) {
  const JsonVocabulary v;
  EXPECT_TRUE(json_accepts(v, "{}"));
  EXPECT_TRUE(json_accepts(v, R"({"a": [1, 2.5, -3e5, true, null], "b": {"c": "x\u00e9\\n"}})"));
  EXPECT_TRUE(json_accepts(v, "{\"k\":\"\xC3\xA9\"}"));
  EXPECT_TRUE(json_accepts(v, "{\n  \"list\": [[1], [], {}],\n  \"n\": 12\n}\n"));
  EXPECT_TRUE(json_accepts(v, "{\"e\": \"caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80\"} "));
}

TEST(GrammarJson, RefusesInvalidDocuments) {
  const JsonVocabulary v;
  EXPECT_FALSE(json_accepts(v, "[1, 2]"));          // root is an object
  EXPECT_FALSE(json_accepts(v, R"({"a":})"));
  EXPECT_FALSE(json_accepts(v, R"({"a" 1})"));
  EXPECT_FALSE(json_accepts(v, R"({"a": 01})"));    // no leading zero
  EXPECT_FALSE(json_accepts(v, "{\"a\": \"\x01\"}"));  // control character in a string
  EXPECT_FALSE(json_accepts(v, R"({"a": "\q"})"));  // unknown escape
  EXPECT_FALSE(json_accepts(v, R"({"a": 1,})"));
  EXPECT_FALSE(json_accepts(v, R"({"a": 1)"));      // unclosed: cannot end
  EXPECT_FALSE(json_accepts(v, R"({"a": tru})"));
  EXPECT_FALSE(json_accepts(v, "{\"a\": \"\xC3\x28\"}"));  // not UTF-8
}

}  // namespace
}  // namespace pico::sample
