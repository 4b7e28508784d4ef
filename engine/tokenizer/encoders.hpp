// Internal pieces of the tokenizer: the special-token partition and the two encoders.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.hpp"

namespace pico::tokenizer::detail {

// A stretch of the input: raw text [begin, end) or one special token.
struct Fragment {
  int32_t token = kNoToken;  // kNoToken for raw text
  size_t begin = 0, end = 0;
};

// Finds the special tokens in `text` as llama.cpp's tokenizer_st_partition does: token
// by token, longest text first, every non-overlapping occurrence inside what is still
// raw text, left to right. Control and unknown tokens only when `parse_special`;
// user-defined tokens always. Honours the lstrip/rstrip attributes.
class SpecialMatcher {
 public:
  explicit SpecialMatcher(const Vocabulary& vocab);
  std::vector<Fragment> partition(std::string_view text, bool parse_special) const;

 private:
  struct Edge {
    uint32_t node;
    uint8_t byte;
    uint32_t child;
  };
  uint32_t child(uint32_t node, uint8_t byte) const;

  const Vocabulary& vocab_;
  std::vector<Edge> edges_;             // sorted by (node, byte)
  std::vector<uint32_t> first_edge_;    // per node: index of its first edge in edges_
  std::vector<uint8_t> terminal_;       // per node: a special token's text ends here
  std::vector<uint32_t> token_node_;    // per entry of vocab.special_tokens(): its node
  bool root_byte_[256] = {};
};

// A piece of text in the merge loops of both encoders: a doubly linked list over
// the text's characters, merged pairwise in place.
struct Symbol {
  int prev;
  int next;
  size_t offset;
  size_t length;  // 0 once merged into its left neighbour
};

// One symbol per character of `text`, cut by the lengths their lead bytes announce
// (no validation: an invalid byte may swallow the bytes after it, as in llama.cpp).
std::vector<Symbol> character_symbols(std::string_view text);

// SentencePiece BPE (vocabulary type SPM) of one fragment whose spaces are already
// U+2581: highest-scoring adjacent pair first, bytes of what no token covers.
void encode_spm(const Vocabulary& vocab, std::string_view text, std::vector<int32_t>& out);

// Byte-level BPE (vocabulary type BPE) of one fragment: pre-tokenize, byte-encode,
// merge each word by rank.
void encode_bpe(const Vocabulary& vocab, std::string_view text, std::vector<int32_t>& out);

}  // namespace pico::tokenizer::detail
