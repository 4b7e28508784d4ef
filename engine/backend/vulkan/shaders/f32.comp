#version 450
#extension GL_GOOGLE_include_directive : require
layout(std430, binding = 0) readonly buffer Weights { uint w[]; };
// F32 as a "block" of one value (so a row's products are summed one by one, in order).
#define BLOCK_BYTES 4
#define BLOCK_VALUES 1
float block_value(uint base, uint j) { return uintBitsToFloat(w[base / 4]); }
#include "type_bodies.glsl"
