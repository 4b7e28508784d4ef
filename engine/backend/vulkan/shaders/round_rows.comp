#version 450
#extension GL_GOOGLE_include_directive : require
// Rounds floats (x into y, which may be x) to the values of a weight type's dot partner, as the CPU
// backend's matmul quantizes its activations (cpu::quantize_activations, then
// dequantized): F16 and BF16 value by value; Q8_0 / Q8_1 per block of 32 (d = amax /
// 127 kept in F16, codes x * 127 / amax rounded half to even); Q8_K per block of 256
// (the signed value of largest magnitude m, the first one in order, codes -127 / m * x
// rounded half to even and at most 127, d = 1 / (-127 / m)). The divisions and the F16
// rounding are float_rounding.glsl's exact ones, so every device gives the CPU's bits.
//
// One workgroup per 256 values (whole blocks of either size), each invocation a few of
// them: a block's largest magnitude and its first index come from trees over shared
// memory (max and min are exact in any order), so the result is the same as a serial
// pass; a pass value by value in one invocation per block left most of a GPU idle.
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(std430, binding = 0) readonly buffer Input { float x[]; };
layout(std430, binding = 1) writeonly buffer Output { float y[]; };
layout(push_constant) uniform Push { uint count; uint kind; } p;
const uint kF16 = 0, kBF16 = 1, kQ8_0 = 2, kQ8_K = 3, kF32 = 4;  // vulkan_ops.cpp's RoundKind
const uint kGroupValues = 256;                         // vulkan_ops.cpp's kRoundGroupValues
const uint kNone = 0xffffffffu;

#include "float_rounding.glsl"

shared float value[kGroupValues];        // the values of this group
shared float magnitude[kGroupValues];    // the tree of each block's largest magnitude
shared uint first[kGroupValues];         // the tree of each block's first index of it (Q8_K)
shared float scale[kGroupValues / 32];   // each block's d
shared float multiplier[kGroupValues / 32];  // and what its values are multiplied by before rounding

// Round to nearest even; NaN kept, made quiet (quant/float_convert.hpp's fp32_to_bf16).
float to_bfloat(float v) {
  const uint bits = floatBitsToUint(v);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uintBitsToFloat((bits | 0x00400000u) & 0xffff0000u);
  return uintBitsToFloat((bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u);
}

void main() {
  const uint start = (gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x) * kGroupValues;
  const uint lid = gl_LocalInvocationID.x;
  if (start >= p.count) return;  // the whole workgroup
  if (p.kind == kF16 || p.kind == kBF16 || p.kind == kF32) {
    for (uint i = lid; i < kGroupValues && start + i < p.count; i += WG) {
      const float v = x[start + i];
      y[start + i] = p.kind == kF16 ? round_to_half(v) : p.kind == kBF16 ? to_bfloat(v) : v;
    }
    return;
  }
  const uint size = p.kind == kQ8_0 ? 32 : 256;
  for (uint i = lid; i < kGroupValues; i += WG) {
    value[i] = start + i < p.count ? x[start + i] : 0.0;  // past the end: whole blocks, never written
    magnitude[i] = abs(value[i]);
  }
  barrier();
  // Pairwise within each block: after the step of stride s, index i (a multiple of 2s)
  // holds the largest of i .. i + 2s - 1; at the end each block's first index holds it.
  for (uint s = 1; s < size; s <<= 1) {
    for (uint i = lid; i < kGroupValues; i += WG) {
      if ((i & (2 * s - 1)) == 0) magnitude[i] = max(magnitude[i], magnitude[i + s]);
    }
    barrier();
  }
  if (p.kind == kQ8_K) {
    // The first index of each block whose magnitude is its largest.
    for (uint i = lid; i < kGroupValues; i += WG) first[i] = abs(value[i]) == magnitude[i - i % size] ? i : kNone;
    barrier();
    for (uint s = 1; s < size; s <<= 1) {
      for (uint i = lid; i < kGroupValues; i += WG) {
        if ((i & (2 * s - 1)) == 0) first[i] = min(first[i], first[i + s]);
      }
      barrier();
    }
  }
  // Each block's d and multiplier, once, each block by another invocation (the exact
  // divisions are long: one invocation doing a workgroup's 8 in a row set its time).
  for (uint block = lid; block < kGroupValues / size; block += WG) {
    const uint i = block * size;
    const float amax = magnitude[i];
    if (p.kind == kQ8_0) {
      scale[block] = round_to_half(divide_exact(amax, 127.0));
      multiplier[block] = amax != 0.0 ? divide_exact(127.0, amax) : 0.0;
    } else if (amax == 0.0) {
      scale[block] = 0.0;
      multiplier[block] = 0.0;
    } else {
      const float iscale = divide_exact(-127.0, value[first[i]]);
      scale[block] = divide_exact(1.0, iscale);
      multiplier[block] = iscale;
    }
  }
  barrier();
  for (uint i = lid; i < kGroupValues && start + i < p.count; i += WG) {
    const uint block = i / size;
    precise const float scaled = value[i] * multiplier[block];
    y[start + i] = (p.kind == kQ8_0 ? roundEven(scaled) : min(roundEven(scaled), 127.0)) * scale[block];
  }
}
