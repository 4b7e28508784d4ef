#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_shader_8bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
layout(std430, binding = 0) readonly buffer Weights { uint8_t w[]; };
float half_at(uint i) { return unpackHalf2x16(uint(w[i]) | (uint(w[i + 1]) << 8)).x; }
// Q8_0: an F16 scale d, then 32 int8 values.
#define BLOCK_BYTES 34
#define BLOCK_VALUES 32
float block_value(uint base, uint j) { return half_at(base) * float(int8_t(w[base + 2 + j])); }
#include "type_bodies.glsl"
