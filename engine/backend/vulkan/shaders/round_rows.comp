#version 450
// Rounds floats in place to the values of a weight type's dot partner, as the CPU
// backend's matmul quantizes its activations (cpu::quantize_activations, then
// dequantized): F16 and BF16 one invocation per value; Q8_0 / Q8_1 one per block of 32
// (d = amax / 127 kept in F16, codes x * 127 / amax rounded half to even); Q8_K one per
// block of 256 (the signed value of largest magnitude m, codes -127 / m * x rounded half
// to even and at most 127, d = 1 / (-127 / m)). A device's rounding of a division or of
// the F16 conversion may differ from the CPU's in the last bit.
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(std430, binding = 0) buffer Values { float x[]; };
layout(push_constant) uniform Push { uint blocks; uint kind; } p;
const uint kF16 = 0, kBF16 = 1, kQ8_0 = 2, kQ8_K = 3;  // vulkan_ops.cpp's RoundKind

float to_half(float v) { return unpackHalf2x16(packHalf2x16(vec2(v, 0.0))).x; }

// Round to nearest even; NaN kept, made quiet (quant/float_convert.hpp's fp32_to_bf16).
float to_bfloat(float v) {
  const uint bits = floatBitsToUint(v);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uintBitsToFloat((bits | 0x00400000u) & 0xffff0000u);
  return uintBitsToFloat((bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u);
}

void main() {
  const uint block = gl_GlobalInvocationID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x * WG;
  if (block >= p.blocks) return;
  if (p.kind == kF16 || p.kind == kBF16) {  // a "block" of one value
    x[block] = p.kind == kF16 ? to_half(x[block]) : to_bfloat(x[block]);
    return;
  }
  const uint size = p.kind == kQ8_0 ? 32 : 256;
  const uint base = block * size;
  float amax = 0.0;
  for (uint j = base; j < base + size; ++j) amax = max(amax, abs(x[j]));
  if (p.kind == kQ8_0) {
    precise const float d = to_half(amax / 127.0);
    precise const float id = amax != 0.0 ? 127.0 / amax : 0.0;
    for (uint j = base; j < base + size; ++j) {
      precise const float scaled = x[j] * id;
      x[j] = roundEven(scaled) * d;
    }
    return;
  }
  if (amax == 0.0) {
    for (uint j = base; j < base + size; ++j) x[j] = 0.0;
    return;
  }
  float largest = 0.0;
  for (uint j = base; j < base + size; ++j) {
    if (abs(x[j]) == amax) {
      largest = x[j];
      break;
    }
  }
  precise const float iscale = -127.0 / largest;
  precise const float d = 1.0 / iscale;
  for (uint j = base; j < base + size; ++j) {
    precise const float scaled = iscale * x[j];
    x[j] = min(roundEven(scaled), 127.0) * d;
  }
}
