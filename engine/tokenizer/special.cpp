// Partition of the input text at special tokens.
//
// llama.cpp searches the text once per special token (longest first), splitting the
// raw fragments at each match. Searching once per token costs (tokens x text length),
// and vocabularies carry thousands of such tokens, so here one pass over the text with
// a trie of their texts lists every occurrence of each, and the same token-by-token
// splitting then runs over those lists: the result is the same.
#include <algorithm>
#include <map>

#include "tokenizer/encoders.hpp"

namespace pico::tokenizer::detail {

namespace {

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'; }

constexpr uint32_t kNoNode = 0xFFFFFFFF;

}  // namespace

SpecialMatcher::SpecialMatcher(const Vocabulary& vocab) : vocab_(vocab) {
  // Build the trie with maps, then flatten it to sorted edge lists.
  std::vector<std::map<uint8_t, uint32_t>> nodes(1);
  const auto& specials = vocab.special_tokens();
  token_node_.reserve(specials.size());
  for (int32_t id : specials) {
    uint32_t node = 0;
    for (char c : vocab.token(id).text) {
      const auto byte = static_cast<uint8_t>(c);
      auto it = nodes[node].find(byte);
      if (it == nodes[node].end()) {
        it = nodes[node].emplace(byte, static_cast<uint32_t>(nodes.size())).first;
        nodes.emplace_back();
      }
      node = it->second;
    }
    token_node_.push_back(node);
  }
  terminal_.assign(nodes.size(), 0);
  for (uint32_t node : token_node_) terminal_[node] = 1;
  first_edge_.resize(nodes.size() + 1);
  for (uint32_t n = 0; n < nodes.size(); ++n) {
    first_edge_[n] = static_cast<uint32_t>(edges_.size());
    for (const auto& [byte, next] : nodes[n]) edges_.push_back({n, byte, next});
  }
  first_edge_[nodes.size()] = static_cast<uint32_t>(edges_.size());
  for (const auto& [byte, next] : nodes[0]) root_byte_[byte] = true;
}

uint32_t SpecialMatcher::child(uint32_t node, uint8_t byte) const {
  const auto begin = edges_.begin() + first_edge_[node];
  const auto end = edges_.begin() + first_edge_[node + 1];
  const auto it = std::lower_bound(begin, end, byte, [](const Edge& e, uint8_t b) { return e.byte < b; });
  return it != end && it->byte == byte ? it->child : kNoNode;
}

std::vector<Fragment> SpecialMatcher::partition(std::string_view text, bool parse_special) const {
  std::vector<Fragment> result;
  if (text.empty()) return result;
  const auto& specials = vocab_.special_tokens();

  // Every occurrence of every special text, by trie node.
  std::vector<std::vector<size_t>> occurrences(terminal_.size());
  bool any = false;
  for (size_t start = 0; start < text.size(); ++start) {
    if (!root_byte_[static_cast<uint8_t>(text[start])]) continue;
    uint32_t node = 0;
    for (size_t i = start; i < text.size(); ++i) {
      node = child(node, static_cast<uint8_t>(text[i]));
      if (node == kNoNode) break;
      if (terminal_[node]) {
        occurrences[node].push_back(start);
        any = true;
      }
    }
  }
  if (!any) {
    result.push_back({kNoToken, 0, text.size()});
    return result;
  }

  std::map<size_t, size_t> raw{{0, text.size()}};  // begin -> end of what is still raw text
  std::vector<std::pair<size_t, int32_t>> found;    // position, token
  for (size_t k = 0; k < specials.size(); ++k) {
    const int32_t id = specials[k];
    const uint32_t attr = vocab_.attr(id);
    if (!parse_special && (attr & (kAttrControl | kAttrUnknown))) continue;
    const size_t length = vocab_.token(id).text.size();
    for (size_t pos : occurrences[token_node_[k]]) {
      auto it = raw.upper_bound(pos);
      if (it == raw.begin()) continue;
      --it;
      const size_t begin = it->first, end = it->second;
      if (pos + length > end) continue;  // not wholly inside one raw fragment
      raw.erase(it);
      size_t left_end = pos;
      if (attr & kAttrLstrip) {
        while (left_end > begin && is_ascii_space(text[left_end - 1])) --left_end;
      }
      size_t right_begin = pos + length;
      if (attr & kAttrRstrip) {
        while (right_begin < end && is_ascii_space(text[right_begin])) ++right_begin;
      }
      if (left_end > begin) raw.emplace(begin, left_end);
      if (end > right_begin) raw.emplace(right_begin, end);
      found.emplace_back(pos, id);
    }
  }

  std::sort(found.begin(), found.end());
  result.reserve(raw.size() + found.size());
  auto raw_it = raw.begin();
  for (const auto& [pos, id] : found) {
    for (; raw_it != raw.end() && raw_it->first < pos; ++raw_it) result.push_back({kNoToken, raw_it->first, raw_it->second});
    result.push_back({id, pos, pos + vocab_.token(id).text.size()});
  }
  for (; raw_it != raw.end(); ++raw_it) result.push_back({kNoToken, raw_it->first, raw_it->second});
  return result;
}

}  // namespace pico::tokenizer::detail
