#version 450
// y = x / sqrt(mean(x^2) + eps) * w over rows of n: one workgroup per row, the squares
// summed strided then in a fixed tree.
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(std430, binding = 0) readonly buffer Input { float x[]; };
layout(std430, binding = 1) readonly buffer Weight { float w[]; };
layout(std430, binding = 2) writeonly buffer Output { float y[]; };
layout(push_constant) uniform Push { uint n; uint has_weight; float eps; } p;
shared float partial[WG];

void main() {
  const uint row = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  const uint lid = gl_LocalInvocationID.x;
  const uint base = row * p.n;
  // Four loads issued before their sums (in the same order as one at a time): a row of
  // a decode step is a single workgroup, whose loads would otherwise wait one by one.
  float sum = 0.0;
  for (uint i = lid; i < p.n; i += 4 * WG) {
    float v[4];
    for (uint u = 0; u < 4; ++u) v[u] = i + u * WG < p.n ? x[base + i + u * WG] : 0.0;
    for (uint u = 0; u < 4; ++u) {
      if (i + u * WG < p.n) sum += v[u] * v[u];
    }
  }
  partial[lid] = sum;
  barrier();
  for (uint s = WG / 2; s > 0; s >>= 1) {
    if (lid < s) partial[lid] += partial[lid + s];
    barrier();
  }
  const float scale = 1.0 / sqrt(partial[0] / float(p.n) + p.eps);
  for (uint i = lid; i < p.n; i += 4 * WG) {
    float v[4], weight[4];
    for (uint u = 0; u < 4; ++u) {
      const uint at = min(i + u * WG, p.n - 1);
      v[u] = x[base + at];
      weight[u] = p.has_weight != 0 ? w[at] : 1.0;
    }
    for (uint u = 0; u < 4; ++u) {
      if (i + u * WG < p.n) y[base + i + u * WG] = p.has_weight != 0 ? v[u] * scale * weight[u] : v[u] * scale;
    }
  }
}
