#include "tokenizer/tokenizer.hpp"

#include <cstdio>

#include "tokenizer/encoders.hpp"
#include "tokenizer/unicode.hpp"

namespace pico::tokenizer {

namespace {

constexpr std::string_view kEscapedSpace = "\xE2\x96\x81";  // U+2581

void escape_spaces(std::string& text) {
  std::string out;
  out.reserve(text.size() + text.size() / 2);
  for (char c : text) {
    if (c == ' ') {
      out.append(kEscapedSpace);
    } else {
      out.push_back(c);
    }
  }
  text.swap(out);
}

std::string unescape_spaces(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    if (text.compare(i, kEscapedSpace.size(), kEscapedSpace) == 0) {
      out.push_back(' ');
      i += kEscapedSpace.size();
    } else {
      out.push_back(text[i++]);
    }
  }
  return out;
}

// Byte-level BPE text back to bytes. A character that is no byte's image comes out as
// "[UNK_BYTE_0x<its UTF-8 in hex><the token text>]", as llama.cpp writes it.
std::string decode_byte_level(std::string_view text) {
  std::string out;
  for (uint32_t cp : decode_utf8_lossy(text)) {
    const int byte = codepoint_to_byte(cp);
    if (byte >= 0) {
      out.push_back(static_cast<char>(byte));
      continue;
    }
    out += "[UNK_BYTE_0x";
    for (char c : encode_utf8(cp)) {
      char hex[3];
      std::snprintf(hex, sizeof(hex), "%02x", static_cast<unsigned>(static_cast<uint8_t>(c)));
      out += hex;
    }
    out.append(text);
    out += "]";
  }
  return out;
}

// llama.cpp's clean-up of tokenization spaces, in place, in three passes: drop the
// space before ? ! . , ; drop the spaces around a lone apostrophe; drop the space
// before 's 'm 're 've.
void clean_up_spaces(std::string& text) {
  auto pass = [&text](auto&& body) {
    if (text.empty()) return;
    const size_t n = text.size();
    size_t kept = 1;
    for (size_t i = 1; i < n; ++i) body(i, kept, n);
    text.resize(kept);
  };
  pass([&text](size_t& i, size_t& kept, size_t) {
    const char x = text[i];
    if (text[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) --kept;
    text[kept++] = x;
  });
  pass([&text](size_t& i, size_t& kept, size_t n) {
    const char x = text[i];
    if (x == '\'' && i + 1 < n && text[i - 1] == ' ' && text[i + 1] == ' ') {
      --kept;
      text[++i] = '\0';  // the space after is skipped
    }
    text[kept++] = x;
  });
  pass([&text](size_t& i, size_t& kept, size_t n) {
    const char x = text[i];
    if (text[i - 1] == ' ' && x == '\'' && i + 1 < n) {
      const char x1 = text[i + 1];
      if (x1 == 's' || x1 == 'm') {
        --kept;
      } else if (x1 != 't' && x1 != 'd' && i + 2 < n) {
        const char x2 = text[i + 2];
        if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) --kept;
      }
    }
    text[kept++] = x;
  });
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_metadata(const gguf::Metadata& metadata) {
  return std::make_unique<Tokenizer>(Vocabulary::from_metadata(metadata));
}

Tokenizer::Tokenizer(Vocabulary vocab) : vocab_(std::move(vocab)) {
  specials_ = std::make_unique<detail::SpecialMatcher>(vocab_);
  pieces_.resize(vocab_.size());
  for (int32_t id = 0; id < static_cast<int32_t>(vocab_.size()); ++id) {
    const TokenData& t = vocab_.token(id);
    std::string& piece = pieces_[static_cast<size_t>(id)];
    if (t.attr & (kAttrUnknown | kAttrControl | kAttrUserDefined)) {
      piece = t.text;
    } else if (t.attr & kAttrNormal) {
      if (vocab_.type() == VocabType::Spm || vocab_.escape_whitespace()) {
        piece = unescape_spaces(t.text);
      } else {
        piece = decode_byte_level(t.text);
      }
    } else if (t.attr & kAttrByte) {
      piece.assign(1, static_cast<char>(vocab_.token_byte(id)));
    }  // unused and undefined tokens have no text
  }
}

Tokenizer::~Tokenizer() = default;

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  std::vector<int32_t> out;
  const std::vector<detail::Fragment> fragments = specials_->partition(text, parse_special);
  const SpecialTokens& special = vocab_.special();
  if (add_special && vocab_.add_bos() && special.bos != kNoToken) out.push_back(special.bos);

  if (vocab_.type() == VocabType::Spm) {
    bool after_special = true;  // the text's start counts as following a special token
    std::string chunk;
    for (const auto& f : fragments) {
      if (f.token != kNoToken) {
        out.push_back(f.token);
        after_special = true;
        continue;
      }
      chunk.clear();
      if (vocab_.add_space_prefix() && after_special) chunk.push_back(' ');
      chunk.append(text.substr(f.begin, f.end - f.begin));
      escape_spaces(chunk);
      detail::encode_spm(vocab_, chunk, out);
      after_special = false;
    }
  } else {
    for (const auto& f : fragments) {
      if (f.token != kNoToken) {
        out.push_back(f.token);
      } else {
        detail::encode_bpe(vocab_, text.substr(f.begin, f.end - f.begin), out);
      }
    }
  }

  if (add_special && vocab_.add_eos() && special.eos != kNoToken) out.push_back(special.eos);
  return out;
}

std::string Tokenizer::piece(int32_t id, bool show_special) const {
  if (!vocab_.valid(id)) return {};
  if (!show_special && (vocab_.attr(id) & (kAttrUnknown | kAttrControl))) return {};
  return pieces_[static_cast<size_t>(id)];
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool show_special) const {
  std::string text;
  bool strip_space = vocab_.add_space_prefix();  // for the first token only
  for (int32_t id : ids) {
    std::string p = piece(id, show_special);
    if (strip_space && !p.empty() && p.front() == ' ') p.erase(0, 1);
    strip_space = false;
    text += p;
  }
  if (vocab_.clean_spaces()) clean_up_spaces(text);
  return text;
}

std::string StreamDecoder::push(int32_t id) {
  pending_ += tokenizer_.piece(id, show_special_ || std::binary_search(shown_.begin(), shown_.end(), id));
  const size_t hold = utf8_incomplete_suffix(pending_);
  std::string ready = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return ready;
}

std::string StreamDecoder::flush() {
  std::string rest;
  rest.swap(pending_);
  return rest;
}

}  // namespace pico::tokenizer
