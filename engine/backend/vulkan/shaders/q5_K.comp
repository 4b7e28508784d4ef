#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_shader_8bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
layout(std430, binding = 0) readonly buffer Weights { uint8_t w[]; };
float half_at(uint i) { return unpackHalf2x16(uint(w[i]) | (uint(w[i + 1]) << 8)).x; }
// Q5_K: Q4_K with a fifth bit: qh[32] at 16 (bit 2k / 2k+1 of qh[l] for group k's low /
// high nibble), qs[128] at 48.
#define BLOCK_BYTES 176
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
  const uint q = uint(w[base + 48 + pair * 32 + l]);
  const uint high = (uint(w[base + 16 + l]) >> (2 * pair + upper)) & 1u;
  return half_at(base) * scale * float((upper == 0u ? q & 15u : q >> 4) + 16u * high) - half_at(base + 2) * min_;
}
#include "type_bodies.glsl"
