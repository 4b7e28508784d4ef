#include "tokenizer/unicode.hpp"

#include <algorithm>
#include <array>
#include <memory>
#include <stdexcept>

namespace pico::tokenizer {

namespace unicode_detail {
extern const CodepointRange kCodepointRanges[];
extern const size_t kCodepointRangeCount;
}  // namespace unicode_detail

namespace {

uint16_t lookup_flags(uint32_t cp) {
  using unicode_detail::kCodepointRangeCount;
  using unicode_detail::kCodepointRanges;
  const auto* begin = kCodepointRanges;
  const auto* end = kCodepointRanges + kCodepointRangeCount;
  const auto* it = std::upper_bound(begin, end, cp, [](uint32_t value, const unicode_detail::CodepointRange& r) {
    return value < r.first;
  });
  return it == begin ? uint16_t{kUnassigned} : (it - 1)->flags;
}

// The Basic Multilingual Plane in a flat table (128 KiB), built once; the rest by
// binary search over the ranges.
const std::vector<uint16_t>& bmp_flags() {
  static const std::vector<uint16_t> table = [] {
    std::vector<uint16_t> t(0x10000);
    for (uint32_t cp = 0; cp < 0x10000; ++cp) t[cp] = lookup_flags(cp);
    return t;
  }();
  return table;
}

struct ByteTables {
  std::array<uint32_t, 256> to_cp{};
  std::array<std::string, 256> to_utf8;
  std::array<int16_t, 0x144> from_cp{};  // code points up to U+0143
};

const ByteTables& byte_tables() {
  static const ByteTables tables = [] {
    ByteTables t;
    t.from_cp.fill(-1);
    auto printable = [](int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
    uint32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const uint32_t cp = printable(b) ? static_cast<uint32_t>(b) : next++;
      t.to_cp[b] = cp;
      t.to_utf8[b] = encode_utf8(cp);
      t.from_cp[cp] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return tables;
}

}  // namespace

CodepointFlags codepoint_flags(uint32_t cp) {
  if (cp < 0x10000) return CodepointFlags{bmp_flags()[cp]};
  if (cp > kMaxCodepoint) return CodepointFlags{kUnassigned};
  return CodepointFlags{lookup_flags(cp)};
}

size_t utf8_sequence_length(uint8_t lead) {
  static constexpr uint8_t kLengths[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLengths[lead >> 4];
}

bool decode_utf8(std::string_view text, size_t& offset, uint32_t& cp) {
  const size_t n = text.size();
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const auto continuation = [&](size_t i) { return i < n && (byte(i) & 0xC0) == 0x80; };
  const uint8_t b0 = byte(offset);
  if (b0 < 0x80) {
    cp = b0;
    offset += 1;
    return true;
  }
  if ((b0 & 0xE0) == 0xC0) {
    if (!continuation(offset + 1)) return false;
    cp = (uint32_t{b0 & 0x1Fu} << 6) | (byte(offset + 1) & 0x3Fu);
    offset += 2;
    return true;
  }
  if ((b0 & 0xF0) == 0xE0) {
    if (!continuation(offset + 1) || !continuation(offset + 2)) return false;
    cp = (uint32_t{b0 & 0x0Fu} << 12) | (uint32_t{byte(offset + 1) & 0x3Fu} << 6) | (byte(offset + 2) & 0x3Fu);
    offset += 3;
    return true;
  }
  if ((b0 & 0xF8) == 0xF0) {
    if (!continuation(offset + 1) || !continuation(offset + 2) || !continuation(offset + 3)) return false;
    const uint32_t value = (uint32_t{b0 & 0x07u} << 18) | (uint32_t{byte(offset + 1) & 0x3Fu} << 12) |
                           (uint32_t{byte(offset + 2) & 0x3Fu} << 6) | (byte(offset + 3) & 0x3Fu);
    if (value > kMaxCodepoint) return false;
    cp = value;
    offset += 4;
    return true;
  }
  return false;  // a continuation byte, or F8..FF
}

std::vector<uint32_t> decode_utf8_lossy(std::string_view text) {
  std::vector<uint32_t> cps;
  cps.reserve(text.size());
  size_t offset = 0;
  while (offset < text.size()) {
    uint32_t cp = 0;
    if (decode_utf8(text, offset, cp)) {
      cps.push_back(cp);
    } else {
      cps.push_back(kReplacementCharacter);
      ++offset;
    }
  }
  return cps;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp <= kMaxCodepoint) {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    throw std::invalid_argument("code point above U+10FFFF");
  }
}

std::string encode_utf8(uint32_t cp) {
  std::string out;
  append_utf8(out, cp);
  return out;
}

std::string encode_utf8(std::span<const uint32_t> cps) {
  std::string out;
  out.reserve(cps.size());
  for (uint32_t cp : cps) append_utf8(out, cp);
  return out;
}

size_t utf8_incomplete_suffix(std::string_view text) {
  // Look back at most 3 bytes for a lead byte whose sequence runs past the end.
  const size_t n = text.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto b = static_cast<uint8_t>(text[n - back]);
    if ((b & 0xC0) == 0x80) continue;  // continuation: keep looking for the lead
    size_t need = 0;
    if ((b & 0xE0) == 0xC0) {
      need = 2;
    } else if ((b & 0xF0) == 0xE0) {
      need = 3;
    } else if ((b & 0xF8) == 0xF0) {
      need = 4;
    }
    return need > back ? back : 0;
  }
  return 0;
}

uint32_t byte_to_codepoint(uint8_t byte) { return byte_tables().to_cp[byte]; }

const std::string& byte_to_utf8(uint8_t byte) { return byte_tables().to_utf8[byte]; }

int codepoint_to_byte(uint32_t cp) {
  const auto& t = byte_tables();
  return cp < t.from_cp.size() ? t.from_cp[cp] : -1;
}

}  // namespace pico::tokenizer
