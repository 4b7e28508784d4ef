// Byte-level BPE by merge rank (llama.cpp's BPE tokenizer).
//
// The fragment is decoded to code points (invalid bytes become U+FFFD), split into
// words by the vocabulary's pre-tokenizer, and each word is re-encoded, byte by byte
// through GPT-2's byte-to-unicode table (or kept as UTF-8 for SPM-style BPE). Within a
// word, a priority queue holds the adjacent pairs that have a merge, lowest rank first
// (ties: leftmost); a popped pair is applied if both halves still have the text it was
// queued with. Symbols left without a token fall back to single-byte tokens.
#include <queue>
#include <string>

#include "tokenizer/encoders.hpp"
#include "tokenizer/unicode.hpp"

namespace pico::tokenizer::detail {

namespace {

struct Candidate {
  int left;
  int right;
  int32_t rank;
  size_t left_length;   // the halves' lengths when queued: with fixed offsets,
  size_t right_length;  // equal lengths mean equal texts
};

struct CandidateOrder {
  bool operator()(const Candidate& a, const Candidate& b) const {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  }
};

class BpeWord {
 public:
  BpeWord(const Vocabulary& vocab, std::string_view word) : vocab_(vocab), word_(word) {}

  void run(std::vector<int32_t>& out) {
    symbols_ = character_symbols(word_);
    for (int i = 1; i < static_cast<int>(symbols_.size()); ++i) consider(i - 1, i);
    while (!queue_.empty()) {
      const Candidate c = queue_.top();
      queue_.pop();
      Symbol& left = symbols_[static_cast<size_t>(c.left)];
      Symbol& right = symbols_[static_cast<size_t>(c.right)];
      if (left.length != c.left_length || right.length != c.right_length) continue;  // stale
      left.length += right.length;
      right.length = 0;
      left.next = right.next;
      if (right.next >= 0) symbols_[static_cast<size_t>(right.next)].prev = c.left;
      consider(left.prev, c.left);
      consider(c.left, left.next);
    }
    for (const Symbol& s : symbols_) {
      if (s.length > 0) emit(word_.substr(s.offset, s.length), vocab_, out);
    }
  }

  static void emit(std::string_view piece, const Vocabulary& vocab, std::vector<int32_t>& out) {
    const int32_t id = vocab.find(piece);
    if (id != kNoToken) {
      out.push_back(id);
      return;
    }
    // Byte by byte; bytes without a token are dropped, as in llama.cpp.
    const bool byte_level = vocab.pretokenizer().byte_encode;
    for (char c : piece) {
      const int32_t byte = byte_level ? vocab.find(std::string_view(&c, 1)) : vocab.byte_token(static_cast<uint8_t>(c));
      if (byte != kNoToken) out.push_back(byte);
    }
  }

 private:
  void consider(int left, int right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols_[static_cast<size_t>(left)];
    const Symbol& r = symbols_[static_cast<size_t>(right)];
    const int32_t rank = vocab_.merge_rank(word_.substr(l.offset, l.length), word_.substr(r.offset, r.length));
    if (rank < 0) return;
    queue_.push({left, right, rank, l.length, r.length});
  }

  const Vocabulary& vocab_;
  std::string_view word_;
  std::vector<Symbol> symbols_;
  std::priority_queue<Candidate, std::vector<Candidate>, CandidateOrder> queue_;
};

}  // namespace

void encode_bpe(const Vocabulary& vocab, std::string_view text, std::vector<int32_t>& out) {
  const PreTokenizerConfig& pre = vocab.pretokenizer();
  std::vector<uint32_t> cps = decode_utf8_lossy(text);
  if (vocab.escape_whitespace()) {
    for (uint32_t& cp : cps) {
      if (cp == ' ') cp = 0x2581;
    }
  }
  const std::vector<size_t> lengths = pretokenize(pre.kind, cps);
  std::string word, utf8;
  size_t begin = 0;
  for (size_t length : lengths) {
    word.clear();
    if (pre.byte_encode) {
      utf8.clear();
      for (size_t i = begin; i < begin + length; ++i) append_utf8(utf8, cps[i]);
      for (char c : utf8) word += byte_to_utf8(static_cast<uint8_t>(c));
    } else {
      for (size_t i = begin; i < begin + length; ++i) append_utf8(word, cps[i]);
    }
    begin += length;

    // A word that is a token is taken whole when the vocabulary ignores merges, and a
    // run of newlines that is a token is taken whole in Gemma 4.
    const bool newlines_only = word.find_first_not_of('\n') == std::string::npos;
    if ((pre.ignore_merges || (vocab.pre_name() == "gemma4" && newlines_only)) && vocab.find(word) != kNoToken) {
      out.push_back(vocab.find(word));
      continue;
    }
    BpeWord(vocab, word).run(out);
  }
}

}  // namespace pico::tokenizer::detail
