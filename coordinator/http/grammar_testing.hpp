// Tests' view of a grammar over bytes: a vocabulary of the 256 single bytes (then the
// end of generation, token 256), and whether a grammar takes a whole text through the
// sampler's matcher, each byte a token and the grammar complete after the last.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sample/grammar.hpp"

namespace pico::coordinator::http_api::testing {

inline std::shared_ptr<const sample::GrammarVocabulary> byte_vocabulary() {
  static const auto bytes = [] {
    std::vector<std::string> pieces;
    for (int b = 0; b < 256; ++b) pieces.emplace_back(1, static_cast<char>(b));
    pieces.emplace_back();
    std::vector<bool> end(257, false);
    end[256] = true;
    return std::make_shared<const sample::GrammarVocabulary>(std::move(pieces), std::move(end));
  }();
  return bytes;
}

inline bool grammar_accepts(const std::string& grammar, const std::string& text, std::string_view root = "root") {
  sample::GrammarMatcher matcher(sample::Grammar::parse(grammar, root), byte_vocabulary());
  for (unsigned char c : text) {
    if (!matcher.allows(c)) return false;
    matcher.accept(c);
  }
  return matcher.complete() && matcher.allows(256);
}

}  // namespace pico::coordinator::http_api::testing
