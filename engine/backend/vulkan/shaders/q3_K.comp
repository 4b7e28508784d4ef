#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_shader_8bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
layout(std430, binding = 0) readonly buffer Weights { uint8_t w[]; };
float half_at(uint i) { return unpackHalf2x16(uint(w[i]) | (uint(w[i + 1]) << 8)).x; }
// Q3_K: 256 values; hmask[32] at 0, qs[64] at 32, 16 six-bit scales in 12 bytes at 96,
// d at 108; Q2_K's order, the third bit in hmask, code minus 4 where it is clear.
#define BLOCK_BYTES 110
#define BLOCK_VALUES 256
float block_value(uint base, uint j) {
  const uint half_ = j / 128, r = j % 128, s = r / 32, part = (r % 32) / 16, l = 16 * part + r % 16;
  const uint is = half_ * 8 + s * 2 + part;
  const uint low = is < 8 ? uint(w[base + 96 + is]) & 15u : uint(w[base + 96 + is - 8]) >> 4;
  const uint high = (uint(w[base + 96 + 8 + is % 4]) >> (2 * (is / 4))) & 3u;
  const int scale = int(low | (high << 4)) - 32;
  const uint m = 1u << (half_ * 4 + s);
  const int code = int((uint(w[base + 32 + half_ * 32 + l]) >> (2 * s)) & 3u) - ((uint(w[base + l]) & m) != 0u ? 0 : 4);
  return half_at(base + 108) * float(scale) * float(code);
}
#include "type_bodies.glsl"
