// DRY ("don't repeat yourself"), as llama.cpp defines it (src/llama-sampler.cpp, from
// koboldcpp): a token that would extend a sequence already seen in the last N tokens
// loses multiplier * base^(length - allowed_length) of its logit, where length is the
// longest such repeat it would continue; sequence breakers (newline, ':', '"', '*' by
// default) cut repeats, so that the structure of a text is not penalised.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace pico::sample {

struct Candidates;

// The breakers as tokens: per head token, the tails (the tokens after it) that complete
// a breaker; an empty tail when the head's own text contains one.
struct DryBreakers {
  std::unordered_multimap<int32_t, std::vector<int32_t>> heads;
  bool breaks_alone(int32_t token) const;  // a head with an empty tail
};

// As llama.cpp builds them: each breaker cut to 40 bytes; a vocabulary token whose text
// contains it gets an empty tail; one whose text ends with a prefix of it gets the
// tokenization of the breaker's rest (at most 20 tokens) as a tail, once per distinct
// tail. `text` is a token's text (specials shown), `tokenize` a text's tokens without
// specials.
DryBreakers make_dry_breakers(std::span<const std::string> breakers, int32_t n_vocab,
                              const std::function<std::string(int32_t)>& text,
                              const std::function<std::vector<int32_t>(std::string_view)>& tokenize);

// The last N accepted tokens and the penalty they give.
class DryHistory {
 public:
  explicit DryHistory(int32_t last_n) : last_n_(last_n > 0 ? last_n : 0) {}
  void accept(int32_t token);
  void reset() { tokens_.clear(); }
  // Lowers the logits of the candidates that would extend a repeat of more than
  // allowed_length tokens (nothing when multiplier is 0, base < 1 or N is 0).
  void apply(Candidates& c, float multiplier, float base, int32_t allowed_length, const DryBreakers* breakers) const;

 private:
  int32_t last_n_;
  std::deque<int32_t> tokens_;  // oldest first, at most last_n_
};

}  // namespace pico::sample
