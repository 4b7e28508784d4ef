// Grammar-constrained sampling: a GBNF parser and a matcher that says which tokens a
// grammar allows next, with llama.cpp's semantics (src/llama-grammar.cpp, grammars/README.md).
//
// The grammar text may come from an untrusted request, so every resource is bounded:
// parenthesis nesting, repetition counts, elements after expansion, and at match time the
// number of stacks a (possibly very ambiguous) grammar may keep alive. Passing a limit is
// an error with a message, never a crash, a hang or unbounded memory.
//
// Token references (<[123]>, <think>, !<...>) are not supported and are refused at parse.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pico::sample {

// Limits on untrusted grammars.
inline constexpr size_t kGrammarMaxNesting = 256;        // levels of parentheses
inline constexpr uint64_t kGrammarMaxRepetition = 2000;  // llama.cpp's threshold for {m,n}
inline constexpr size_t kGrammarMaxElements = 1'000'000; // elements of all rules after expansion
inline constexpr size_t kGrammarMaxStacks = 10'000;      // live stacks of one matcher
inline constexpr size_t kGrammarMaxStackElements = 1'000'000;  // their elements, all together

// A GBNF parse error: the message says what was expected and where ("line L, column C: ...");
// offset is the byte offset into the grammar text.
class GrammarError : public std::runtime_error {
 public:
  GrammarError(std::string message, size_t offset) : std::runtime_error(std::move(message)), offset_(offset) {}
  size_t offset() const { return offset_; }

 private:
  size_t offset_;
};

// The grammar is too ambiguous to follow: one more token would need more than
// kGrammarMaxStacks stacks (or kGrammarMaxStackElements elements in them).
class GrammarAmbiguityError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace grammar_detail {
struct Rules;  // the parsed rules, defined in grammar.cpp

// A UTF-8 sequence cut by the end of a token: its bits so far and the bytes still to
// come (-1: the bytes were not UTF-8).
struct PartialUtf8 {
  uint32_t value = 0;
  int32_t remaining = 0;
  friend bool operator==(const PartialUtf8&, const PartialUtf8&) = default;
};

// A vocabulary piece decoded to code points (as if no UTF-8 sequence was pending).
struct DecodedPiece {
  enum class Kind : uint8_t { Text, EndOfGeneration, Never, Invalid };
  uint32_t first = 0;  // into GrammarVocabulary's code point pool
  uint32_t count = 0;
  PartialUtf8 tail;
  Kind kind = Kind::Text;
};
}  // namespace grammar_detail

class Grammar {  // parsed and immutable; shared by every request that uses it
 public:
  // GBNF as llama.cpp parses it; `root` names the start rule. Throws GrammarError for a syntax
  // error, an undefined rule, a missing root, left recursion, or a limit passed.
  static std::shared_ptr<const Grammar> parse(std::string_view text, std::string_view root = "root");
  ~Grammar();

  size_t rule_count() const;     // named rules and those made for groups and repetitions
  size_t element_count() const;  // elements of all rules (the limit kGrammarMaxElements)
  // The rules as GBNF, one a line in rule id order; made rules are named like llama.cpp's
  // (parent name, '_', id). For tests and logs.
  std::string to_string() const;

  const grammar_detail::Rules& rules() const { return *rules_; }

 private:
  explicit Grammar(std::unique_ptr<const grammar_detail::Rules> rules);
  std::unique_ptr<const grammar_detail::Rules> rules_;
};

// What the matcher needs of the vocabulary: each token's bytes (as the detokenizer writes them,
// specials as their text), and which tokens end generation. Built once per model by the caller;
// the constructor decodes every piece once, so that matching does not.
class GrammarVocabulary {
 public:
  // Throws std::invalid_argument if the sizes differ.
  GrammarVocabulary(std::vector<std::string> pieces, std::vector<bool> end_of_generation);

  const std::vector<std::string> pieces;
  const std::vector<bool> end_of_generation;  // same size as pieces

  size_t size() const { return pieces.size(); }
  const grammar_detail::DecodedPiece& decoded(size_t token) const { return decoded_[token]; }
  std::span<const uint32_t> code_points(const grammar_detail::DecodedPiece& piece) const {
    return std::span<const uint32_t>(code_points_).subspan(piece.first, piece.count);
  }

 private:
  std::vector<grammar_detail::DecodedPiece> decoded_;
  std::vector<uint32_t> code_points_;
};

// One sequence's position in a grammar (copyable: a request may fork it).
class GrammarMatcher {
 public:
  GrammarMatcher(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const GrammarVocabulary> vocabulary);

  // May this token come next? False also for an id outside the vocabulary, and where
  // following the token would pass the stack limits.
  bool allows(int32_t token) const;
  // Sets to -infinity the logit of every listed token the grammar does not allow
  // (the caller passes its candidates' ids and logits as parallel spans; throws
  // std::invalid_argument if their sizes differ). Agrees with allows() token by token.
  void constrain(std::span<const int32_t> ids, std::span<float> logits) const;
  // Advances; throws std::logic_error if !allows(token), GrammarAmbiguityError if the token
  // is allowed by the grammar but would pass the stack limits (the matcher is then unchanged).
  // An end-of-generation token leaves the matcher as it is.
  void accept(int32_t token);
  // Advances over text (a lazy grammar's trigger and what followed it in its token);
  // throws as accept() does when the grammar does not allow it.
  void accept_text(std::string_view text);
  const GrammarVocabulary& vocabulary() const { return *vocabulary_; }
  bool complete() const;  // the grammar may end here (an end-of-generation token is allowed)
  bool finished() const;  // nothing but end-of-generation can follow

  size_t stack_count() const { return stacks_.size(); }

 private:
  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const GrammarVocabulary> vocabulary_;
  // Each stack lists element positions, bottom first; the top is a character class, or the
  // stack is empty (the grammar may end). Deduplicated.
  std::vector<std::vector<uint32_t>> stacks_;
  grammar_detail::PartialUtf8 partial_;  // a character cut by the last token's end

  // Follows code points from the current position (what: the token or text, for errors).
  void advance(bool decoded, std::span<const uint32_t> code_points, grammar_detail::PartialUtf8 tail,
               const std::string& what);
};

}  // namespace pico::sample
