#version 450
// Arg max of rows of n floats, as sample::first_argmax picks it: the first of equal
// maxima (-0 equals +0), NaNs never picked unless one leads the row (then index 0).
// One workgroup per listed row: out[i] = the index in row rows[i], out[count + i] its
// value's bits. Each invocation keeps the first maximum of its strided share; a fixed
// tree then keeps the larger value or, on a tie, the lower index.
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Rows { uint rows[]; };
layout(std430, binding = 2) writeonly buffer Out { uint result[]; };
layout(push_constant) uniform Push { uint n; uint count; } p;
const uint kNone = 0xffffffffu;
shared float best_value[WG];
shared uint best_index[WG];

void main() {
  const uint i = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x, lid = gl_LocalInvocationID.x;
  if (i >= p.count) return;
  const uint base = rows[i] * p.n;
  float m = 0.0;
  uint at = kNone;
  for (uint j = lid; j < p.n; j += WG) {
    const float v = x[base + j];
    if (!isnan(v) && (at == kNone || v > m)) {
      m = v;
      at = j;
    }
  }
  best_value[lid] = m;
  best_index[lid] = at;
  barrier();
  for (uint s = WG / 2; s > 0; s >>= 1) {
    if (lid < s) {
      const float v = best_value[lid + s];
      const uint j = best_index[lid + s];
      if (j != kNone && (best_index[lid] == kNone || v > best_value[lid] || (v == best_value[lid] && j < best_index[lid]))) {
        best_value[lid] = v;
        best_index[lid] = j;
      }
    }
    barrier();
  }
  if (lid == 0) {
    const uint pick = isnan(x[base]) || best_index[0] == kNone ? 0u : best_index[0];
    result[i] = pick;
    result[p.count + i] = floatBitsToUint(x[base + pick]);
  }
}
