#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_shader_8bit_storage : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_int16 : require
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
layout(std430, binding = 0) readonly buffer Weights { uint8_t w[]; };
layout(std430, binding = 0) readonly buffer Weights16 { uint16_t w16[]; };  // the same, by halves (blocks start at even bytes)
float half_at(uint i) { return unpackHalf2x16(uint(w[i]) | (uint(w[i + 1]) << 8)).x; }
// Q8_0: an F16 scale d, then 32 int8 values.
#define BLOCK_BYTES 34
#define BLOCK_VALUES 32
float block_value(uint base, uint j) { return half_at(base) * float(int8_t(w[base + 2 + j])); }
// Values j .. j + 3 (j % 4 == 0): 4 bytes read as two halves, the scale as one.
#define BLOCK_VALUES4
vec4 block_values4(uint base, uint j) {
  const uint at = (base + 2 + j) / 2;
  const int word = int(uint(w16[at]) | (uint(w16[at + 1]) << 16));
  const ivec4 q = ivec4(bitfieldExtract(word, 0, 8), bitfieldExtract(word, 8, 8), bitfieldExtract(word, 16, 8),
                        bitfieldExtract(word, 24, 8));
  return unpackHalf2x16(uint(w16[base / 2])).x * vec4(q);
}
#include "type_bodies.glsl"
