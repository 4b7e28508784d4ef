#version 450
// In place over rows of n: one workgroup per row; the maximum and the sum of
// e^(x - max) each over a fixed tree.
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(std430, binding = 0) buffer Data { float x[]; };
layout(push_constant) uniform Push { uint n; } p;
shared float partial[WG];

void main() {
  const uint row = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  const uint lid = gl_LocalInvocationID.x;
  const uint base = row * p.n;
  float m = -1.0 / 0.0;
  for (uint i = lid; i < p.n; i += WG) m = max(m, x[base + i]);
  partial[lid] = m;
  barrier();
  for (uint s = WG / 2; s > 0; s >>= 1) {
    if (lid < s) partial[lid] = max(partial[lid], partial[lid + s]);
    barrier();
  }
  const float row_max = partial[0];
  barrier();
  float sum = 0.0;
  for (uint i = lid; i < p.n; i += WG) {
    const float e = exp(x[base + i] - row_max);
    x[base + i] = e;
    sum += e;
  }
  partial[lid] = sum;
  barrier();
  for (uint s = WG / 2; s > 0; s >>= 1) {
    if (lid < s) partial[lid] += partial[lid + s];
    barrier();
  }
  const float inverse = 1.0 / partial[0];
  for (uint i = lid; i < p.n; i += WG) x[base + i] *= inverse;
}
