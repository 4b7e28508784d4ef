#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_shader_8bit_storage : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_int16 : require
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
layout(std430, binding = 0) readonly buffer Weights { uint8_t w[]; };
layout(std430, binding = 0) readonly buffer Weights16 { uint16_t w16[]; };  // the same, by halves (blocks start at even bytes)
float half_at(uint i) { return unpackHalf2x16(uint(w[i]) | (uint(w[i + 1]) << 8)).x; }
// Q4_0: d, then 16 bytes: value j < 16 in the low nibble of byte j, value j + 16 in its high nibble, minus 8.
#define BLOCK_BYTES 18
#define BLOCK_VALUES 32
float block_value(uint base, uint j) {
  const uint q = uint(w[base + 2 + j % 16]);
  return half_at(base) * float(int(j < 16 ? q & 15u : q >> 4) - 8);
}
// Values j .. j + 3 (j % 4 == 0): 4 bytes read as two halves, the scale as one.
#define BLOCK_VALUES4
vec4 block_values4(uint base, uint j) {
  const uint at = (base + 2 + j % 16) / 2;
  const uint word = uint(w16[at]) | (uint(w16[at + 1]) << 16);
  const uvec4 q = (uvec4(word, word >> 8, word >> 16, word >> 24) >> (j < 16 ? 0u : 4u)) & 15u;
  return unpackHalf2x16(uint(w16[base / 2])).x * (vec4(ivec4(q) - 8));
}
#include "type_bodies.glsl"
