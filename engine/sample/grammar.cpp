#include "sample/grammar.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <unordered_map>

namespace pico::sample {
namespace grammar_detail {

// An element of a rule body, as llama.cpp lays rules out: alternatives separated by Alt, the
// rule closed by End; a character class is a Char, CharNot or CharAny followed by CharAlt and
// CharRangeUpper elements.
enum class Kind : uint8_t { End, Alt, RuleRef, Char, CharNot, CharRangeUpper, CharAlt, CharAny };

struct Element {
  Kind kind;
  uint32_t value;  // code point or rule id
};

struct CharClass {
  bool negated = false;
  bool any = false;  // '.'
  uint32_t next = 0;  // the element after the class
  uint32_t first_range = 0, range_count = 0;  // into Rules::ranges
  uint64_t ascii[2] = {0, 0};  // the answer for code points below 128, negation applied
};

constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();

struct Rules {
  std::vector<Element> elements;       // every rule, one after another
  std::vector<uint32_t> rule_begin;    // rule id -> its first element
  std::vector<uint32_t> alternatives;  // where each alternative starts, rule by rule
  std::vector<uint32_t> rule_alternatives;  // rule id -> first index in alternatives (size: rules + 1)
  std::vector<uint32_t> class_at;      // element -> index in classes, or kNone
  std::vector<CharClass> classes;
  std::vector<std::pair<uint32_t, uint32_t>> ranges;  // inclusive
  std::vector<std::string> names;
  std::vector<std::vector<uint32_t>> initial_stacks;
  uint32_t root = 0;

  bool is_end(uint32_t at) const { return elements[at].kind == Kind::End || elements[at].kind == Kind::Alt; }
  bool matches(const CharClass& c, uint32_t cp) const {
    if (cp < 128) return (c.ascii[cp >> 6] >> (cp & 63)) & 1;
    if (c.any) return true;
    bool found = false;
    for (uint32_t i = 0; i < c.range_count && !found; ++i) {
      const auto [lo, hi] = ranges[c.first_range + i];
      found = lo <= cp && cp <= hi;
    }
    return found != c.negated;
  }
  // Whether some completion of a cut UTF-8 sequence could match (llama.cpp's rule, which
  // refuses a negated class as soon as one completion is excluded).
  bool may_match(const CharClass& c, PartialUtf8 partial) const {
    if (partial.remaining < 0 || (partial.remaining == 1 && partial.value < 2)) return false;  // overlong
    const int bits = partial.remaining * 6;
    uint32_t low = partial.value << bits;
    const uint32_t high = low | ((1u << bits) - 1);
    if (low == 0) low = partial.remaining == 2 ? 1u << 11 : partial.remaining == 3 ? 1u << 16 : low;
    if (c.any) return true;
    for (uint32_t i = 0; i < c.range_count; ++i) {
      const auto [lo, hi] = ranges[c.first_range + i];
      if (lo <= high && low <= hi) return !c.negated;
    }
    return c.negated;
  }
};

namespace {

// ---------------------------------------------------------------------------------------
// UTF-8

// Bytes in a sequence by its first byte; 0 for a continuation byte.
int sequence_length(uint8_t first) {
  static constexpr int kByHighNibble[16] = {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 2, 2, 3, 4};
  return kByHighNibble[first >> 4];
}

// Appends the code points of `bytes` (which end at a NUL byte, as in llama.cpp) continuing a
// sequence the previous piece cut; returns the sequence this piece cuts, if any. Not UTF-8:
// `out` is cleared and the result has remaining = -1.
PartialUtf8 decode_utf8(std::string_view bytes, PartialUtf8 partial, std::vector<uint32_t>& out) {
  const auto invalid = [&out] {
    out.clear();
    return PartialUtf8{0, -1};
  };
  if (partial.remaining < 0) return invalid();
  size_t i = 0;
  uint32_t value = partial.value;
  int32_t remaining = partial.remaining;
  const auto more = [&] { return i < bytes.size() && bytes[i] != '\0'; };
  const auto take_continuation = [&] {
    const auto b = static_cast<uint8_t>(bytes[i++]);
    if ((b >> 6) != 2) return false;
    value = (value << 6) | (b & 0x3Fu);
    --remaining;
    return true;
  };
  while (remaining > 0 && more()) {
    if (!take_continuation()) return invalid();
  }
  if (partial.remaining > 0 && remaining == 0) out.push_back(value);
  while (more()) {
    const auto first = static_cast<uint8_t>(bytes[i++]);
    const int length = sequence_length(first);
    if (length == 0) return invalid();
    remaining = length - 1;
    value = first & ((1u << (7 - remaining)) - 1);
    while (remaining > 0 && more()) {
      if (!take_continuation()) return invalid();
    }
    if (remaining == 0) out.push_back(value);
  }
  return remaining == 0 ? PartialUtf8{} : PartialUtf8{value, remaining};
}

// ---------------------------------------------------------------------------------------
// Parser

struct RuleDraft {
  std::vector<Element> body;
  bool defined = false;
  std::string name;        // named rules
  uint32_t owner = kNone;  // made rules: the named rule they were made in
  size_t first_use = std::string_view::npos;
  size_t defined_at = 0;
};

constexpr uint64_t kUnbounded = std::numeric_limits<uint64_t>::max();

bool is_digit(char c) { return '0' <= c && c <= '9'; }
bool is_word_char(char c) { return ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') || c == '-' || is_digit(c); }

std::string line_and_column(std::string_view text, size_t offset) {
  offset = std::min(offset, text.size());
  size_t line = 1, column = 1;
  for (size_t i = 0; i < offset; ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else if ((static_cast<uint8_t>(text[i]) >> 6) != 2) {  // count code points, not bytes
      ++column;
    }
  }
  return "line " + std::to_string(line) + ", column " + std::to_string(column);
}

std::string describe(char c) {
  if (c == '\0') return "end of input";
  if (c == '\n') return "end of line";
  const auto byte = static_cast<uint8_t>(c);
  if (byte < 0x20 || byte >= 0x7F) return "byte " + std::to_string(byte);
  return std::string("'") + c + "'";
}

// Recursive descent over GBNF with llama.cpp's rules (whitespace, newlines ending a rule
// outside parentheses, repetition rewritten into made rules, symbol ids in order of first
// mention) and bounded nesting.
class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  std::vector<RuleDraft> parse() {
    if (const size_t nul = text_.find('\0'); nul != std::string_view::npos) fail(nul, "NUL byte in the grammar");
    size_t pos = skip_space(0, true);
    while (pos < text_.size()) pos = parse_rule(pos);
    return std::move(rules_);
  }

  uint32_t find(std::string_view name) const {
    const auto it = symbols_.find(name);
    return it == symbols_.end() ? kNone : it->second;
  }

  [[noreturn]] void fail(size_t offset, const std::string& what) const {
    throw GrammarError(line_and_column(text_, offset) + ": " + what, offset);
  }

 private:
  char at(size_t i) const { return i < text_.size() ? text_[i] : '\0'; }

  size_t skip_space(size_t pos, bool newline_ok) const {
    for (;;) {
      const char c = at(pos);
      if (c == ' ' || c == '\t' || (newline_ok && (c == '\r' || c == '\n'))) {
        ++pos;
      } else if (c == '#') {
        while (pos < text_.size() && at(pos) != '\r' && at(pos) != '\n') ++pos;
      } else {
        return pos;
      }
    }
  }

  size_t name_end(size_t pos) const {
    while (is_word_char(at(pos))) ++pos;
    return pos;
  }

  uint32_t symbol(std::string_view name) {
    const auto it = symbols_.find(name);
    if (it != symbols_.end()) return it->second;
    const auto id = static_cast<uint32_t>(rules_.size());
    rules_.push_back(RuleDraft{});
    rules_.back().name = std::string(name);
    symbols_.emplace(std::string(name), id);
    return id;
  }

  uint32_t make_rule(uint32_t owner, size_t offset) {
    const auto id = static_cast<uint32_t>(rules_.size());
    rules_.push_back(RuleDraft{});
    rules_.back().owner = owner;
    rules_.back().defined_at = offset;
    return id;
  }

  // Every element pushed counts (erased ones too): a bound on memory, not an exact size.
  void spend(uint64_t elements, size_t offset) {
    if (elements > kGrammarMaxElements - elements_) {
      fail(offset, "the grammar expands to more than " + std::to_string(kGrammarMaxElements) + " elements");
    }
    elements_ += static_cast<size_t>(elements);
  }

  void push(std::vector<Element>& body, Kind kind, uint32_t value, size_t offset) {
    spend(1, offset);
    body.push_back({kind, value});
  }

  size_t parse_rule(size_t pos) {
    const size_t end = name_end(pos);
    if (end == pos) fail(pos, "expected a rule name, found " + describe(at(pos)));
    const std::string_view name = text_.substr(pos, end - pos);
    const uint32_t id = symbol(name);
    size_t p = skip_space(end, false);
    if (text_.substr(p, 3) != "::=") fail(p, "expected '::=' after the rule name '" + std::string(name) + "'");
    rules_[id].defined_at = pos;
    p = parse_alternates(skip_space(p + 3, true), id, id, false, 0);
    if (at(p) == '\r') {
      p += at(p + 1) == '\n' ? 2 : 1;
    } else if (at(p) == '\n') {
      ++p;
    } else if (p < text_.size()) {
      fail(p, "expected the end of the line after the rule '" + std::string(name) + "', found " + describe(at(p)));
    }
    return skip_space(p, true);
  }

  size_t parse_alternates(size_t pos, uint32_t owner, uint32_t rule_id, bool nested, size_t depth) {
    std::vector<Element> body;
    pos = parse_sequence(pos, owner, body, nested, depth);
    while (at(pos) == '|') {
      push(body, Kind::Alt, 0, pos);
      pos = parse_sequence(skip_space(pos + 1, true), owner, body, nested, depth);
    }
    push(body, Kind::End, 0, pos);
    rules_[rule_id].body = std::move(body);  // a later definition replaces an earlier one
    rules_[rule_id].defined = true;
    return pos;
  }

  std::pair<uint64_t, size_t> parse_count(size_t pos) const {
    uint64_t value = 0;
    for (; is_digit(at(pos)); ++pos) {
      value = std::min<uint64_t>(value * 10 + static_cast<uint64_t>(at(pos) - '0'), 1'000'000'000'000ull);
    }
    return {value, pos};
  }

  std::pair<uint32_t, size_t> parse_hex(size_t escape, size_t digits) const {
    uint32_t value = 0;
    for (size_t i = 0; i < digits; ++i) {
      const char c = at(escape + 2 + i);
      uint32_t digit = 0;
      if (is_digit(c)) {
        digit = static_cast<uint32_t>(c - '0');
      } else if ('a' <= c && c <= 'f') {
        digit = static_cast<uint32_t>(c - 'a' + 10);
      } else if ('A' <= c && c <= 'F') {
        digit = static_cast<uint32_t>(c - 'A' + 10);
      } else {
        fail(escape, "expected " + std::to_string(digits) + " hex digits after '\\" + at(escape + 1) + "'");
      }
      value = (value << 4) | digit;
    }
    return {value, escape + 2 + digits};
  }

  // One character of a literal or class: an escape or a UTF-8 sequence.
  std::pair<uint32_t, size_t> parse_char(size_t pos) const {
    if (at(pos) == '\\') {
      switch (const char c = at(pos + 1)) {
        case 'x': return parse_hex(pos, 2);
        case 'u': return parse_hex(pos, 4);
        case 'U': return parse_hex(pos, 8);
        case 't': return {'\t', pos + 2};
        case 'r': return {'\r', pos + 2};
        case 'n': return {'\n', pos + 2};
        case '\\': case '"': case '[': case ']': case '-': return {static_cast<uint32_t>(c), pos + 2};
        default: fail(pos, "unknown escape '\\" + std::string(c ? 1 : 0, c) + "'");
      }
    }
    const auto first = static_cast<uint8_t>(at(pos));
    const int length = sequence_length(first);
    if (length == 0 || (first >= 0xF8)) fail(pos, "invalid UTF-8");
    uint32_t value = first & ((1u << (8 - (length == 1 ? 1 : length + 1))) - 1);
    for (int i = 1; i < length; ++i) {
      const auto b = static_cast<uint8_t>(at(pos + static_cast<size_t>(i)));
      if ((b >> 6) != 2) fail(pos, "invalid UTF-8");
      value = (value << 6) | (b & 0x3Fu);
    }
    return {value, pos + static_cast<size_t>(length)};
  }

  size_t parse_sequence(size_t pos, uint32_t owner, std::vector<Element>& rule, bool nested, size_t depth) {
    size_t last_start = rule.size();  // where the item a repetition applies to begins
    uint64_t item_rules = 1;          // rules made for that item (llama.cpp's guard on nesting)

    // llama.cpp's rewrite: S{m,n} -> S repeated m times, then n - m nested optional rules
    // (S' ::= S S'' |); S{m,} -> S repeated m times, then S' ::= S S' |.
    const auto repeat = [&](size_t op, uint64_t min, uint64_t max) {
      if (last_start == rule.size()) fail(op, "expected an item before the repetition operator");
      const std::vector<Element> item(rule.begin() + static_cast<ptrdiff_t>(last_start), rule.end());
      const bool unbounded = max == kUnbounded;
      const uint64_t made = !unbounded && max > 0 ? max : std::max<uint64_t>(min, 1);
      if (item_rules * made >= kGrammarMaxRepetition) {
        fail(op, "repetition too large: " + std::to_string(item_rules) + " rule(s) repeated " + std::to_string(made) +
                     " times reach the limit " + std::to_string(kGrammarMaxRepetition));
      }
      const uint64_t optional = unbounded ? 1 : max - min;
      spend((min > 1 ? min - 1 : 0) * item.size() + optional * (item.size() + 3) + 1, op);
      if (min == 0) {
        rule.resize(last_start);
      } else {
        for (uint64_t i = 1; i < min; ++i) rule.insert(rule.end(), item.begin(), item.end());
      }
      uint32_t last_made = 0;
      for (uint64_t i = 0; i < optional; ++i) {
        const uint32_t id = make_rule(owner, op);
        std::vector<Element> body = item;
        if (i > 0 || unbounded) body.push_back({Kind::RuleRef, unbounded ? id : last_made});
        body.push_back({Kind::Alt, 0});
        body.push_back({Kind::End, 0});
        rules_[id].body = std::move(body);
        rules_[id].defined = true;
        last_made = id;
      }
      if (optional > 0) rule.push_back({Kind::RuleRef, last_made});
      item_rules *= made;
    };

    while (pos < text_.size()) {
      const char c = at(pos);
      const size_t start = pos;
      if (c == '"') {
        last_start = rule.size();
        item_rules = 1;
        for (++pos; at(pos) != '"';) {
          if (pos >= text_.size()) fail(start, "unterminated literal: expected a closing '\"'");
          const auto [cp, next] = parse_char(pos);
          push(rule, Kind::Char, cp, pos);
          pos = next;
        }
        pos = skip_space(pos + 1, nested);
      } else if (c == '[') {
        Kind first_kind = Kind::Char;
        if (at(++pos) == '^') {
          ++pos;
          first_kind = Kind::CharNot;
        }
        last_start = rule.size();
        item_rules = 1;
        while (at(pos) != ']') {
          if (pos >= text_.size()) fail(start, "unterminated character class: expected a closing ']'");
          const auto [cp, next] = parse_char(pos);
          push(rule, rule.size() > last_start ? Kind::CharAlt : first_kind, cp, pos);
          pos = next;
          if (at(pos) == '-' && at(pos + 1) != ']') {
            if (pos + 1 >= text_.size()) fail(start, "unterminated character class: expected a closing ']'");
            const auto [upper, after] = parse_char(pos + 1);
            push(rule, Kind::CharRangeUpper, upper, pos);
            pos = after;
          }
        }
        pos = skip_space(pos + 1, nested);
      } else if (c == '<' || c == '!') {
        fail(pos, "token references (<[id]>, <text>, !<...>) are not supported");
      } else if (is_word_char(c)) {
        const size_t end = name_end(pos);
        const uint32_t id = symbol(text_.substr(pos, end - pos));
        rules_[id].first_use = std::min(rules_[id].first_use, pos);
        last_start = rule.size();
        item_rules = 1;
        push(rule, Kind::RuleRef, id, pos);
        pos = skip_space(end, nested);
      } else if (c == '(') {
        if (depth + 1 > kGrammarMaxNesting) {
          fail(pos, "parentheses nested deeper than " + std::to_string(kGrammarMaxNesting) + " levels");
        }
        const size_t rules_before = rules_.size();
        const uint32_t id = make_rule(owner, pos);
        pos = parse_alternates(skip_space(pos + 1, true), owner, id, true, depth + 1);
        item_rules = std::max<uint64_t>(1, rules_.size() - rules_before);
        last_start = rule.size();
        push(rule, Kind::RuleRef, id, start);
        if (at(pos) != ')') {
          fail(pos, "expected ')' to close the '(' at " + line_and_column(text_, start) + ", found " + describe(at(pos)));
        }
        pos = skip_space(pos + 1, nested);
      } else if (c == '.') {
        last_start = rule.size();
        item_rules = 1;
        push(rule, Kind::CharAny, 0, pos);
        pos = skip_space(pos + 1, nested);
      } else if (c == '*' || c == '+' || c == '?') {
        pos = skip_space(pos + 1, nested);
        repeat(start, c == '+' ? 1 : 0, c == '?' ? 1 : kUnbounded);
      } else if (c == '{') {
        pos = skip_space(pos + 1, nested);
        if (!is_digit(at(pos))) fail(pos, "expected a number after '{', found " + describe(at(pos)));
        auto [min, after_min] = parse_count(pos);
        pos = skip_space(after_min, nested);
        uint64_t max = kUnbounded;
        if (at(pos) == '}') {
          max = min;
          pos = skip_space(pos + 1, nested);
        } else if (at(pos) == ',') {
          pos = skip_space(pos + 1, nested);
          if (is_digit(at(pos))) {
            const auto [value, after_max] = parse_count(pos);
            max = value;
            pos = skip_space(after_max, nested);
          }
          if (at(pos) != '}') fail(pos, "expected '}' to close the repetition, found " + describe(at(pos)));
          pos = skip_space(pos + 1, nested);
        } else {
          fail(pos, "expected ',' or '}' in the repetition, found " + describe(at(pos)));
        }
        if (min > kGrammarMaxRepetition) {
          fail(start, "repetition minimum " + std::to_string(min) + " is above the limit " +
                          std::to_string(kGrammarMaxRepetition));
        }
        if (max < min) {
          fail(start, "repetition maximum " + std::to_string(max) + " is below the minimum " + std::to_string(min));
        }
        if (max != kUnbounded && max > kGrammarMaxRepetition) max = kUnbounded;  // as llama.cpp does
        repeat(start, min, max);
      } else {
        break;
      }
    }
    return pos;
  }

  std::string_view text_;
  std::vector<RuleDraft> rules_;  // by symbol id
  std::map<std::string, uint32_t, std::less<>> symbols_;
  size_t elements_ = 0;
};

// ---------------------------------------------------------------------------------------
// Stacks and their simulation

constexpr int32_t kDead = -1;      // no stack survives
constexpr int32_t kOverflow = -2;  // a limit was passed
constexpr int32_t kUnknown = -3;   // transition not computed yet
constexpr size_t kMaxForestNodes = 4'000'000;
constexpr size_t kMaxExpansionVisits = 200'000;
constexpr size_t kMaxStateIds = 16'000'000;  // all states of one simulation together
constexpr size_t kMaxAsciiTables = 4096;

// Stacks shared as a tree: node id = (element on top, node below), hash-consed so that equal
// stacks have equal ids. Node 0 is the empty stack.
class StackForest {
 public:
  static constexpr uint32_t kFull = kNone;

  StackForest() : nodes_{{0, 0, 0}} {}
  uint32_t push(uint32_t below, uint32_t element) {
    if (below == kFull) return kFull;
    const uint64_t key = (static_cast<uint64_t>(below) << 32) | element;
    const auto found = index_.find(key);
    if (found != index_.end()) return found->second;
    if (nodes_.size() >= kMaxForestNodes) return kFull;
    const auto id = static_cast<uint32_t>(nodes_.size());
    nodes_.push_back({element, below, nodes_[below].depth + 1});
    index_.emplace(key, id);
    return id;
  }
  uint32_t top(uint32_t id) const { return nodes_[id].top; }
  uint32_t below(uint32_t id) const { return nodes_[id].below; }
  uint32_t depth(uint32_t id) const { return nodes_[id].depth; }
  size_t size() const { return nodes_.size(); }

 private:
  struct Node {
    uint32_t top, below, depth;
  };
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, uint32_t> index_;
};

struct IdsHash {
  size_t operator()(const std::vector<uint32_t>& ids) const {
    uint64_t h = 1469598103934665603ull;
    for (const uint32_t id : ids) h = (h ^ id) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

// The sets of stacks a matcher passes through, as a lazily built automaton over code points:
// a state is a sorted set of stack ids; a transition on a code point is computed once and
// cached, so that many tokens sharing prefixes (or characters) share the work.
class Simulation {
 public:
  explicit Simulation(const Rules& rules) : rules_(rules) {}

  // The state of these stacks (bottom first) after expanding rule references on their tops.
  int32_t seed(const std::vector<std::vector<uint32_t>>& stacks) {
    std::vector<uint32_t> ids;
    for (const auto& stack : stacks) {
      uint32_t id = 0;
      for (const uint32_t element : stack) id = forest_.push(id, element);
      if (!expand(id, ids)) return kOverflow;
    }
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    return intern(std::move(ids));
  }

  int32_t step(int32_t state, uint32_t cp) {
    if (cp < 128 && states_[static_cast<size_t>(state)].ascii) {
      const int32_t cached = states_[static_cast<size_t>(state)].ascii[cp];
      if (cached != kUnknown) return cached;
    } else if (cp >= 128) {
      const auto it = transitions_.find((static_cast<uint64_t>(state) << 32) | cp);
      if (it != transitions_.end()) return it->second;
    }
    const int32_t next = compute_step(state, cp);
    State& s = states_[static_cast<size_t>(state)];
    if (cp < 128 && s.ascii) {
      s.ascii[cp] = next;
    } else if (cp >= 128) {
      transitions_.emplace((static_cast<uint64_t>(state) << 32) | cp, next);
    }
    return next;
  }

  // Whether a token may end in this state, its last character cut as `tail`.
  bool accepts_end(int32_t state, PartialUtf8 tail) const {
    if (state < 0 || tail.remaining < 0) return false;
    if (tail.remaining == 0) return true;
    for (const uint32_t id : states_[static_cast<size_t>(state)].ids) {
      if (id != 0 && rules_.may_match(class_of(id), tail)) return true;
    }
    return false;
  }

  std::vector<std::vector<uint32_t>> stacks(int32_t state) const {
    std::vector<std::vector<uint32_t>> out;
    for (uint32_t id : states_[static_cast<size_t>(state)].ids) {
      std::vector<uint32_t> stack(forest_.depth(id));
      for (size_t i = stack.size(); i-- > 0; id = forest_.below(id)) stack[i] = forest_.top(id);
      out.push_back(std::move(stack));
    }
    return out;
  }

 private:
  struct State {
    std::vector<uint32_t> ids;
    std::unique_ptr<int32_t[]> ascii;  // transitions on code points below 128
  };
  struct Successors {
    bool ok = true;
    std::vector<uint32_t> ids;
  };

  const CharClass& class_of(uint32_t id) const { return rules_.classes[rules_.class_at[forest_.top(id)]]; }

  // Appends the stacks `start` turns into once rule references on top are replaced by their
  // alternatives, until each top is a character class or the stack is empty. Iterative, with
  // a visited set (llama.cpp's advance_stack); false when a limit is passed.
  bool expand(uint32_t start, std::vector<uint32_t>& out) {
    ++epoch_;
    size_t visits = 0;
    std::vector<uint32_t> todo{start};
    while (!todo.empty()) {
      const uint32_t id = todo.back();
      todo.pop_back();
      if (id == StackForest::kFull) return false;
      if (visited_.size() <= id) visited_.resize(forest_.size() * 2, 0);
      if (visited_[id] == epoch_) continue;
      visited_[id] = epoch_;
      if (++visits > kMaxExpansionVisits) return false;
      const uint32_t top = forest_.top(id);
      if (id == 0 || rules_.class_at[top] != kNone) {
        out.push_back(id);
        if (out.size() > kGrammarMaxStacks) return false;
        continue;
      }
      const uint32_t rule = rules_.elements[top].value;
      const uint32_t rest = rules_.is_end(top + 1) ? forest_.below(id) : forest_.push(forest_.below(id), top + 1);
      for (uint32_t a = rules_.rule_alternatives[rule]; a < rules_.rule_alternatives[rule + 1]; ++a) {
        const uint32_t begin = rules_.alternatives[a];
        todo.push_back(rules_.is_end(begin) ? rest : forest_.push(rest, begin));
      }
    }
    return true;
  }

  // The stacks after the class on top of `id` matched a character (the same for any character).
  const Successors& successors(uint32_t id) {
    const auto found = successors_.find(id);
    if (found != successors_.end()) return found->second;
    Successors s;
    const uint32_t next = class_of(id).next;
    const uint32_t below = forest_.below(id);
    s.ok = expand(rules_.is_end(next) ? below : forest_.push(below, next), s.ids);
    std::sort(s.ids.begin(), s.ids.end());
    return successors_.emplace(id, std::move(s)).first->second;
  }

  int32_t compute_step(int32_t state, uint32_t cp) {
    std::vector<uint32_t> next;
    int matched = 0;
    for (size_t i = 0; i < states_[static_cast<size_t>(state)].ids.size(); ++i) {
      const uint32_t id = states_[static_cast<size_t>(state)].ids[i];
      if (id == 0 || !rules_.matches(class_of(id), cp)) continue;
      const Successors& s = successors(id);
      if (!s.ok) return kOverflow;
      next.insert(next.end(), s.ids.begin(), s.ids.end());
      ++matched;
    }
    if (matched > 1) {
      std::sort(next.begin(), next.end());
      next.erase(std::unique(next.begin(), next.end()), next.end());
    }
    return intern(std::move(next));
  }

  int32_t intern(std::vector<uint32_t> ids) {
    if (ids.empty()) return kDead;
    if (ids.size() > kGrammarMaxStacks) return kOverflow;
    size_t elements = 0;
    for (const uint32_t id : ids) elements += forest_.depth(id);
    if (elements > kGrammarMaxStackElements) return kOverflow;
    const auto found = index_.find(ids);
    if (found != index_.end()) return found->second;
    if (state_ids_ + ids.size() > kMaxStateIds) return kOverflow;
    state_ids_ += ids.size();
    const auto state = static_cast<int32_t>(states_.size());
    State s;
    s.ids = ids;
    if (states_.size() < kMaxAsciiTables) {
      s.ascii = std::make_unique<int32_t[]>(128);
      std::fill_n(s.ascii.get(), 128, kUnknown);
    }
    states_.push_back(std::move(s));
    index_.emplace(std::move(ids), state);
    return state;
  }

  const Rules& rules_;
  StackForest forest_;
  std::vector<uint32_t> visited_;
  uint32_t epoch_ = 0;
  std::unordered_map<uint32_t, Successors> successors_;
  std::vector<State> states_;
  std::unordered_map<std::vector<uint32_t>, int32_t, IdsHash> index_;
  std::unordered_map<uint64_t, int32_t> transitions_;  // code points from 128 on
  size_t state_ids_ = 0;
};

// Follows a token's code points from `state`: the state after it, kDead, or kOverflow.
int32_t follow(Simulation& simulation, int32_t state, std::span<const uint32_t> code_points, PartialUtf8 tail) {
  for (const uint32_t cp : code_points) {
    state = simulation.step(state, cp);
    if (state < 0) return state;
  }
  return simulation.accepts_end(state, tail) ? state : kDead;
}

// ---------------------------------------------------------------------------------------
// Checks after parsing

std::string display_name(const std::vector<RuleDraft>& drafts, uint32_t id) {
  const RuleDraft& d = drafts[id];
  return d.owner == kNone ? d.name : drafts[d.owner].name + "_" + std::to_string(id);
}

Rules lay_out(const std::vector<RuleDraft>& drafts, uint32_t root) {
  Rules r;
  r.root = root;
  for (uint32_t id = 0; id < drafts.size(); ++id) {
    r.rule_begin.push_back(static_cast<uint32_t>(r.elements.size()));
    r.names.push_back(display_name(drafts, id));
    r.elements.insert(r.elements.end(), drafts[id].body.begin(), drafts[id].body.end());
  }
  r.class_at.assign(r.elements.size(), kNone);
  for (uint32_t id = 0; id < drafts.size(); ++id) {
    r.rule_alternatives.push_back(static_cast<uint32_t>(r.alternatives.size()));
    uint32_t at = r.rule_begin[id];
    r.alternatives.push_back(at);
    for (; r.elements[at].kind != Kind::End; ++at) {
      if (r.elements[at].kind == Kind::Alt) r.alternatives.push_back(at + 1);
    }
  }
  r.rule_alternatives.push_back(static_cast<uint32_t>(r.alternatives.size()));
  for (uint32_t at = 0; at < r.elements.size(); ++at) {
    const Kind kind = r.elements[at].kind;
    if (kind != Kind::Char && kind != Kind::CharNot && kind != Kind::CharAny) continue;
    CharClass c;
    c.negated = kind == Kind::CharNot;
    c.any = kind == Kind::CharAny;
    c.first_range = static_cast<uint32_t>(r.ranges.size());
    uint32_t next = at + 1;
    if (!c.any) {
      uint32_t i = at;
      do {
        uint32_t lo = r.elements[i].value, hi = lo;
        if (r.elements[i + 1].kind == Kind::CharRangeUpper) hi = r.elements[++i].value;
        r.ranges.emplace_back(lo, hi);
        ++i;
      } while (r.elements[i].kind == Kind::CharAlt);
      next = i;
    }
    c.range_count = static_cast<uint32_t>(r.ranges.size()) - c.first_range;
    c.next = next;
    for (uint32_t k = 0; k < c.range_count; ++k) {
      const auto [lo, hi] = r.ranges[c.first_range + k];
      for (uint32_t cp = lo; cp <= std::min<uint32_t>(hi, 127); ++cp) c.ascii[cp >> 6] |= uint64_t{1} << (cp & 63);
    }
    if (c.any || c.negated) {
      c.ascii[0] = ~c.ascii[0];
      c.ascii[1] = ~c.ascii[1];
    }
    r.class_at[at] = static_cast<uint32_t>(r.classes.size());
    r.classes.push_back(c);
  }
  return r;
}

// A rule that can begin with itself (through rules that may match nothing) would make the
// matcher loop; llama.cpp refuses such grammars. Nullability is computed to a fixed point
// and the cycle search is iterative, so neither deep grammars nor long chains overflow.
std::optional<uint32_t> find_left_recursion(const Rules& r) {
  const auto n = static_cast<uint32_t>(r.rule_begin.size());
  const auto n_alts = static_cast<uint32_t>(r.alternatives.size());
  std::vector<uint32_t> alt_rule(n_alts), pending(n_alts, 0);
  std::vector<std::vector<uint32_t>> users(n);
  std::vector<bool> nullable(n, false);
  std::vector<uint32_t> ready;
  for (uint32_t id = 0; id < n; ++id) {
    for (uint32_t a = r.rule_alternatives[id]; a < r.rule_alternatives[id + 1]; ++a) {
      alt_rule[a] = id;
      bool only_refs = true;
      for (uint32_t at = r.alternatives[a]; !r.is_end(at); ++at) only_refs &= r.elements[at].kind == Kind::RuleRef;
      if (!only_refs) continue;
      for (uint32_t at = r.alternatives[a]; !r.is_end(at); ++at) {
        users[r.elements[at].value].push_back(a);
        ++pending[a];
      }
      if (pending[a] == 0 && !nullable[id]) {
        nullable[id] = true;
        ready.push_back(id);
      }
    }
  }
  while (!ready.empty()) {
    const uint32_t id = ready.back();
    ready.pop_back();
    for (const uint32_t a : users[id]) {
      if (--pending[a] == 0 && !nullable[alt_rule[a]]) {
        nullable[alt_rule[a]] = true;
        ready.push_back(alt_rule[a]);
      }
    }
  }
  // Edges to the rules each rule may begin with.
  std::vector<std::vector<uint32_t>> begins(n);
  for (uint32_t a = 0; a < n_alts; ++a) {
    for (uint32_t at = r.alternatives[a]; !r.is_end(at) && r.elements[at].kind == Kind::RuleRef; ++at) {
      begins[alt_rule[a]].push_back(r.elements[at].value);
      if (!nullable[r.elements[at].value]) break;
    }
  }
  enum : uint8_t { kWhite, kGrey, kBlack };
  std::vector<uint8_t> color(n, kWhite);
  std::vector<std::pair<uint32_t, size_t>> path;
  for (uint32_t start = 0; start < n; ++start) {
    if (color[start] != kWhite) continue;
    color[start] = kGrey;
    path.push_back({start, 0});
    while (!path.empty()) {
      auto& [id, next] = path.back();
      if (next == begins[id].size()) {
        color[id] = kBlack;
        path.pop_back();
        continue;
      }
      const uint32_t to = begins[id][next++];
      if (color[to] == kGrey) return to;
      if (color[to] == kWhite) {
        color[to] = kGrey;
        path.push_back({to, 0});
      }
    }
  }
  return std::nullopt;
}

void append_char(std::string& out, uint32_t cp) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  const auto hex = [&](char kind, int digits) {
    out += '\\';
    out += kind;
    for (int i = digits - 1; i >= 0; --i) out += kHex[(cp >> (4 * i)) & 0xF];
  };
  if (cp == '\t') {
    out += "\\t";
  } else if (cp == '\n') {
    out += "\\n";
  } else if (cp == '\r') {
    out += "\\r";
  } else if (cp == '\\' || cp == ']' || cp == '[' || cp == '-' || cp == '"') {
    out += '\\';
    out += static_cast<char>(cp);
  } else if (cp == '^' || cp < 0x20 || cp == 0x7F) {
    hex('x', 2);
  } else if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp <= 0xFFFF) {
    hex('u', 4);
  } else {
    hex('U', 8);
  }
}

}  // namespace
}  // namespace grammar_detail

using namespace grammar_detail;

// ---------------------------------------------------------------------------------------
// Grammar

Grammar::Grammar(std::unique_ptr<const Rules> rules) : rules_(std::move(rules)) {}
Grammar::~Grammar() = default;

std::shared_ptr<const Grammar> Grammar::parse(std::string_view text, std::string_view root) {
  Parser parser(text);
  std::vector<RuleDraft> drafts = parser.parse();
  size_t undefined_at = std::string_view::npos;
  uint32_t undefined = kNone;
  for (uint32_t id = 0; id < drafts.size(); ++id) {
    if (!drafts[id].defined && drafts[id].first_use < undefined_at) {
      undefined_at = drafts[id].first_use;
      undefined = id;
    }
  }
  if (undefined != kNone) parser.fail(undefined_at, "undefined rule '" + drafts[undefined].name + "'");
  const uint32_t root_id = parser.find(root);
  if (root_id == kNone) parser.fail(0, "the grammar has no rule '" + std::string(root) + "' to start from");

  auto rules = std::make_unique<Rules>(lay_out(drafts, root_id));
  if (const auto recursive = find_left_recursion(*rules)) {
    parser.fail(drafts[*recursive].defined_at, "left recursion: rule '" + rules->names[*recursive] +
                                                   "' can begin with itself, which GBNF does not support");
  }
  Simulation simulation(*rules);
  std::vector<std::vector<uint32_t>> seeds;
  for (uint32_t a = rules->rule_alternatives[root_id]; a < rules->rule_alternatives[root_id + 1]; ++a) {
    const uint32_t begin = rules->alternatives[a];
    seeds.push_back(rules->is_end(begin) ? std::vector<uint32_t>{} : std::vector<uint32_t>{begin});
  }
  const int32_t start = simulation.seed(seeds);
  if (start < 0) {
    parser.fail(drafts[root_id].defined_at, "the grammar is too ambiguous: its start needs more than " +
                                                std::to_string(kGrammarMaxStacks) + " stacks");
  }
  rules->initial_stacks = simulation.stacks(start);
  return std::shared_ptr<const Grammar>(new Grammar(std::move(rules)));
}

size_t Grammar::rule_count() const { return rules_->rule_begin.size(); }
size_t Grammar::element_count() const { return rules_->elements.size(); }

std::string Grammar::to_string() const {
  const Rules& r = *rules_;
  std::string out;
  for (uint32_t id = 0; id < r.rule_begin.size(); ++id) {
    out += r.names[id] + " ::=";
    for (uint32_t at = r.rule_begin[id]; r.elements[at].kind != Kind::End;) {
      const Element& e = r.elements[at];
      if (e.kind == Kind::Alt) {
        out += " |";
        ++at;
      } else if (e.kind == Kind::RuleRef) {
        out += " " + r.names[e.value];
        ++at;
      } else if (e.kind == Kind::CharAny) {
        out += " .";
        ++at;
      } else {
        const CharClass& c = r.classes[r.class_at[at]];
        out += c.negated ? " [^" : " [";
        for (uint32_t k = 0; k < c.range_count; ++k) {
          const auto [lo, hi] = r.ranges[c.first_range + k];
          append_char(out, lo);
          if (hi != lo) {
            out += '-';
            append_char(out, hi);
          }
        }
        out += ']';
        at = c.next;
      }
    }
    out += '\n';
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// Vocabulary

GrammarVocabulary::GrammarVocabulary(std::vector<std::string> pieces_in, std::vector<bool> end_of_generation_in)
    : pieces(std::move(pieces_in)), end_of_generation(std::move(end_of_generation_in)) {
  if (pieces.size() != end_of_generation.size()) {
    throw std::invalid_argument("GrammarVocabulary: pieces and end_of_generation differ in size");
  }
  decoded_.resize(pieces.size());
  std::vector<uint32_t> scratch;
  for (size_t token = 0; token < pieces.size(); ++token) {
    DecodedPiece& d = decoded_[token];
    const std::string& piece = pieces[token];
    if (end_of_generation[token]) {
      d.kind = DecodedPiece::Kind::EndOfGeneration;
    } else if (piece.empty() || piece[0] == '\0') {
      d.kind = DecodedPiece::Kind::Never;
    } else {
      scratch.clear();
      d.tail = decode_utf8(piece, PartialUtf8{}, scratch);
      d.kind = d.tail.remaining < 0 ? DecodedPiece::Kind::Invalid : DecodedPiece::Kind::Text;
      d.first = static_cast<uint32_t>(code_points_.size());
      d.count = static_cast<uint32_t>(scratch.size());
      code_points_.insert(code_points_.end(), scratch.begin(), scratch.end());
    }
  }
}

// ---------------------------------------------------------------------------------------
// Matcher

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar,
                               std::shared_ptr<const GrammarVocabulary> vocabulary)
    : grammar_(std::move(grammar)), vocabulary_(std::move(vocabulary)) {
  if (!grammar_ || !vocabulary_) throw std::invalid_argument("GrammarMatcher: null grammar or vocabulary");
  stacks_ = grammar_->rules().initial_stacks;
}

bool GrammarMatcher::complete() const {
  return std::any_of(stacks_.begin(), stacks_.end(), [](const auto& stack) { return stack.empty(); });
}

bool GrammarMatcher::finished() const { return stacks_.size() == 1 && stacks_.front().empty(); }

namespace {
// A token's code points and cut tail from the matcher's position: the vocabulary's decoding
// when no character is pending, else decoded here into `scratch`.
bool token_text(const GrammarVocabulary& vocabulary, size_t token, PartialUtf8 pending, std::vector<uint32_t>& scratch,
                std::span<const uint32_t>& code_points, PartialUtf8& tail) {
  const DecodedPiece& d = vocabulary.decoded(token);
  if (d.kind == DecodedPiece::Kind::Never || d.kind == DecodedPiece::Kind::EndOfGeneration) return false;
  if (pending.remaining == 0) {
    if (d.kind == DecodedPiece::Kind::Invalid) return false;
    code_points = vocabulary.code_points(d);
    tail = d.tail;
    return true;
  }
  scratch.clear();
  tail = decode_utf8(vocabulary.pieces[token], pending, scratch);
  code_points = scratch;
  return tail.remaining >= 0;
}
}  // namespace

bool GrammarMatcher::allows(int32_t token) const {
  if (token < 0 || static_cast<size_t>(token) >= vocabulary_->size()) return false;
  if (vocabulary_->end_of_generation[static_cast<size_t>(token)]) return complete();
  std::vector<uint32_t> scratch;
  std::span<const uint32_t> code_points;
  PartialUtf8 tail;
  if (!token_text(*vocabulary_, static_cast<size_t>(token), partial_, scratch, code_points, tail)) return false;
  Simulation simulation(grammar_->rules());
  const int32_t start = simulation.seed(stacks_);
  return start >= 0 && follow(simulation, start, code_points, tail) >= 0;
}

void GrammarMatcher::constrain(std::span<const int32_t> ids, std::span<float> logits) const {
  if (ids.size() != logits.size()) {
    throw std::invalid_argument("GrammarMatcher::constrain: ids and logits differ in size");
  }
  const bool can_end = complete();
  Simulation simulation(grammar_->rules());
  const int32_t start = simulation.seed(stacks_);
  std::vector<uint32_t> scratch;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t token = ids[i];
    bool allowed = false;
    if (token >= 0 && static_cast<size_t>(token) < vocabulary_->size()) {
      const auto t = static_cast<size_t>(token);
      std::span<const uint32_t> code_points;
      PartialUtf8 tail;
      if (vocabulary_->end_of_generation[t]) {
        allowed = can_end;
      } else if (start >= 0 && token_text(*vocabulary_, t, partial_, scratch, code_points, tail)) {
        allowed = follow(simulation, start, code_points, tail) >= 0;
      }
    }
    if (!allowed) logits[i] = -std::numeric_limits<float>::infinity();
  }
}

void GrammarMatcher::accept(int32_t token) {
  if (token < 0 || static_cast<size_t>(token) >= vocabulary_->size()) {
    throw std::logic_error("GrammarMatcher::accept: token " + std::to_string(token) + " is outside the vocabulary");
  }
  const auto t = static_cast<size_t>(token);
  if (vocabulary_->end_of_generation[t]) {
    if (!complete()) throw std::logic_error("GrammarMatcher::accept: the grammar cannot end here");
    return;
  }
  std::vector<uint32_t> scratch;
  std::span<const uint32_t> code_points;
  PartialUtf8 tail;
  const bool decoded = token_text(*vocabulary_, t, partial_, scratch, code_points, tail);
  advance(decoded, code_points, tail, "token " + std::to_string(token));
}

void GrammarMatcher::accept_text(std::string_view text) {
  std::vector<uint32_t> code_points;
  const PartialUtf8 tail = decode_utf8(text, partial_, code_points);
  advance(tail.remaining >= 0, code_points, tail, "text '" + std::string(text) + "'");
}

void GrammarMatcher::advance(bool decoded, std::span<const uint32_t> code_points, PartialUtf8 tail,
                             const std::string& what) {
  int32_t state = kDead;
  Simulation simulation(grammar_->rules());
  if (decoded) {
    state = simulation.seed(stacks_);
    if (state >= 0) state = follow(simulation, state, code_points, tail);
  }
  if (state == kOverflow) {
    throw GrammarAmbiguityError("the grammar is too ambiguous: " + what + " would need more than " +
                                std::to_string(kGrammarMaxStacks) + " stacks (or " +
                                std::to_string(kGrammarMaxStackElements) + " stack elements)");
  }
  if (state < 0) throw std::logic_error("GrammarMatcher::accept: " + what + " is not allowed by the grammar");
  stacks_ = simulation.stacks(state);
  partial_ = tail;
}

}  // namespace pico::sample
