#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_shader_8bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
layout(std430, binding = 0) readonly buffer Weights { uint8_t w[]; };
float half_at(uint i) { return unpackHalf2x16(uint(w[i]) | (uint(w[i + 1]) << 8)).x; }
// Q5_1: d, m, 32 high bits, nibbles: (nibble | high bit j << 4) d + m.
#define BLOCK_BYTES 24
#define BLOCK_VALUES 32
float block_value(uint base, uint j) {
  const uint q = uint(w[base + 8 + j % 16]);
  const uint high = (uint(w[base + 4 + j / 8]) >> (j % 8)) & 1u;
  return half_at(base) * float((j < 16 ? q & 15u : q >> 4) | (high << 4)) + half_at(base + 2);
}
#include "type_bodies.glsl"
