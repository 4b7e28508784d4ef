#version 450
#extension GL_GOOGLE_include_directive : require
layout(std430, binding = 0) readonly buffer Weights { uint w[]; };
// F16 as a "block" of one value, read as half i % 2 of 32-bit word i / 2 (little-endian;
// no 16-bit type support needed), converted exactly to float.
#define BLOCK_BYTES 2
#define BLOCK_VALUES 1
float block_value(uint base, uint j) {
  const uint word = w[base / 4];
  return unpackHalf2x16(base % 4 == 0 ? word : word >> 16).x;
}
#include "type_bodies.glsl"
