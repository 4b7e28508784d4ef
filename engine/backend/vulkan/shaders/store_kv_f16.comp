#version 450
// K or V rows into a device KV pool of F16 rows: source row s (n floats at
// s * src_stride) is rounded to F16 and goes to pool row rows[s]. One invocation per
// pair of values (n is even), packed into one word. The rounding is
// quant/float_convert.hpp's fp32_to_fp16 in integers (nearest, ties to even; NaN made
// quiet), so every device stores the bits the CPU backend stores.
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(std430, binding = 0) readonly buffer Source { float x[]; };
layout(std430, binding = 1) readonly buffer Rows { uint rows[]; };
layout(std430, binding = 2) buffer Pool { uint pool[]; };
layout(push_constant) uniform Push { uint n; uint src_stride; uint count; } p;

uint to_half_bits(float f) {
  const uint bits = floatBitsToUint(f);
  const uint sign = (bits >> 16) & 0x8000u;
  const uint magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return sign | 0x7e00u;
  if (magnitude >= 0x477ff000u) return sign | 0x7c00u;
  if (magnitude < 0x38800000u) {
    // Below 2^-14: units of 2^-24, the mantissa shifted right by 126 - exponent.
    const uint exponent = magnitude >> 23;
    const uint shift = 126u - exponent;
    if (exponent == 0u || shift > 24u) return sign;
    const uint mantissa = (magnitude & 0x7fffffu) | 0x800000u;
    uint q = mantissa >> shift;
    const uint rest = mantissa & ((1u << shift) - 1u), half_unit = 1u << (shift - 1u);
    if (rest > half_unit || (rest == half_unit && (q & 1u) != 0u)) q += 1u;
    return sign | q;
  }
  const uint odd = (magnitude >> 13) & 1u;
  return sign | ((magnitude + 0xfffu + odd - ((127u - 15u) << 23)) >> 13);
}

void main() {
  const uint i = (gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x) * WG + gl_LocalInvocationID.x;
  if (i >= p.count) return;
  const uint pairs = p.n / 2u;
  const uint s = i / pairs, j = i % pairs;
  const uint from = s * p.src_stride + 2u * j;
  pool[rows[s] * pairs + j] = to_half_bits(x[from]) | (to_half_bits(x[from + 1u]) << 16);
}
