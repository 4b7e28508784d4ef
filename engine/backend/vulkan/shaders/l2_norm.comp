#version 450
// y = x / max(|x|, eps) over rows of n: one workgroup per row, the squares over a fixed tree.
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(std430, binding = 0) readonly buffer Input { float x[]; };
layout(std430, binding = 1) writeonly buffer Output { float y[]; };
layout(push_constant) uniform Push { uint n; float eps; } p;
shared float partial[WG];

void main() {
  const uint row = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  const uint lid = gl_LocalInvocationID.x;
  const uint base = row * p.n;
  float sum = 0.0;
  for (uint i = lid; i < p.n; i += WG) sum += x[base + i] * x[base + i];
  partial[lid] = sum;
  barrier();
  for (uint s = WG / 2; s > 0; s >>= 1) {
    if (lid < s) partial[lid] += partial[lid + s];
    barrier();
  }
  const float scale = 1.0 / max(sqrt(partial[0]), p.eps);
  for (uint i = lid; i < p.n; i += WG) y[base + i] = x[base + i] * scale;
}
