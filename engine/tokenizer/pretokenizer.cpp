#include "tokenizer/pretokenizer.hpp"

#include <array>
#include <string>

#include "tokenizer/unicode.hpp"

namespace pico::tokenizer {

namespace {

constexpr uint32_t kNone = 0xFFFFFFFF;  // "no code point": outside the chunk

// A chunk of code points being cut into words. Positions are absolute indices into
// the text; reads outside [begin, end) see kNone and empty flags, so that a rule that
// looks ahead stops at the chunk's edge as a regex stops at the end of its input.
class Cutter {
 public:
  Cutter(std::span<const uint32_t> cps, size_t begin, size_t end, std::vector<size_t>& out)
      : cps_(cps), begin_(begin), end_(end), cut_(begin), out_(out) {}

  size_t begin() const { return begin_; }
  size_t end() const { return end_; }
  uint32_t cp(size_t pos) const { return pos >= begin_ && pos < end_ ? cps_[pos] : kNone; }
  CodepointFlags flags(size_t pos) const {
    return pos >= begin_ && pos < end_ ? codepoint_flags(cps_[pos]) : CodepointFlags{};
  }
  // Ends the current word at `pos` (nothing if it would be empty).
  void cut(size_t pos) {
    if (pos > cut_) out_.push_back(pos - cut_);
    cut_ = pos;
  }

 private:
  std::span<const uint32_t> cps_;
  size_t begin_, end_, cut_;
  std::vector<size_t>& out_;
};

uint32_t ascii_lower(uint32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

bool is_cr_or_lf(uint32_t c) { return c == '\r' || c == '\n'; }

// Length of the English contraction at `pos` ('s 't 'm 'd 're 've 'll), 0 if none.
size_t contraction_length(const Cutter& c, size_t pos, bool case_insensitive) {
  if (c.cp(pos) != '\'' || pos + 1 >= c.end()) return 0;
  const auto fold = [&](uint32_t x) { return case_insensitive ? ascii_lower(x) : x; };
  const uint32_t a = fold(c.cp(pos + 1));
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (pos + 2 >= c.end()) return 0;
  const uint32_t b = fold(c.cp(pos + 2));
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// Whitespace at `pos` not taken by an earlier rule: \s+(?!\S) keeps the last blank for
// the word that follows; at the chunk's end \s+ takes them all. With `newlines`,
// \s*[\r\n]+ first takes the run up to its last CR or LF.
size_t whitespace_end(const Cutter& c, size_t pos, bool newlines) {
  size_t n = 0;
  size_t last_newline_end = 0;
  while (c.flags(pos + n).whitespace()) {
    if (newlines && is_cr_or_lf(c.cp(pos + n))) last_newline_end = pos + n + 1;
    ++n;
  }
  if (last_newline_end > 0) return last_newline_end;
  if (n > 1 && c.cp(pos + n) != kNone) return pos + n - 1;
  if (n > 0) return pos + n;
  return pos + 1;  // matched by nothing: a word of its own
}

bool is_text_class(CodepointFlags f) { return f.whitespace() || f.letter() || f.number(); }

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
void split_gpt2(Cutter c) {
  size_t pos = c.begin();
  while (pos < c.end()) {
    const uint32_t cp = c.cp(pos);
    if (size_t len = contraction_length(c, pos, false)) {
      pos += len;
      c.cut(pos);
      continue;
    }
    // An optional leading space joins a run of letters, digits or other symbols.
    const bool space = cp == ' ';
    const CodepointFlags head = space ? c.flags(pos + 1) : c.flags(pos);
    if (head.letter()) {
      pos += space ? 2 : 1;
      while (c.flags(pos).letter()) ++pos;
    } else if (head.number()) {
      pos += space ? 2 : 1;
      while (c.flags(pos).number()) ++pos;
    } else if (!is_text_class(head) && head.any()) {
      pos += space ? 2 : 1;
      for (CodepointFlags f = c.flags(pos); !is_text_class(f) && f.any(); f = c.flags(pos)) ++pos;
    } else {
      pos = whitespace_end(c, pos, false);
    }
    c.cut(pos);
  }
}

// The Llama 3 family:
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,D}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// D = max_digits; with_marks: [\p{L}\p{M}] for \p{L} (and \p{M} out of the symbol class).
void split_llama3(Cutter c, size_t max_digits, bool with_marks) {
  const auto wordlike = [&](CodepointFlags f) { return f.letter() || (with_marks && f.mark()); };
  const auto symbol = [&](CodepointFlags f) { return !is_text_class(f) && !(with_marks && f.mark()); };
  size_t pos = c.begin();
  while (pos < c.end()) {
    const uint32_t cp = c.cp(pos);
    const CodepointFlags flags = c.flags(pos);
    if (size_t len = contraction_length(c, pos, true)) {
      pos += len;
      c.cut(pos);
      continue;
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+ : one optional non-letter, non-digit prefix.
    if (!is_cr_or_lf(cp) && !flags.number() && (wordlike(flags) || wordlike(c.flags(pos + 1)))) {
      ++pos;
      while (wordlike(c.flags(pos))) ++pos;
      c.cut(pos);
      continue;
    }
    // \p{N}{1,D}: a run of digits cut every D.
    if (flags.number()) {
      size_t group = pos;
      while (c.flags(pos).number()) {
        if (++pos - group >= max_digits) {
          c.cut(pos);
          group = pos;
        }
      }
      c.cut(pos);
      continue;
    }
    // ' ?[^\s\p{L}\p{N}]+[\r\n]*' (a lone space at the chunk's end also lands here)
    const bool space = cp == ' ';
    CodepointFlags head = space ? c.flags(pos + 1) : flags;
    if (symbol(head)) {
      pos += space ? 1 : 0;
      while (symbol(head) && head.any()) head = c.flags(++pos);
      while (is_cr_or_lf(c.cp(pos))) ++pos;
      c.cut(pos);
      continue;
    }
    pos = whitespace_end(c, pos, true);
    c.cut(pos);
  }
}

// Runs of code points that satisfy `in_class` become words, and so do the stretches
// between them (a regex of the form [...]+ splitting with "isolated" behaviour).
template <typename Pred>
void isolate_runs(Cutter c, Pred in_class) {
  size_t pos = c.begin();
  while (pos < c.end()) {
    const bool inside = in_class(c.cp(pos));
    while (pos < c.end() && in_class(c.cp(pos)) == inside) ++pos;
    c.cut(pos);
  }
}

// Each code point that satisfies `in_class` becomes a word (a one-character regex).
template <typename Pred>
void isolate_each(Cutter c, Pred in_class) {
  for (size_t pos = c.begin(); pos < c.end(); ++pos) {
    if (in_class(c.cp(pos))) {
      c.cut(pos);
      c.cut(pos + 1);
    }
  }
  c.cut(c.end());
}

// [0-9][0-9][0-9]: leftmost triples of ASCII digits.
void isolate_digit_triples(Cutter c) {
  const auto digit = [&](size_t pos) { return c.cp(pos) >= '0' && c.cp(pos) <= '9'; };
  size_t pos = c.begin();
  while (pos < c.end()) {
    if (pos + 3 <= c.end() && digit(pos) && digit(pos + 1) && digit(pos + 2)) {
      c.cut(pos);
      pos += 3;
      c.cut(pos);
    } else {
      ++pos;
    }
  }
  c.cut(c.end());
}

bool is_ascii_in(uint32_t cp, std::string_view set) { return cp < 0x80 && set.find(static_cast<char>(cp)) != set.npos; }

bool is_number(uint32_t cp) { return codepoint_flags(cp).number(); }

enum class Stage { Gpt2, Llama3, Qwen2, Qwen35, PunctuationRuns, FalconPunctuationRuns, NumberRuns, EachNumber, DigitTriples, NewlineRuns };

void run_stage(Stage stage, Cutter c) {
  switch (stage) {
    case Stage::Gpt2:
      return split_gpt2(c);
    case Stage::Llama3:
      return split_llama3(c, 3, false);
    case Stage::Qwen2:
      return split_llama3(c, 1, false);
    case Stage::Qwen35:
      return split_llama3(c, 1, true);
    case Stage::PunctuationRuns:  // [\p{P}\$\+<=>\^~\|]+
      return isolate_runs(c, [](uint32_t cp) { return codepoint_flags(cp).punctuation() || is_ascii_in(cp, "$+<=>^~|"); });
    case Stage::FalconPunctuationRuns:  // [\p{P}\$\+<=>\^~\|`]+
      return isolate_runs(c, [](uint32_t cp) { return codepoint_flags(cp).punctuation() || is_ascii_in(cp, "$+<=>^~|`"); });
    case Stage::NumberRuns:  // \p{N}+
      return isolate_runs(c, is_number);
    case Stage::EachNumber:  // \p{N}
      return isolate_each(c, is_number);
    case Stage::DigitTriples:  // [0-9][0-9][0-9]
      return isolate_digit_triples(c);
    case Stage::NewlineRuns:  // [^\n]+|[\n]+
      return isolate_runs(c, [](uint32_t cp) { return cp == '\n'; });
  }
}

std::span<const Stage> stages_of(PreTokenizer kind) {
  static constexpr Stage kDefault[] = {Stage::PunctuationRuns, Stage::Gpt2, Stage::NumberRuns, Stage::DigitTriples};
  static constexpr Stage kGpt2[] = {Stage::Gpt2};
  static constexpr Stage kLlama3[] = {Stage::Llama3};
  static constexpr Stage kQwen2[] = {Stage::Qwen2};
  static constexpr Stage kQwen35[] = {Stage::Qwen35};
  static constexpr Stage kStarCoder[] = {Stage::EachNumber, Stage::Gpt2};
  static constexpr Stage kFalcon[] = {Stage::FalconPunctuationRuns, Stage::Gpt2, Stage::DigitTriples};
  static constexpr Stage kNewlinesQwen2[] = {Stage::NewlineRuns, Stage::Qwen2};
  static constexpr Stage kNewlines[] = {Stage::NewlineRuns};
  switch (kind) {
    case PreTokenizer::Default: return kDefault;
    case PreTokenizer::Gpt2: return kGpt2;
    case PreTokenizer::Llama3: return kLlama3;
    case PreTokenizer::Qwen2: return kQwen2;
    case PreTokenizer::Qwen35: return kQwen35;
    case PreTokenizer::StarCoder: return kStarCoder;
    case PreTokenizer::Falcon: return kFalcon;
    case PreTokenizer::NewlinesQwen2: return kNewlinesQwen2;
    case PreTokenizer::Newlines: return kNewlines;
  }
  return kDefault;
}

struct NamedConfig {
  std::string_view names;  // space-separated
  PreTokenizerConfig config;
};

PreTokenizerConfig make(PreTokenizer kind, bool clean_spaces, bool ignore_merges = false, bool add_bos = false) {
  PreTokenizerConfig c;
  c.kind = kind;
  c.clean_spaces = clean_spaces;
  c.ignore_merges = ignore_merges;
  c.add_bos = add_bos;
  return c;
}

}  // namespace

std::optional<PreTokenizerConfig> pretokenizer_for_name(std::string_view name) {
  using P = PreTokenizer;
  PreTokenizerConfig gemma4 = make(P::Newlines, true);
  gemma4.byte_encode = false;
  gemma4.escape_whitespace = true;
  PreTokenizerConfig glm = make(P::Llama3, true);
  glm.no_bos = true;
  PreTokenizerConfig sarvam = gemma4;
  sarvam.clean_spaces = false;
  // Names as llama.cpp maps them (src/llama-vocab.cpp), family by family.
  const NamedConfig table[] = {
      {"default", make(P::Default, true)},
      {"llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano", make(P::Llama3, true, true, true)},
      {"dbrx smaug-bpe", make(P::Llama3, true)},
      {"glm4 chatglm-bpe", glm},
      {"gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum modern-bert exaone4 mpt olmo jais "
       "jina-v1-en jina-v2-code roberta-bpe",
       make(P::Gpt2, true)},
      {"trillion granite-docling", make(P::Gpt2, false)},
      {"qwen2 deepseek-r1-qwen kormo f2llmv2 hunyuan solar-open grok-2", make(P::Qwen2, false)},
      {"megrez stablelm2", make(P::Qwen2, true)},
      {"qwen35", make(P::Qwen35, false)},
      {"starcoder refact codeshell exaone minerva-7b mellum2", make(P::StarCoder, true)},
      {"command-r smollm", make(P::StarCoder, false)},
      {"falcon", make(P::Falcon, true)},
      {"laguna", make(P::NewlinesQwen2, false)},
      {"gemma4 granite-embed-multi-311m", gemma4},
      {"sarvam-moe", sarvam},
  };
  if (name.empty()) name = "default";
  for (const auto& entry : table) {
    std::string_view names = entry.names;
    while (!names.empty()) {
      const size_t space = names.find(' ');
      if (names.substr(0, space) == name) return entry.config;
      names = space == names.npos ? std::string_view{} : names.substr(space + 1);
    }
  }
  return std::nullopt;
}

std::vector<size_t> pretokenize(PreTokenizer kind, std::span<const uint32_t> cps) {
  std::vector<size_t> words;
  if (cps.empty()) return words;
  words.push_back(cps.size());
  for (Stage stage : stages_of(kind)) {
    std::vector<size_t> next;
    next.reserve(words.size() * 2);
    size_t begin = 0;
    for (size_t length : words) {
      run_stage(stage, Cutter(cps, begin, begin + length, next));
      begin += length;
    }
    words.swap(next);
  }
  return words;
}

}  // namespace pico::tokenizer
