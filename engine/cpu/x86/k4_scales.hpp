// Q4_K / Q5_K pack 8 six-bit scales and 8 six-bit mins into 12 bytes. Unpacked with
// 32-bit arithmetic (no per-value loop) as four words of four bytes: scales 0-3,
// scales 4-7, mins 0-3, mins 4-7. Integer only, so every ISA file can include it.
#pragma once

#include <cstdint>
#include <cstring>

namespace pico::cpu {
namespace {

struct K4Scales {
  uint32_t scales_lo, scales_hi, mins_lo, mins_hi;
};

inline K4Scales unpack_k4_scales(const uint8_t* packed) {
  uint32_t u[3];
  std::memcpy(u, packed, 12);
  const uint32_t low6 = 0x3f3f3f3f, low4 = 0x0f0f0f0f, two = 0x03030303;
  return {u[0] & low6, (u[2] & low4) | (((u[0] >> 6) & two) << 4), u[1] & low6,
          ((u[2] >> 4) & low4) | (((u[1] >> 6) & two) << 4)};
}

}  // namespace
}  // namespace pico::cpu
