#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_shader_8bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
layout(std430, binding = 0) readonly buffer Weights { uint8_t w[]; };
float half_at(uint i) { return unpackHalf2x16(uint(w[i]) | (uint(w[i + 1]) << 8)).x; }
// Q6_K: 256 values; ql[128] at 0, qh[64] at 128, 16 int8 scales at 192, d at 208. Per
// half of 128: ql[l] holds values l (low) and l + 64 (high), ql[l + 32] values l + 32 and
// l + 96, qh[l] the top two bits of l, l + 32, l + 64, l + 96; codes minus 32.
#define BLOCK_BYTES 210
#define BLOCK_VALUES 256
float block_value(uint base, uint j) {
  const uint half_ = j / 128, r = j % 128, quarter = r / 32, l = r % 32;
  const uint lq = uint(w[base + half_ * 64 + l + (quarter % 2) * 32]);
  const uint low = quarter < 2 ? lq & 15u : lq >> 4;
  const uint high = (uint(w[base + 128 + half_ * 32 + l]) >> (2 * quarter)) & 3u;
  const float scale = float(int8_t(w[base + 192 + half_ * 8 + l / 16 + 2 * quarter]));
  return half_at(base + 208) * scale * float(int(low | (high << 4)) - 32);
}
#include "type_bodies.glsl"
