#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_shader_8bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
layout(std430, binding = 0) readonly buffer Weights { uint8_t w[]; };
float half_at(uint i) { return unpackHalf2x16(uint(w[i]) | (uint(w[i + 1]) << 8)).x; }
// Q2_K: 256 values; scales[16] (low nibble scale, high nibble min) at 0, qs[64] at 16,
// d at 80, dmin at 82. Values in halves of 128: 4 shifts of 2 bits x 2 parts of 16.
#define BLOCK_BYTES 84
#define BLOCK_VALUES 256
float block_value(uint base, uint j) {
  const uint half_ = j / 128, r = j % 128, s = r / 32, part = (r % 32) / 16, l = r % 16;
  const uint sc = uint(w[base + half_ * 8 + s * 2 + part]);
  const float dl = half_at(base + 80) * float(sc & 15u), ml = half_at(base + 82) * float(sc >> 4);
  const uint q = (uint(w[base + 16 + half_ * 32 + l + 16 * part]) >> (2 * s)) & 3u;
  return dl * float(q) - ml;
}
#include "type_bodies.glsl"
