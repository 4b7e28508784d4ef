#version 450
// y = a * b over rows of n, b broadcast over the rows when b_rows == 1; with per_row,
// b holds one factor per row of a (Backend::scale_rows).
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer B { float b[]; };
layout(std430, binding = 2) writeonly buffer Output { float y[]; };
layout(push_constant) uniform Push { uint n; uint count; uint b_rows; uint per_row; } p;

void main() {
  const uint i = (gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x) * WG + gl_LocalInvocationID.x;
  if (i >= p.count) return;
  y[i] = a[i] * b[p.per_row != 0 ? i / p.n : (p.b_rows == 1 ? i % p.n : i)];
}
