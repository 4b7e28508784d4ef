// SentencePiece-style BPE over scores (llama.cpp's SPM tokenizer).
//
// The text is cut into characters by the lengths their lead bytes announce (no
// validation: an invalid byte may swallow the bytes after it, as in llama.cpp). A
// priority queue holds every adjacent pair whose concatenation is a token, best score
// first (ties: leftmost); the pair on top is merged if both halves are still as they
// were, and the merged symbol's new neighbours are queued. O(n log n). What no token
// covers at the end becomes byte tokens.
#include <queue>

#include "tokenizer/encoders.hpp"
#include "tokenizer/unicode.hpp"

namespace pico::tokenizer::detail {

std::vector<Symbol> character_symbols(std::string_view text) {
  std::vector<Symbol> symbols;
  for (size_t offset = 0; offset < text.size();) {
    const size_t length = std::min(utf8_sequence_length(static_cast<uint8_t>(text[offset])), text.size() - offset);
    const int index = static_cast<int>(symbols.size());
    symbols.push_back({index - 1, offset + length == text.size() ? -1 : index + 1, offset, length});
    offset += length;
  }
  return symbols;
}

namespace {

struct Candidate {
  int left;
  int right;
  float score;
  size_t length;  // of the merged text; stale when the halves no longer add up to it
};

struct CandidateOrder {
  bool operator()(const Candidate& a, const Candidate& b) const {
    // std::priority_queue pops the greatest: highest score, then smallest left index.
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

class SpmSession {
 public:
  SpmSession(const Vocabulary& vocab, std::string_view text) : vocab_(vocab), text_(text) {}

  void run(std::vector<int32_t>& out) {
    symbols_ = character_symbols(text_);
    if (symbols_.empty()) return;
    for (int i = 1; i < static_cast<int>(symbols_.size()); ++i) consider(i - 1, i);

    while (!queue_.empty()) {
      const Candidate c = queue_.top();
      queue_.pop();
      Symbol& left = symbols_[static_cast<size_t>(c.left)];
      Symbol& right = symbols_[static_cast<size_t>(c.right)];
      if (left.length == 0 || right.length == 0 || left.length + right.length != c.length) continue;
      left.length += right.length;
      right.length = 0;
      left.next = right.next;
      if (right.next >= 0) symbols_[static_cast<size_t>(right.next)].prev = c.left;
      consider(left.prev, c.left);
      consider(c.left, left.next);
    }

    for (int i = 0; i != -1; i = symbols_[static_cast<size_t>(i)].next) emit(symbols_[static_cast<size_t>(i)], out);
  }

 private:
  void consider(int left, int right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols_[static_cast<size_t>(left)];
    const Symbol& r = symbols_[static_cast<size_t>(right)];
    const size_t length = l.length + r.length;
    const int32_t id = vocab_.find(text_.substr(l.offset, length));
    if (id == kNoToken) return;
    queue_.push({left, right, vocab_.token(id).score, length});
  }

  void emit(const Symbol& s, std::vector<int32_t>& out) const {
    const std::string_view piece = text_.substr(s.offset, s.length);
    const int32_t id = vocab_.find(piece);
    if (id != kNoToken) {
      out.push_back(id);
      return;
    }
    // Byte fallback. (llama.cpp fails on a byte the vocabulary lacks; here it is the
    // unknown token, or dropped without one.)
    for (char c : piece) {
      int32_t byte = vocab_.byte_token(static_cast<uint8_t>(c));
      if (byte == kNoToken) byte = vocab_.special().unk;
      if (byte != kNoToken) out.push_back(byte);
    }
  }

  const Vocabulary& vocab_;
  std::string_view text_;
  std::vector<Symbol> symbols_;
  std::priority_queue<Candidate, std::vector<Candidate>, CandidateOrder> queue_;
};

}  // namespace

void encode_spm(const Vocabulary& vocab, std::string_view text, std::vector<int32_t>& out) {
  SpmSession(vocab, text).run(out);
}

}  // namespace pico::tokenizer::detail
