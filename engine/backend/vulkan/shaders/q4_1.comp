#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_shader_8bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
layout(std430, binding = 0) readonly buffer Weights { uint8_t w[]; };
float half_at(uint i) { return unpackHalf2x16(uint(w[i]) | (uint(w[i + 1]) << 8)).x; }
// Q4_1: d, m, then Q4_0's nibbles (unsigned): q d + m.
#define BLOCK_BYTES 20
#define BLOCK_VALUES 32
float block_value(uint base, uint j) {
  const uint q = uint(w[base + 4 + j % 16]);
  return half_at(base) * float(j < 16 ? q & 15u : q >> 4) + half_at(base + 2);
}
#include "type_bodies.glsl"
