#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_shader_8bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
layout(std430, binding = 0) readonly buffer Weights { uint8_t w[]; };
float half_at(uint i) { return unpackHalf2x16(uint(w[i]) | (uint(w[i + 1]) << 8)).x; }
// IQ4_NL: d, then Q4_0's nibbles as indices into a fixed non-linear table.
#define BLOCK_BYTES 18
#define BLOCK_VALUES 32
const float kValues[16] = float[16](-127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0,
                                    1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0);
float block_value(uint base, uint j) {
  const uint q = uint(w[base + 2 + j % 16]);
  return half_at(base) * kValues[j < 16 ? q & 15u : q >> 4];
}
#include "type_bodies.glsl"
