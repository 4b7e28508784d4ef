#version 450
#extension GL_GOOGLE_include_directive : require
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

#include "float_rounding.glsl"

void main() {
  const uint i = (gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x) * WG + gl_LocalInvocationID.x;
  if (i >= p.count) return;
  const uint pairs = p.n / 2u;
  const uint s = i / pairs, j = i % pairs;
  const uint from = s * p.src_stride + 2u * j;
  pool[rows[s] * pairs + j] = to_half_bits(x[from]) | (to_half_bits(x[from + 1u]) << 16);
}
