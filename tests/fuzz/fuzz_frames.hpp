// The input format of the message fuzz targets: one multipart ZeroMQ message as
//   [frame count: 1 byte][length of each frame: 4 bytes little-endian each][frames...]
// The first frame is the envelope, the others its payloads. Inputs that do not parse
// (too short, lengths past the end) give no frames; bytes after the last frame are
// ignored. encode_frames() writes the same format for the seed programs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace pico::fuzz {

constexpr size_t kMaxFrames = 8;

inline std::vector<std::span<const uint8_t>> split_frames(const uint8_t* data, size_t size) {
  std::vector<std::span<const uint8_t>> frames;
  if (size < 1) return frames;
  const size_t count = data[0] % (kMaxFrames + 1);
  size_t offset = 1 + 4 * count;
  if (count == 0 || offset > size) return frames;
  for (size_t i = 0; i < count; ++i) {
    const uint8_t* p = data + 1 + 4 * i;
    const size_t length = size_t{p[0]} | size_t{p[1]} << 8 | size_t{p[2]} << 16 | size_t{p[3]} << 24;
    if (length > size - offset) return {};
    frames.emplace_back(data + offset, length);
    offset += length;
  }
  return frames;
}

inline std::vector<uint8_t> encode_frames(const std::vector<std::vector<uint8_t>>& frames) {
  std::vector<uint8_t> out;
  out.push_back(static_cast<uint8_t>(frames.size()));
  for (const auto& f : frames) {
    for (int shift = 0; shift < 32; shift += 8) out.push_back(static_cast<uint8_t>(f.size() >> shift));
  }
  for (const auto& f : frames) out.insert(out.end(), f.begin(), f.end());
  return out;
}

}  // namespace pico::fuzz
