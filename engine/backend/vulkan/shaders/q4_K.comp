#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_shader_8bit_storage : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_int16 : require
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
layout(std430, binding = 0) readonly buffer Weights { uint8_t w[]; };
layout(std430, binding = 0) readonly buffer Weights16 { uint16_t w16[]; };  // the same, by halves (blocks start at even bytes)
float half_at(uint i) { return unpackHalf2x16(uint(w[i]) | (uint(w[i + 1]) << 8)).x; }
// Q4_K: 256 values; d at 0, dmin at 2, 8 six-bit scales and mins at 4, qs[128] at 16:
// byte l of 32-byte group k holds value 64k + l (low nibble) and 64k + 32 + l (high).
#define BLOCK_BYTES 144
#define BLOCK_VALUES 256
// Scale and min of sub-block j (six bits each, packed in the 12 bytes at s).
void scale_min_k4(uint s, uint j, out float scale, out float min_) {
  if (j < 4) {
    scale = float(uint(w[s + j]) & 63u);
    min_ = float(uint(w[s + j + 4]) & 63u);
  } else {
    scale = float((uint(w[s + j + 4]) & 15u) | ((uint(w[s + j - 4]) >> 6) << 4));
    min_ = float((uint(w[s + j + 4]) >> 4) | ((uint(w[s + j]) >> 6) << 4));
  }
}
float block_value(uint base, uint j) {
  const uint pair = j / 64, upper = (j % 64) / 32, l = j % 32;
  float scale, min_;
  scale_min_k4(base + 4, 2 * pair + upper, scale, min_);
  const uint q = uint(w[base + 16 + pair * 32 + l]);
  return half_at(base) * scale * float(upper == 0u ? q & 15u : q >> 4) - half_at(base + 2) * min_;
}
// Values j .. j + 3 (j % 4 == 0, all of one sub-block): the scale, min and halves
// decoded once, the 4 code bytes read as two halves.
#define BLOCK_VALUES4
vec4 block_values4(uint base, uint j) {
  const uint pair = j / 64, upper = (j % 64) / 32, l = j % 32;
  float scale, min_;
  scale_min_k4(base + 4, 2 * pair + upper, scale, min_);
  const uint at = (base + 16 + pair * 32 + l) / 2;
  const uint word = uint(w16[at]) | (uint(w16[at + 1]) << 16);
  const vec4 q = vec4((uvec4(word, word >> 8, word >> 16, word >> 24) >> (upper == 0u ? 0u : 4u)) & 15u);
  const float d = unpackHalf2x16(uint(w16[base / 2])).x, dmin = unpackHalf2x16(uint(w16[base / 2 + 1])).x;
  return vec4(d * scale * q.x - dmin * min_, d * scale * q.y - dmin * min_, d * scale * q.z - dmin * min_,
              d * scale * q.w - dmin * min_);
}
#include "type_bodies.glsl"
