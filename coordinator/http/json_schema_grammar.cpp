#include "http/json_schema_grammar.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

namespace pico::coordinator::http_api {

namespace {

using json = nlohmann::ordered_json;

// Bounds on what one request may make the converter do.
constexpr int kMaxSchemaDepth = 64;
constexpr size_t kMaxRules = 10'000;
constexpr size_t kMaxGrammarBytes = size_t{4} << 20;
constexpr size_t kMaxVisits = 100'000;
constexpr int64_t kMaxRepetition = 2'000;  // llama.cpp's GBNF parser refuses larger {m,n}
constexpr size_t kMaxPropertyNameBytes = 1'000;
constexpr size_t kMaxKeyTrieNodes = 20'000;  // characters of the names an additional key must differ from
constexpr int kMaxPatternNesting = 64;
constexpr size_t kMaxRuleNameHint = 48;
// The integral-part rule allows 16 digits, so integer bounds are clamped to that range.
constexpr int64_t kMaxIntegral = 9'999'999'999'999'999;
constexpr uint32_t kMaxCodePoint = 0x10FFFF;

// llama.cpp's whitespace: nothing, one space, or one or two newlines and some indentation.
constexpr const char* kSpaceRule = R"(| " " | "\n"{1,2} [ \t]{0,20})";

// Shared rules, added on first use; a generated rule never takes one of these names.
struct Primitive {
  const char* name;
  const char* body;
  std::vector<const char*> deps;
};

const std::vector<Primitive>& primitives() {
  static const std::vector<Primitive> table = {
      {"boolean", R"("true" | "false")", {}},
      {"null", R"("null")", {}},
      {"integral-part", R"([0] | [1-9] [0-9]{0,15})", {}},
      {"decimal-part", R"([0-9]{1,16})", {}},
      {"number",
       R"("-"? integral-part ("." decimal-part)? ([eE] [-+]? integral-part)?)",
       {"integral-part", "decimal-part"}},
      {"integer", R"("-"? integral-part)", {"integral-part"}},
      {"char", R"([^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4}))", {}},
      {"string", R"("\"" char* "\"")", {"char"}},
      {"value",
       "object | array | string | number | boolean | null",
       {"object", "array", "string", "number", "boolean", "null"}},
      {"object",
       R"("{" space ( string ":" space value ("," space string ":" space value)* )? space "}")",
       {"string", "value"}},
      {"array", R"("[" space ( value ("," space value)* )? space "]")", {"value"}},
      {"uuid",
       R"("\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12} "\"")",
       {}},
      {"date", R"([0-9]{4} "-" ("0" [1-9] | "1" [0-2]) "-" ("0" [1-9] | [1-2] [0-9] | "3" [0-1]))", {}},
      {"time",
       R"(([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{3})? ("Z" | [-+] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9]))",
       {}},
      {"date-time", R"(date "T" time)", {"date", "time"}},
      {"date-string", R"("\"" date "\"")", {"date"}},
      {"time-string", R"("\"" time "\"")", {"time"}},
      {"date-time-string", R"("\"" date-time "\"")", {"date-time"}},
  };
  return table;
}

const Primitive* find_primitive(std::string_view name) {
  for (const auto& p : primitives()) {
    if (name == p.name) return &p;
  }
  return nullptr;
}

bool is_reserved_name(std::string_view name) {
  return name == "root" || name == "space" || find_primitive(name) != nullptr;
}

// ---- Text helpers ----

std::string hex(uint32_t v, int digits) {
  static constexpr char kDigits[] = "0123456789ABCDEF";
  std::string s(static_cast<size_t>(digits), '0');
  for (int i = digits - 1; i >= 0; --i, v >>= 4) s[static_cast<size_t>(i)] = kDigits[v & 0xF];
  return s;
}

void append_utf8(std::string& out, uint32_t cp) {
  const int extra = cp < 0x80 ? 0 : cp < 0x800 ? 1 : cp < 0x10000 ? 2 : 3;
  static constexpr unsigned kLead[] = {0x00, 0xC0, 0xE0, 0xF0};
  out += static_cast<char>(kLead[extra] | (cp >> (6 * extra)));
  for (int k = extra - 1; k >= 0; --k) out += static_cast<char>(0x80 | ((cp >> (6 * k)) & 0x3F));
}

// Code points of UTF-8 text; nullopt when the text is not valid UTF-8.
std::optional<std::u32string> decode_utf8(std::string_view s) {
  std::u32string out;
  for (size_t i = 0; i < s.size();) {
    const auto lead = static_cast<unsigned char>(s[i]);
    const size_t extra = lead < 0x80 ? 0 : (lead & 0xE0) == 0xC0 ? 1 : (lead & 0xF0) == 0xE0 ? 2 : 3;
    if ((lead >= 0x80 && lead < 0xC0) || lead >= 0xF8 || i + extra >= s.size()) return std::nullopt;
    uint32_t cp = lead & (0x7Fu >> extra);
    for (size_t k = 1; k <= extra; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      if ((c & 0xC0) != 0x80) return std::nullopt;
      cp = (cp << 6) | (c & 0x3Fu);
    }
    if (cp > kMaxCodePoint) return std::nullopt;
    out += static_cast<char32_t>(cp);
    i += extra + 1;
  }
  return out;
}

// A GBNF string literal matching `text` exactly.
std::string gbnf_literal(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default: out += (u < 0x20 || u == 0x7F) ? "\\x" + hex(u, 2) : std::string(1, c);
    }
  }
  return out + "\"";
}

// One code point inside a GBNF character class: punctuation that is special there, and
// anything not plain ASCII, as a hex escape.
std::string class_char(uint32_t cp) {
  const bool plain =
      (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') ||
      (cp >= 0x20 && cp < 0x7F &&
       std::string_view(" !#$%&'()*+,./:;<=>?@_`{|}~").find(static_cast<char>(cp)) != std::string_view::npos);
  if (plain) return std::string(1, static_cast<char>(cp));
  if (cp < 0x100) return "\\x" + hex(cp, 2);
  if (cp < 0x10000) return "\\u" + hex(cp, 4);
  return "\\U" + hex(cp, 8);
}

bool is_rule_name(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(),
                                   [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'; });
}

// GBNF rule names are dashed lowercase words: other characters become dashes.
std::string sanitize_rule_name(std::string_view hint) {
  std::string out;
  for (const char c : hint) {
    if (out.size() >= kMaxRuleNameHint) break;
    const char lower = (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
    if ((lower >= 'a' && lower <= 'z') || (lower >= '0' && lower <= '9')) {
      out += lower;
    } else if (!out.empty() && out.back() != '-') {
      out += '-';
    }
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  if (out.empty() || !(out[0] >= 'a' && out[0] <= 'z')) out = "r-" + out;
  if (out.back() == '-') out.pop_back();
  return out;
}

std::string pointer_token(std::string_view key) {
  std::string out;
  for (const char c : key) out += c == '~' ? std::string("~0") : c == '/' ? std::string("~1") : std::string(1, c);
  return out;
}

std::string child_pointer(const std::string& ptr, std::string_view key) { return ptr + "/" + pointer_token(key); }

std::string shorten(std::string_view s) {
  return s.size() <= 80 ? std::string(s) : std::string(s.substr(0, 77)) + "...";
}

[[noreturn]] void fail(const std::string& ptr, const std::string& why) {
  // Long keys make long pointers: keep both ends.
  const std::string where = ptr.empty()         ? std::string("(root)")
                            : ptr.size() <= 200 ? ptr
                                                : ptr.substr(0, 100) + "..." + ptr.substr(ptr.size() - 100);
  throw SchemaError(where + ": " + why);
}

// The compact JSON text of a value, which a const or enum makes the model write verbatim.
std::string json_text(const json& value, const std::string& ptr) {
  try {
    return value.dump();
  } catch (const json::exception&) {
    fail(ptr, "holds a string that is not valid UTF-8");
  }
}

// x repeated min..max times (max nullopt: unbounded), optionally with a separator between.
std::string repetition(const std::string& item, int64_t min, std::optional<int64_t> max,
                       const std::string& separator = {}) {
  if (max && *max == 0) return {};
  if (!separator.empty()) {
    const std::string rest = repetition("(" + separator + " " + item + ")", min == 0 ? 0 : min - 1,
                                        max ? std::optional<int64_t>(*max - 1) : std::nullopt);
    std::string seq = rest.empty() ? item : item + " " + rest;
    return min == 0 ? "(" + seq + ")?" : seq;
  }
  if (min == 0 && max == 1) return item + "?";
  if (!max) {
    if (min == 0) return item + "*";
    if (min == 1) return item + "+";
    return item + "{" + std::to_string(min) + ",}";
  }
  if (min == 1 && *max == 1) return item;
  if (min == *max) return item + "{" + std::to_string(min) + "}";
  return item + "{" + std::to_string(min) + "," + std::to_string(*max) + "}";
}

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (const auto& p : parts) {
    if (p.empty()) continue;
    if (!out.empty()) out += sep;
    out += p;
  }
  return out;
}

// ---- Integer ranges as digit rules ----

std::string digit_class(char lo, char hi) {
  return lo == hi ? std::string("[") + lo + "]" : std::string("[") + lo + "-" + hi + "]";
}

std::string any_digits(size_t count) { return count == 1 ? "[0-9]" : "[0-9]{" + std::to_string(count) + "}"; }

// Alternatives matching the digit strings from `lo` to `hi`, both of the same length
// (leading zeros allowed: these are the tails of longer numbers).
void same_length_range(const std::string& lo, const std::string& hi, std::vector<std::string>& out) {
  const size_t n = lo.size();
  if (lo == hi) {
    out.push_back(gbnf_literal(lo));
    return;
  }
  if (n == 1) {
    out.push_back(digit_class(lo[0], hi[0]));
    return;
  }
  const std::string lo_rest = lo.substr(1);
  const std::string hi_rest = hi.substr(1);
  auto grouped = [](const std::vector<std::string>& alts) {
    return alts.size() == 1 ? alts[0] : "(" + join(alts, " | ") + ")";
  };
  if (lo[0] == hi[0]) {
    std::vector<std::string> tail;
    same_length_range(lo_rest, hi_rest, tail);
    out.push_back(digit_class(lo[0], lo[0]) + " " + grouped(tail));
    return;
  }
  const bool lo_rest_zero = lo_rest.find_first_not_of('0') == std::string::npos;
  const bool hi_rest_nine = hi_rest.find_first_not_of('9') == std::string::npos;
  if (!lo_rest_zero) {
    std::vector<std::string> tail;
    same_length_range(lo_rest, std::string(n - 1, '9'), tail);
    out.push_back(digit_class(lo[0], lo[0]) + " " + grouped(tail));
  }
  const char middle_lo = static_cast<char>(lo[0] + (lo_rest_zero ? 0 : 1));
  const char middle_hi = static_cast<char>(hi[0] - (hi_rest_nine ? 0 : 1));
  if (middle_lo <= middle_hi) out.push_back(digit_class(middle_lo, middle_hi) + " " + any_digits(n - 1));
  if (!hi_rest_nine) {
    std::vector<std::string> tail;
    same_length_range(std::string(n - 1, '0'), hi_rest, tail);
    out.push_back(digit_class(hi[0], hi[0]) + " " + grouped(tail));
  }
}

// Alternatives matching the canonical decimal text of lo..hi (0 <= lo <= hi).
std::vector<std::string> unsigned_range(int64_t lo, int64_t hi) {
  std::vector<std::string> out;
  const std::string lo_text = std::to_string(lo);
  const std::string hi_text = std::to_string(hi);
  size_t full_from = 0;  // first length of a run of lengths covered entirely, 0 if none
  size_t full_to = 0;
  auto flush_full = [&] {
    if (full_from == 0) return;
    if (full_to == 1) {
      out.push_back("[1-9]");
    } else if (full_from == full_to) {
      out.push_back("[1-9] " + any_digits(full_from - 1));
    } else {
      out.push_back("[1-9] [0-9]{" + std::to_string(full_from - 1) + "," + std::to_string(full_to - 1) + "}");
    }
    full_from = 0;
  };
  for (size_t len = lo_text.size(); len <= hi_text.size(); ++len) {
    const std::string first = len == lo_text.size() ? lo_text : "1" + std::string(len - 1, '0');
    const std::string last = len == hi_text.size() ? hi_text : std::string(len, '9');
    // Every number of this length (1-9 for one digit: 0 stays apart, it has no tail).
    const bool whole_length = first == "1" + std::string(len - 1, '0') && last == std::string(len, '9');
    if (whole_length) {
      if (full_from == 0) full_from = len;
      full_to = len;
      continue;
    }
    flush_full();
    same_length_range(first, last, out);
  }
  flush_full();
  return out;
}

std::string integer_range(int64_t lo, int64_t hi) {
  std::vector<std::string> alts;
  if (lo < 0) {
    // Negative numbers: "-" and the magnitude; "-0" is left out (it is written "0").
    const int64_t magnitude_lo = hi < 0 ? -hi : 1;
    const std::vector<std::string> magnitude = unsigned_range(magnitude_lo, -lo);
    alts.push_back("\"-\" " + (magnitude.size() == 1 ? magnitude[0] : "(" + join(magnitude, " | ") + ")"));
  }
  if (hi >= 0) {
    for (auto& a : unsigned_range(std::max<int64_t>(lo, 0), hi)) alts.push_back(std::move(a));
  }
  return join(alts, " | ");
}

// ---- Code point sets, for regex classes ----

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

Ranges normalized(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (const auto& [lo, hi] : r) {
    if (!out.empty() && lo <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, hi);
    } else {
      out.emplace_back(lo, hi);
    }
  }
  return out;
}

Ranges complement(const Ranges& r) {
  Ranges out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : normalized(r)) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
  return out;
}

Ranges intersect(const Ranges& a, const Ranges& b) {
  Ranges out;
  for (const auto& [alo, ahi] : a) {
    for (const auto& [blo, bhi] : b) {
      const uint32_t lo = std::max(alo, blo);
      const uint32_t hi = std::min(ahi, bhi);
      if (lo <= hi) out.emplace_back(lo, hi);
    }
  }
  return normalized(out);
}

bool contains(const Ranges& r, uint32_t cp) {
  return std::any_of(r.begin(), r.end(), [cp](const auto& range) { return range.first <= cp && cp <= range.second; });
}

// Characters JSON text may hold unescaped (llama.cpp's char rule also escapes DEL).
const Ranges& raw_json_chars() {
  static const Ranges r = complement({{0x00, 0x1F}, {'"', '"'}, {'\\', '\\'}, {0x7F, 0x7F}});
  return r;
}

// The short escape letter of a code point JSON writes escaped, or 0 for \u00XX.
char short_escape(uint32_t cp) {
  static constexpr std::string_view kChars = "\"\\\b\f\n\r\t", kLetters = "\"\\bfnrt";
  const size_t at = cp < 0x80 ? kChars.find(static_cast<char>(cp)) : std::string_view::npos;
  return at == std::string_view::npos ? 0 : kLetters[at];
}

// The JSON text of one code point inside a string, as a JSON encoder writes it.
std::string json_char_text(uint32_t cp) {
  if (contains(raw_json_chars(), cp)) {
    std::string s;
    append_utf8(s, cp);
    return s;
  }
  if (const char e = short_escape(cp)) return std::string("\\") + e;
  return "\\u00" + hex(cp, 2);
}

std::string class_of(const Ranges& ranges, bool negated) {
  std::string out = negated ? "[^" : "[";
  for (const auto& [lo, hi] : ranges) {
    out += class_char(lo);
    if (hi > lo) out += (hi > lo + 1 ? "-" : "") + class_char(hi);
  }
  return out + "]";
}

// A GBNF expression matching the JSON text of one code point of `set` inside a string.
std::string json_chars_matching(const Ranges& set) {
  std::vector<std::string> alts;
  const Ranges raw = intersect(set, raw_json_chars());
  if (!raw.empty()) {
    // Negated form when the set reaches the top of Unicode: it is shorter.
    alts.push_back(contains(raw, kMaxCodePoint) ? class_of(complement(raw), true) : class_of(raw, false));
  }
  std::string short_letters;
  for (const uint32_t cp : {uint32_t{'"'}, uint32_t{'\\'}, 0x08u, 0x0Cu, 0x0Au, 0x0Du, 0x09u}) {
    if (contains(set, cp)) short_letters += class_char(static_cast<uint32_t>(short_escape(cp)));
  }
  if (!short_letters.empty()) alts.push_back("[\\\\] [" + short_letters + "]");
  // Control characters without a short escape are written \u00XX.
  std::vector<uint32_t> u_escaped;
  bool all_u_escaped = true;
  for (uint32_t cp = 0; cp <= 0x7F; cp = cp == 0x1F ? 0x7F : cp + 1) {
    if (short_escape(cp) != 0) continue;
    if (contains(set, cp)) {
      u_escaped.push_back(cp);
    } else {
      all_u_escaped = false;
    }
  }
  if (all_u_escaped) {
    alts.push_back(R"("\\u00" ("0" [0-7bBeEfF] | "1" [0-9a-fA-F] | "7" [fF]))");
  } else {
    for (const uint32_t cp : u_escaped) alts.push_back(gbnf_literal(json_char_text(cp)));
  }
  return alts.size() == 1 ? alts[0] : "(" + join(alts, " | ") + ")";
}

// ---- Regex (ECMA-262 subset of JSON Schema "pattern") to GBNF over the string's JSON text ----

class PatternConverter {
 public:
  // `to_rule` names a GBNF body: a repeated group becomes a rule of its own, so nested
  // counted repetitions stay one reference per copy, never a copy of the whole group.
  PatternConverter(std::u32string pattern, std::string ptr, std::string any_char_rule,
                   std::function<std::string(const std::string&)> to_rule)
      : p_(std::move(pattern)),
        ptr_(std::move(ptr)),
        any_char_(std::move(any_char_rule)),
        to_rule_(std::move(to_rule)) {}

  // The alternatives of the whole pattern; each branch unanchored at an end may have
  // anything there (a pattern matches anywhere in the string).
  std::string convert() {
    std::vector<std::string> branches;
    while (true) {
      const bool anchored_start = eat('^');
      bool anchored_end = false;
      std::string seq = sequence(/*top=*/true, anchored_end);
      std::vector<std::string> parts;
      if (!anchored_start) parts.push_back(any_char_ + "*");
      parts.push_back(seq);
      if (!anchored_end) parts.push_back(any_char_ + "*");
      branches.push_back(join(parts, " "));
      if (at_end()) break;
      if (!eat('|')) bad("unbalanced ')'");
    }
    return join_alternatives(branches);
  }

 private:
  struct Atom {
    std::string expr;        // GBNF of the atom, when not a literal
    std::string literal;     // JSON text of a single literal character
    std::string group_body;  // the alternatives inside expr's parentheses, when it has them
  };

  // A bracket or escape yields either one code point or a set of them.
  struct ClassItem {
    Ranges set;
    std::optional<uint32_t> single;
  };

  [[noreturn]] void bad(const std::string& why) const {
    fail(ptr_, why + " (at character " + std::to_string(i_) + " of the pattern)");
  }

  bool at_end() const { return i_ >= p_.size(); }
  bool peek(char32_t c) const { return !at_end() && p_[i_] == c; }
  bool eat(char32_t c) {
    if (!peek(c)) return false;
    ++i_;
    return true;
  }

  static std::string join_alternatives(const std::vector<std::string>& branches) {
    std::string out;
    for (size_t k = 0; k < branches.size(); ++k) out += (k ? " | " : "") + branches[k];
    return out;
  }

  std::string alternation() {
    std::vector<std::string> branches;
    do {
      bool unused = false;
      branches.push_back(sequence(/*top=*/false, unused));
    } while (eat('|'));
    return join_alternatives(branches);
  }

  std::string sequence(bool top, bool& anchored_end) {
    std::vector<Atom> atoms;
    while (!at_end() && !peek('|') && !peek(')')) {
      const char32_t c = p_[i_];
      if (c == '$') {
        ++i_;
        if (top && (at_end() || peek('|'))) {
          anchored_end = true;
          break;
        }
        bad("'$' is supported only at the end of the pattern or of a top-level alternative");
      }
      if (c == '^') bad("'^' is supported only at the start of the pattern or of a top-level alternative");
      if (c == '*' || c == '+' || c == '?' || c == '{') bad("nothing to repeat");
      Atom atom = this->atom();
      quantify(atom);
      atoms.push_back(std::move(atom));
    }
    if (top && peek(')')) bad("unbalanced ')'");
    // Adjacent literal characters become one GBNF literal.
    std::vector<std::string> parts;
    std::string literal;
    for (const auto& a : atoms) {
      if (a.expr.empty()) {
        literal += a.literal;
        continue;
      }
      if (!literal.empty()) parts.push_back(gbnf_literal(literal));
      literal.clear();
      parts.push_back(a.expr);
    }
    if (!literal.empty()) parts.push_back(gbnf_literal(literal));
    return join(parts, " ");
  }

  Atom atom() {
    const char32_t c = p_[i_++];
    switch (c) {
      case '(': return group();
      case '[': return from_set(bracket());
      case '.': return from_set(complement({{0x0A, 0x0A}, {0x0D, 0x0D}, {0x2028, 0x2029}}));
      case '\\': {
        ClassItem item = escape(/*in_class=*/false);
        return item.single ? literal(*item.single) : from_set(item.set);
      }
      default: return literal(static_cast<uint32_t>(c));
    }
  }

  Atom group() {
    if (eat('?')) {
      if (eat(':')) {
        // non-capturing group: same language
      } else if (peek('<') && i_ + 1 < p_.size() && p_[i_ + 1] != '=' && p_[i_ + 1] != '!') {
        while (!at_end() && p_[i_] != '>') ++i_;  // named group: the name does not matter
        if (!eat('>')) bad("unterminated group name");
      } else {
        bad("lookaround and other '(?' groups are not supported");
      }
    }
    if (++nesting_ > kMaxPatternNesting) bad("groups nested deeper than 64 levels");
    std::string inner = alternation();
    --nesting_;
    if (!eat(')')) bad("missing ')'");
    return {"(" + inner + ")", {}, inner};
  }

  Atom literal(uint32_t cp) const { return {{}, json_char_text(cp), {}}; }

  Atom from_set(const Ranges& set) const {
    if (set.empty()) bad("a character class that matches nothing");
    std::string expr = json_chars_matching(set);
    std::string inner = expr.starts_with("(") ? expr.substr(1, expr.size() - 2) : std::string();
    return {std::move(expr), {}, std::move(inner)};
  }

  void quantify(Atom& atom) {
    int64_t min = 0;
    std::optional<int64_t> max;
    if (eat('*')) {
    } else if (eat('+')) {
      min = 1;
    } else if (eat('?')) {
      max = 1;
    } else if (peek('{')) {
      ++i_;
      min = number();
      max = min;
      if (eat(',')) max = peek('}') ? std::nullopt : std::optional<int64_t>(number());
      if (!eat('}')) bad("malformed {m,n} quantifier");
      if (max && *max < min) bad("{m,n} quantifier with m > n");
    } else {
      return;
    }
    eat('?');  // a lazy quantifier matches the same strings
    if (!at_end() && (peek('*') || peek('+') || peek('?') || peek('{'))) bad("nothing to repeat");
    if (max && *max == 0) {
      atom = {};  // x{0} matches the empty string
      return;
    }
    const std::string item = !atom.group_body.empty() ? to_rule_(atom.group_body)
                             : atom.expr.empty()      ? gbnf_literal(atom.literal)
                                                      : atom.expr;
    atom = {repetition(item, min, max), {}, {}};
  }

  int64_t number() {
    int64_t v = 0;
    const size_t start = i_;
    while (!at_end() && p_[i_] >= '0' && p_[i_] <= '9') {
      v = v * 10 + (p_[i_++] - '0');
      if (v > kMaxRepetition) bad("repetition count above " + std::to_string(kMaxRepetition));
    }
    if (i_ == start) bad("malformed {m,n} quantifier");
    return v;
  }

  Ranges bracket() {
    const bool negated = eat('^');
    Ranges set;
    while (!peek(']')) {
      if (at_end()) bad("unterminated character class");
      ClassItem lo = class_atom();
      if (peek('-') && i_ + 1 < p_.size() && p_[i_ + 1] != ']') {
        ++i_;
        ClassItem hi = class_atom();
        if (!lo.single || !hi.single) bad("a range bound in a character class is not a single character");
        if (*lo.single > *hi.single) bad("character range out of order");
        set.emplace_back(*lo.single, *hi.single);
      } else if (lo.single) {
        set.emplace_back(*lo.single, *lo.single);
      } else {
        set.insert(set.end(), lo.set.begin(), lo.set.end());
      }
    }
    ++i_;
    set = normalized(set);
    return negated ? complement(set) : set;
  }

  ClassItem class_atom() {
    const char32_t c = p_[i_++];
    if (c == '\\') return escape(/*in_class=*/true);
    return {{}, static_cast<uint32_t>(c)};
  }

  uint32_t hex_digits(int count) {
    uint32_t v = 0;
    for (int k = 0; k < count; ++k) {
      if (at_end()) bad("truncated escape");
      const char32_t h = p_[i_++];
      const int d = (h >= '0' && h <= '9')   ? static_cast<int>(h - '0')
                    : (h >= 'a' && h <= 'f') ? static_cast<int>(h - 'a' + 10)
                    : (h >= 'A' && h <= 'F') ? static_cast<int>(h - 'A' + 10)
                                             : -1;
      if (d < 0) bad("malformed hex escape");
      v = v * 16 + static_cast<uint32_t>(d);
    }
    return v;
  }

  ClassItem escape(bool in_class) {
    if (at_end()) bad("trailing backslash");
    const char32_t c = p_[i_++];
    static const Ranges digits = {{'0', '9'}};
    static const Ranges word = normalized({{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}});
    static const Ranges space = normalized({{0x09, 0x0D},
                                            {0x20, 0x20},
                                            {0xA0, 0xA0},
                                            {0x1680, 0x1680},
                                            {0x2000, 0x200A},
                                            {0x2028, 0x2029},
                                            {0x202F, 0x202F},
                                            {0x205F, 0x205F},
                                            {0x3000, 0x3000},
                                            {0xFEFF, 0xFEFF}});
    switch (c) {
      case 'd': return {digits, {}};
      case 'D': return {complement(digits), {}};
      case 'w': return {word, {}};
      case 'W': return {complement(word), {}};
      case 's': return {space, {}};
      case 'S': return {complement(space), {}};
      case 'n': return {{}, 0x0Au};
      case 'r': return {{}, 0x0Du};
      case 't': return {{}, 0x09u};
      case 'f': return {{}, 0x0Cu};
      case 'v': return {{}, 0x0Bu};
      case 'x': return {{}, hex_digits(2)};
      case 'u': return {{}, hex_digits(4)};
      case '0':
        if (!at_end() && p_[i_] >= '0' && p_[i_] <= '9') bad("octal escapes are not supported");
        return {{}, 0u};
      case 'b':
        if (in_class) return {{}, 0x08u};
        bad("word boundaries (\\b) are not supported");
      default: break;
    }
    const bool alnum = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    if (alnum) bad(std::string("unsupported escape \\") + static_cast<char>(c));
    return {{}, static_cast<uint32_t>(c)};  // an escaped punctuation character stands for itself
  }

  std::u32string p_;
  std::string ptr_;
  std::string any_char_;
  std::function<std::string(const std::string&)> to_rule_;
  size_t i_ = 0;
  int nesting_ = 0;
};

// ---- The converter ----

const json& anything() {
  static const json value = true;
  return value;
}

struct Property {
  std::string name;
  const json* schema;
  std::string ptr;
};

// Declared properties in order, indexed by name (a schema may declare thousands).
struct Properties {
  std::vector<Property> list;
  std::map<std::string, const json*> schema_by_name;
};

// Required names in order, and as a set.
struct RequiredNames {
  std::vector<std::string> list;
  std::set<std::string> set;
};

// What an object accepts besides its declared properties.
struct Additional {
  enum Kind { kAbsent, kForbidden, kAnyValue, kSchema } kind = kAbsent;
  const json* schema = nullptr;
  std::string ptr;
};

// Trie of the JSON text of property names, one JSON character per edge, to build the
// rule of "any key but these".
struct KeyTrie {
  std::map<std::string, std::unique_ptr<KeyTrie>> children;
  bool is_name_end = false;
};

class Converter {
 public:
  explicit Converter(const json& document) : document_(document) {}

  std::string convert() {
    refs_[""] = {"root", true, 0};  // "$ref": "#" names the root rule
    define("root", body(document_, "root", "", 0));
    refs_[""].in_progress = false;
    std::string out = "root ::= " + rules_.at("root") + "\n";
    out += "space ::= " + std::string(kSpaceRule) + "\n";
    for (const auto& [name, rule_body] : rules_) {
      if (name != "root") out += name + " ::= " + rule_body + "\n";
    }
    return out;
  }

 private:
  struct RefRule {
    std::string name;
    bool in_progress;
    int nesting;  // value of nesting_ when the reference was entered
  };

  // A rule name for `body`: an existing rule with the same body (equal text, same strings),
  // else a new rule named after `hint`.
  std::string add_rule(const std::string& hint, const std::string& rule_body) {
    if (const auto it = rule_by_body_.find(rule_body); it != rule_by_body_.end()) return it->second;
    const std::string base = sanitize_rule_name(hint);
    auto take = [&](const std::string& name) -> bool {
      if (rules_.count(name)) return false;
      define(name, rule_body);
      rule_by_body_[rule_body] = name;
      return true;
    };
    if (!is_reserved_name(base) && take(base)) return base;
    for (int64_t n = std::max<int64_t>(1, next_suffix_[base]);; ++n) {
      const std::string name = base + "-" + std::to_string(n);
      if (take(name)) {
        next_suffix_[base] = n + 1;
        return name;
      }
    }
  }

  void define(const std::string& name, const std::string& rule_body) {
    if (rules_.size() >= kMaxRules) fail(current_ptr_, "the grammar would need more than 10000 rules");
    grammar_bytes_ += name.size() + rule_body.size();
    if (grammar_bytes_ > kMaxGrammarBytes) fail(current_ptr_, "the grammar would exceed 4 MiB");
    rules_[name] = rule_body;
  }

  std::string primitive(const std::string& name) {
    const Primitive* p = find_primitive(name);
    if (!rules_.count(name)) {
      define(name, p->body);
      for (const char* dep : p->deps) primitive(dep);
    }
    return name;
  }

  static std::string child_hint(const std::string& hint, const std::string& part) {
    return hint == "root" ? part : hint + "-" + part;
  }

  // A rule name (or primitive) standing for `schema`.
  std::string rule_for(const json& schema, const std::string& hint, const std::string& ptr, int depth) {
    const std::string b = body(schema, hint, ptr, depth);
    return is_rule_name(b) ? b : add_rule(hint, b);
  }

  // The alternatives of the rule for `schema`; `only_type` picks one entry of a type list.
  std::string body(const json& schema, const std::string& hint, const std::string& ptr, int depth,
                   const std::string* only_type = nullptr) {
    current_ptr_ = ptr;
    if (depth > kMaxSchemaDepth) fail(ptr, "schemas nested deeper than 64 levels");
    if (++visits_ > kMaxVisits) fail(ptr, "the schema is too complex");
    if (schema.is_boolean()) {
      if (schema.get<bool>()) return primitive("value");
      fail(ptr, "the schema false accepts no document");
    }
    if (!schema.is_object()) fail(ptr, "a schema must be an object or a boolean");

    if (const auto it = schema.find("$ref"); it != schema.end())
      return ref_rule(*it, child_pointer(ptr, "$ref"), depth);
    for (const char* key : {"oneOf", "anyOf"}) {
      // oneOf as anyOf, as llama.cpp: a grammar cannot check that only one branch matches.
      if (const auto it = schema.find(key); it != schema.end()) {
        const std::string list_ptr = child_pointer(ptr, key);
        if (!it->is_array() || it->empty()) fail(list_ptr, "must be a non-empty array of schemas");
        std::vector<std::string> alts;
        for (size_t k = 0; k < it->size(); ++k) {
          alts.push_back(rule_for((*it)[k], hint + "-" + std::to_string(k), child_pointer(list_ptr, std::to_string(k)),
                                  depth + 1));
        }
        return join(alts, " | ");
      }
    }

    std::string type;
    if (only_type) {
      type = *only_type;
    } else if (const auto it = schema.find("type"); it != schema.end()) {
      const std::string type_ptr = child_pointer(ptr, "type");
      if (it->is_array()) {
        std::vector<std::string> types;
        for (const auto& t : *it) {
          if (!t.is_string()) fail(type_ptr, "must be a type name or a list of type names");
          if (std::find(types.begin(), types.end(), t.get<std::string>()) == types.end())
            types.push_back(t.get<std::string>());
        }
        if (types.empty()) fail(type_ptr, "an empty list of types accepts no document");
        if (types.size() > 1) {
          std::vector<std::string> alts;
          for (const auto& t : types) {
            check_type_name(t, type_ptr);
            const std::string b = body(schema, child_hint(hint, t), ptr, depth + 1, &t);
            alts.push_back(is_rule_name(b) ? b : add_rule(child_hint(hint, t), b));
          }
          return join(alts, " | ");
        }
        type = types[0];
      } else if (it->is_string()) {
        type = it->get<std::string>();
      } else {
        fail(type_ptr, "must be a type name or a list of type names");
      }
      check_type_name(type, type_ptr);
    }

    if (const auto it = schema.find("const"); it != schema.end()) {
      return gbnf_literal(json_text(*it, child_pointer(ptr, "const")));
    }
    if (const auto it = schema.find("enum"); it != schema.end()) {
      const std::string enum_ptr = child_pointer(ptr, "enum");
      if (!it->is_array() || it->empty()) fail(enum_ptr, "must be a non-empty array");
      std::vector<std::string> alts;
      for (const auto& v : *it) alts.push_back(gbnf_literal(json_text(v, enum_ptr)));
      return join(alts, " | ");
    }
    if ((type.empty() || type == "object" || type == "string") && schema.contains("allOf")) {
      return all_of_body(schema, type, hint, ptr, depth);
    }
    if (type.empty() || type == "object") {
      const auto additional = schema.find("additionalProperties");
      if (schema.contains("properties") || (additional != schema.end() && *additional != true)) {
        return object_body(schema, hint, ptr, depth);
      }
      if (type == "object") return primitive("object");
    }
    if (type.empty() || type == "array") {
      if (schema.contains("items") || schema.contains("prefixItems") ||
          (type == "array" && (schema.contains("minItems") || schema.contains("maxItems")))) {
        return array_body(schema, hint, ptr, depth);
      }
    }
    if (type.empty() || type == "string") {
      if (const auto it = schema.find("pattern"); it != schema.end()) {
        return pattern_body(*it, hint, child_pointer(ptr, "pattern"));
      }
      if (const auto it = schema.find("format"); it != schema.end() && it->is_string()) {
        // Other formats (email, uri, ...) are not checked, as llama.cpp: a plain string.
        const std::string& format = it->get_ref<const std::string&>();
        if (format == "uuid" ||
            (format.size() == 5 && format.starts_with("uuid") && format[4] >= '1' && format[4] <= '5')) {
          return primitive("uuid");
        }
        if (format == "date" || format == "time" || format == "date-time") return primitive(format + "-string");
      }
      if (type == "string" && (schema.contains("minLength") || schema.contains("maxLength"))) {
        const auto [min, max] = count_bounds(schema, "minLength", "maxLength", ptr);
        const std::string chars = repetition(primitive("char"), min, max);
        return chars.empty() ? R"("\"" "\"")" : R"("\"" )" + chars + R"( "\"")";
      }
    }
    if (type == "integer") {
      if (auto range = integer_bounds(schema, ptr)) return integer_range(range->first, range->second);
    }
    // Numbers keep no bounds (as llama.cpp); a schema without type or known keyword is any value.
    return primitive(type.empty() ? "value" : type);
  }

  static void check_type_name(const std::string& type, const std::string& ptr) {
    for (const char* known : {"string", "number", "integer", "boolean", "null", "object", "array"}) {
      if (type == known) return;
    }
    fail(ptr, "unknown type '" + shorten(type) + "'");
  }

  // The schema a local reference points to, and its JSON pointer.
  std::pair<const json*, std::string> resolve(const json& ref, const std::string& ptr) {
    if (!ref.is_string()) fail(ptr, "must be a string");
    const std::string& target = ref.get_ref<const std::string&>();
    if (target.empty() || target[0] != '#') {
      fail(ptr, "only references inside the schema (\"#/...\") are supported, not '" + shorten(target) + "'");
    }
    const std::string pointer = target.substr(1);
    if (!pointer.empty() && pointer[0] != '/')
      fail(ptr, "anchor references ('" + shorten(target) + "') are not supported");
    const json* node = &document_;
    size_t pos = 0;
    while (pos < pointer.size()) {
      const size_t next = std::min(pointer.find('/', pos + 1), pointer.size());
      std::string token;
      for (size_t k = pos + 1; k < next; ++k) {
        if (pointer[k] == '~' && k + 1 < next && (pointer[k + 1] == '0' || pointer[k + 1] == '1')) {
          token += pointer[++k] == '0' ? '~' : '/';
        } else {
          token += pointer[k];
        }
      }
      if (node->is_object() && node->contains(token)) {
        node = &(*node)[token];
      } else if (node->is_array() && !token.empty() && token.size() < 10 &&
                 token.find_first_not_of("0123456789") == std::string::npos && std::stoul(token) < node->size()) {
        node = &(*node)[std::stoul(token)];
      } else {
        fail(ptr, "'" + shorten(target) + "' does not resolve inside the schema");
      }
      pos = next;
    }
    return {node, pointer};
  }

  // A named rule per referenced schema, entered once: a reference met again while its
  // rule is being built is a recursive use of that rule.
  std::string ref_rule(const json& ref, const std::string& ptr, int depth) {
    // A known reference is looked up before resolving it: resolving walks the document.
    if (ref.is_string() && ref.get_ref<const std::string&>().starts_with('#')) {
      const std::string pointer = ref.get_ref<const std::string&>().substr(1);
      if (const auto it = refs_.find(pointer); it != refs_.end()) {
        // Left recursion (no '{' or '[' since the rule began) would match nothing finite.
        if (it->second.in_progress && it->second.nesting == nesting_) {
          fail(ptr, "reference cycle that consumes no input ('#" + shorten(pointer) + "')");
        }
        return it->second.name;
      }
    }
    const auto [target, pointer] = resolve(ref, ptr);
    const std::string name = reserve(pointer.empty() ? "ref" : pointer.substr(pointer.rfind('/') + 1));
    refs_[pointer] = {name, true, nesting_};
    std::string b = body(*target, name, pointer, depth + 1);
    rules_[name] = std::move(b);
    grammar_bytes_ += rules_[name].size();
    refs_[pointer].in_progress = false;
    return name;
  }

  // A fresh rule name, defined later (its body may refer to itself).
  std::string reserve(const std::string& hint) {
    const std::string base = sanitize_rule_name(hint);
    std::string name = base;
    for (int64_t n = std::max<int64_t>(1, next_suffix_[base]); is_reserved_name(name) || rules_.count(name); ++n) {
      name = base + "-" + std::to_string(n);
      next_suffix_[base] = n + 1;
    }
    define(name, "");
    return name;
  }

  std::pair<int64_t, std::optional<int64_t>> count_bounds(const json& schema, const char* min_key, const char* max_key,
                                                          const std::string& ptr) {
    auto read = [&](const char* key) -> std::optional<int64_t> {
      const auto it = schema.find(key);
      if (it == schema.end()) return std::nullopt;
      const std::string key_ptr = child_pointer(ptr, key);
      if (!it->is_number_integer() || (!it->is_number_unsigned() && it->get<int64_t>() < 0)) {
        fail(key_ptr, "must be a non-negative integer");
      }
      if (it->get<uint64_t>() > static_cast<uint64_t>(kMaxRepetition)) {
        fail(key_ptr, "above " + std::to_string(kMaxRepetition) + " is not supported");
      }
      return it->get<int64_t>();
    };
    const int64_t min = read(min_key).value_or(0);
    const std::optional<int64_t> max = read(max_key);
    if (max && *max < min) fail(child_pointer(ptr, max_key), std::string("is below ") + min_key + ": no value fits");
    return {min, max};
  }

  // Inclusive integer bounds from minimum/maximum/exclusive*; nullopt when none is set.
  std::optional<std::pair<int64_t, int64_t>> integer_bounds(const json& schema, const std::string& ptr) {
    auto read = [&](const char* key, bool round_up) -> std::optional<int64_t> {
      const auto it = schema.find(key);
      if (it == schema.end() || it->is_boolean()) return std::nullopt;
      if (!it->is_number()) fail(child_pointer(ptr, key), "must be a number");
      const int64_t limit = kMaxIntegral + 1;  // one past the clamp: still outside after +/-1
      if (it->is_number_unsigned()) {
        return static_cast<int64_t>(std::min<uint64_t>(it->get<uint64_t>(), static_cast<uint64_t>(limit)));
      }
      if (it->is_number_integer()) return std::clamp<int64_t>(it->get<int64_t>(), -limit, limit);
      const double v = round_up ? std::ceil(it->get<double>()) : std::floor(it->get<double>());
      if (!std::isfinite(v)) fail(child_pointer(ptr, key), "must be finite");
      return static_cast<int64_t>(std::clamp(v, -static_cast<double>(limit), static_cast<double>(limit)));
    };
    auto exclusive_flag = [&](const char* key) {
      const auto it = schema.find(key);
      return it != schema.end() && it->is_boolean() && it->get<bool>();  // draft 4 form
    };
    std::optional<int64_t> lo = read("minimum", true);
    std::optional<int64_t> hi = read("maximum", false);
    if (lo && exclusive_flag("exclusiveMinimum")) lo = *read("minimum", false) + 1;
    if (hi && exclusive_flag("exclusiveMaximum")) hi = *read("maximum", true) - 1;
    if (const auto x = read("exclusiveMinimum", false)) lo = std::max(lo.value_or(*x + 1), *x + 1);
    if (const auto x = read("exclusiveMaximum", true)) hi = std::min(hi.value_or(*x - 1), *x - 1);
    if (!lo && !hi) return std::nullopt;
    const int64_t low = std::max(lo.value_or(-kMaxIntegral), -kMaxIntegral);
    const int64_t high = std::min(hi.value_or(kMaxIntegral), kMaxIntegral);
    if (low > high) fail(ptr, "no integer of at most 16 digits lies within minimum/maximum");
    return std::pair{low, high};
  }

  std::string pattern_body(const json& pattern, const std::string& hint, const std::string& ptr) {
    if (!pattern.is_string()) fail(ptr, "must be a string");
    auto code_points = decode_utf8(pattern.get_ref<const std::string&>());
    if (!code_points) fail(ptr, "is not valid UTF-8");
    PatternConverter converter(std::move(*code_points), ptr, primitive("char"),
                               [&](const std::string& b) { return add_rule(hint + "-part", b); });
    return R"("\"" ()" + converter.convert() + R"() "\"")";
  }

  std::string array_body(const json& schema, const std::string& hint, const std::string& ptr, int depth) {
    // As llama.cpp: "items" wins over "prefixItems"; a list of schemas is an exact tuple.
    const char* key = schema.contains("items") ? "items" : schema.contains("prefixItems") ? "prefixItems" : nullptr;
    const json& items = key ? schema.at(key) : anything();
    const std::string items_ptr = key ? child_pointer(ptr, key) : ptr;
    ++nesting_;
    std::string inner;
    if (items.is_array()) {
      std::vector<std::string> elements;
      for (size_t k = 0; k < items.size(); ++k) {
        elements.push_back(rule_for(items[k], child_hint(hint, "tuple-" + std::to_string(k)),
                                    child_pointer(items_ptr, std::to_string(k)), depth + 1));
      }
      inner = join(elements, R"( "," space )");
    } else {
      const auto [min, max] = count_bounds(schema, "minItems", "maxItems", ptr);
      const bool no_items = items == false;  // "items": false allows only []
      if (no_items && min > 0) fail(items_ptr, "is false but minItems is above 0");
      if (!no_items && max != 0) {
        inner = repetition(rule_for(items, child_hint(hint, "item"), items_ptr, depth + 1), min, max, R"("," space)");
      }
    }
    --nesting_;
    return R"("[" space )" + (inner.empty() ? "" : inner + " ") + R"(space "]")";
  }

  Additional additional_of(const json& schema, const std::string& ptr) {
    const auto it = schema.find("additionalProperties");
    if (it == schema.end()) return {};
    const std::string a_ptr = child_pointer(ptr, "additionalProperties");
    if (it->is_boolean()) return {it->get<bool>() ? Additional::kAnyValue : Additional::kForbidden, nullptr, a_ptr};
    if (!it->is_object()) fail(a_ptr, "must be a boolean or a schema");
    return {Additional::kSchema, &*it, a_ptr};
  }

  void add_property(Properties& props, const std::string& name, const json& schema, const std::string& ptr) {
    if (name.size() > kMaxPropertyNameBytes) fail(ptr, "property names longer than 1000 bytes are not supported");
    if (const auto it = props.schema_by_name.find(name); it != props.schema_by_name.end()) {
      if (*it->second == schema) return;
      fail(ptr, "property '" + shorten(name) + "' is declared again with another schema");
    }
    props.schema_by_name[name] = &schema;
    props.list.push_back({name, &schema, ptr});
  }

  void add_properties_of(const json& schema, const std::string& ptr, Properties& props) {
    const auto it = schema.find("properties");
    if (it == schema.end()) return;
    const std::string props_ptr = child_pointer(ptr, "properties");
    if (!it->is_object()) fail(props_ptr, "must be an object");
    for (const auto& [name, prop_schema] : it->items())
      add_property(props, name, prop_schema, child_pointer(props_ptr, name));
  }

  static void add_required_of(const json& schema, RequiredNames& required) {
    const auto it = schema.find("required");
    if (it == schema.end() || !it->is_array()) return;
    for (const auto& r : *it) {
      if (r.is_string() && required.set.insert(r.get<std::string>()).second)
        required.list.push_back(r.get<std::string>());
    }
  }

  std::string object_body(const json& schema, const std::string& hint, const std::string& ptr, int depth) {
    Properties props;
    RequiredNames required;
    add_properties_of(schema, ptr, props);
    add_required_of(schema, required);
    return object_rule(std::move(props), required, additional_of(schema, ptr), hint, ptr, depth);
  }

  // allOf of object schemas: their properties merged (llama.cpp's reading; an anyOf inside
  // contributes optional properties), or the intersection of enums when all are enums.
  std::string all_of_body(const json& schema, const std::string& type, const std::string& hint, const std::string& ptr,
                          int depth) {
    Properties props;
    RequiredNames required;
    std::vector<std::vector<const json*>> enums;
    bool has_object_part = false;
    collect_all_of(schema, ptr, true, depth, props, required, enums, has_object_part);
    if (!enums.empty()) {
      if (has_object_part) fail(child_pointer(ptr, "allOf"), "mixing enum and object subschemas is not supported");
      std::vector<std::string> alts;
      for (const json* v : enums[0]) {
        const bool everywhere = std::all_of(enums.begin() + 1, enums.end(), [v](const auto& list) {
          return std::any_of(list.begin(), list.end(), [v](const json* w) { return *w == *v; });
        });
        if (everywhere) alts.push_back(gbnf_literal(json_text(*v, ptr)));
      }
      if (alts.empty()) fail(child_pointer(ptr, "allOf"), "the enums have no value in common");
      return join(alts, " | ");
    }
    if (type == "string") fail(child_pointer(ptr, "allOf"), "allOf on strings supports only enums");
    return object_rule(std::move(props), required, {}, hint, ptr, depth);
  }

  void collect_all_of(const json& s, const std::string& ptr, bool required_counts, int depth, Properties& props,
                      RequiredNames& required, std::vector<std::vector<const json*>>& enums, bool& has_object_part) {
    if (depth > kMaxSchemaDepth) fail(ptr, "schemas nested deeper than 64 levels");
    if (++visits_ > kMaxVisits) fail(ptr, "the schema is too complex");
    if (s.is_boolean() && s.get<bool>()) return;
    if (!s.is_object()) fail(ptr, "allOf supports only object schemas");
    if (const auto it = s.find("$ref"); it != s.end()) {
      const auto [target, pointer] = resolve(*it, child_pointer(ptr, "$ref"));
      collect_all_of(*target, pointer, required_counts, depth + 1, props, required, enums, has_object_part);
      return;
    }
    if (s.contains("enum") || s.contains("const")) {
      std::vector<const json*> values;
      if (const auto it = s.find("const"); it != s.end()) {
        values.push_back(&*it);
      } else if (s["enum"].is_array()) {
        for (const auto& v : s["enum"]) values.push_back(&v);
      }
      enums.push_back(std::move(values));
      return;
    }
    if (const auto it = s.find("type"); it != s.end() && *it != "object") {
      fail(child_pointer(ptr, "type"), "allOf supports only object subschemas");
    }
    if (s.contains("properties") || s.contains("required")) has_object_part = true;
    add_properties_of(s, ptr, props);
    if (required_counts) add_required_of(s, required);
    for (const char* key : {"allOf", "anyOf", "oneOf"}) {
      const auto it = s.find(key);
      if (it == s.end()) continue;
      const std::string list_ptr = child_pointer(ptr, key);
      if (!it->is_array()) fail(list_ptr, "must be an array of schemas");
      for (size_t k = 0; k < it->size(); ++k) {
        collect_all_of((*it)[k], child_pointer(list_ptr, std::to_string(k)),
                       required_counts && std::string_view(key) == "allOf", depth + 1, props, required, enums,
                       has_object_part);
      }
    }
  }

  // llama.cpp's object layout: required properties in declaration order, then any subset
  // of the optional ones, still in order, then the additional properties.
  std::string object_rule(Properties props, const RequiredNames& required, const Additional& additional,
                          const std::string& hint, const std::string& ptr, int depth) {
    // A required name without a declaration still has to be present, with any value allowed.
    for (const auto& name : required.list) {
      if (props.schema_by_name.count(name)) continue;
      if (additional.kind == Additional::kForbidden) {
        fail(child_pointer(ptr, "required"), "'" + shorten(name) + "' is required but additionalProperties is false");
      }
      add_property(props, name, additional.kind == Additional::kSchema ? *additional.schema : anything(),
                   child_pointer(ptr, "required"));
    }
    ++nesting_;
    std::vector<std::string> required_kvs;
    struct OptionalKv {
      std::string name;  // for the rule names
      std::string kv;
      bool repeats;  // the additional properties: any number of them
    };
    std::vector<OptionalKv> optional_kvs;
    for (const auto& p : props.list) {
      const std::string value = rule_for(*p.schema, child_hint(hint, p.name), p.ptr, depth + 1);
      const std::string kv = add_rule(child_hint(hint, p.name) + "-kv",
                                      gbnf_literal(json_text(json(p.name), p.ptr)) + R"( space ":" space )" + value);
      if (required.set.count(p.name)) {
        required_kvs.push_back(kv);
      } else {
        optional_kvs.push_back({p.name, kv, false});
      }
    }
    if (additional.kind == Additional::kAnyValue || additional.kind == Additional::kSchema) {
      const std::string value =
          additional.kind == Additional::kSchema
              ? rule_for(*additional.schema, child_hint(hint, "additional-value"), additional.ptr, depth + 1)
              : primitive("value");
      const std::string key = props.list.empty()
                                  ? primitive("string")
                                  : add_rule(child_hint(hint, "additional-k"), other_key_rule(props.list, ptr));
      optional_kvs.push_back(
          {"additional", add_rule(child_hint(hint, "additional-kv"), key + R"( ":" space )" + value), true});
    }
    --nesting_;
    if (required_kvs.empty() && optional_kvs.empty()) return R"("{" space "}")";

    std::string rule = R"("{" space )" + join(required_kvs, R"( "," space )");
    if (!optional_kvs.empty()) {
      // rest[k]: what may follow optional k: each later one at most once, in order.
      std::vector<std::string> rest(optional_kvs.size());
      for (size_t k = optional_kvs.size() - 1; k > 0; --k) {
        const auto& [name, kv, repeats] = optional_kvs[k];
        std::string r = R"(( "," space )" + kv + " )" + (repeats ? "*" : "?");
        if (!rest[k].empty()) r += " " + rest[k];
        rest[k - 1] = add_rule(child_hint(hint, optional_kvs[k - 1].name) + "-rest", r);
      }
      std::vector<std::string> starts;
      for (size_t k = 0; k < optional_kvs.size(); ++k) {
        const auto& [name, kv, repeats] = optional_kvs[k];
        std::string start = repeats ? kv + R"( ( "," space )" + kv + " )*" : kv;
        if (!rest[k].empty()) start += " " + rest[k];
        starts.push_back(start);
      }
      const std::string choices = join(starts, " | ");
      rule += required_kvs.empty() ? "( " + choices + " )?" : R"( ( "," space ( )" + choices + " ) )?";
    }
    return rule + R"( space "}")";
  }

  // A JSON string that is none of the declared property names.
  std::string other_key_rule(const std::vector<Property>& props, const std::string& ptr) {
    KeyTrie trie;
    size_t nodes = 0;
    for (const auto& p : props) {
      const std::string text = json_text(json(p.name), p.ptr);
      const auto cps = decode_utf8(std::string_view(text).substr(1, text.size() - 2));
      KeyTrie* node = &trie;
      for (size_t k = 0; k < cps->size(); ++k) {
        // One JSON character: a raw code point or an escape sequence.
        std::string unit;
        append_utf8(unit, (*cps)[k]);
        if ((*cps)[k] == '\\') {
          if ((*cps)[k + 1] == 'u')
            fail(ptr, "a property name with control characters cannot be combined with additionalProperties");
          append_utf8(unit, (*cps)[++k]);
        }
        auto& child = node->children[unit];
        if (!child && ++nodes > kMaxKeyTrieNodes) {
          fail(ptr, "too many property names to tell apart from additionalProperties");
        }
        if (!child) child = std::make_unique<KeyTrie>();
        node = child.get();
      }
      node->is_name_end = true;
    }
    return R"("\"" )" + other_key_tail(trie) + R"( "\"")";
  }

  std::string other_key_tail(const KeyTrie& node) {
    const std::string any_char = primitive("char");
    if (node.children.empty()) return any_char + (node.is_name_end ? "+" : "*");
    std::vector<std::string> alts;
    std::string excluded_raw;
    std::string escape_letters;
    for (const auto& [unit, child] : node.children) {
      alts.push_back(gbnf_literal(unit) + " " + other_key_tail(*child));
      if (unit[0] == '\\') {
        escape_letters += unit[1];
      } else {
        excluded_raw += class_char(decode_utf8(unit)->at(0));
      }
    }
    std::string other_escapes;
    for (const char e : std::string("\"\\bfnrt")) {
      if (escape_letters.find(e) == std::string::npos) other_escapes += class_char(static_cast<uint32_t>(e));
    }
    const std::string other_char = R"(([^"\\\x7F\x00-\x1F)" + excluded_raw + R"(] | [\\] ()" +
                                   (other_escapes.empty() ? "" : "[" + other_escapes + "] | ") +
                                   R"("u" [0-9a-fA-F]{4})))";
    alts.push_back(other_char + " " + any_char + "*");
    return "(" + join(alts, " | ") + ")" + (node.is_name_end ? "" : "?");
  }

  const json& document_;
  std::map<std::string, std::string> rules_;
  std::map<std::string, std::string> rule_by_body_;  // rules made by add_rule
  std::map<std::string, int64_t> next_suffix_;
  std::map<std::string, RefRule> refs_;  // by JSON pointer of the referenced schema
  std::string current_ptr_;
  size_t grammar_bytes_ = 0;
  size_t visits_ = 0;
  int nesting_ = 0;  // objects and arrays entered: a reference met deeper consumed input
};

}  // namespace

std::string json_schema_to_grammar(const nlohmann::ordered_json& schema) { return Converter(schema).convert(); }

std::string json_object_grammar() { return json_schema_to_grammar(nlohmann::ordered_json{{"type", "object"}}); }

}  // namespace pico::coordinator::http_api
