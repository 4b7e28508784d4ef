#version 450
#extension GL_GOOGLE_include_directive : require
layout(std430, binding = 0) readonly buffer Weights { uint w[]; };
// BF16: a "block" of one value, the upper 16 bits of a float (exact), so matmul sums
// the products in matmul_f32's order. Read as 32-bit words (value i: half i % 2 of
// word i / 2, little-endian), which needs no 16-bit type support.
#define BLOCK_BYTES 2
#define BLOCK_VALUES 1
float block_value(uint base, uint j) {
  const uint word = w[base / 4];
  return uintBitsToFloat((base % 4 == 0 ? word : word >> 16) << 16);
}
#include "type_bodies.glsl"
