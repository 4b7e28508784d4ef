#version 450
// y = (x - mean) / sqrt(var + eps) * w + b over rows of n (w, b optional): one
// workgroup per row; the sum and then the centered squares each over a fixed tree.
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(std430, binding = 0) readonly buffer Input { float x[]; };
layout(std430, binding = 1) readonly buffer Weight { float w[]; };
layout(std430, binding = 2) readonly buffer Bias { float b[]; };
layout(std430, binding = 3) writeonly buffer Output { float y[]; };
layout(push_constant) uniform Push { uint n; uint has_weight; uint has_bias; float eps; } p;
shared float partial[WG];

float tree_sum(uint lid) {
  barrier();
  for (uint s = WG / 2; s > 0; s >>= 1) {
    if (lid < s) partial[lid] += partial[lid + s];
    barrier();
  }
  const float total = partial[0];
  barrier();
  return total;
}

void main() {
  const uint row = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  const uint lid = gl_LocalInvocationID.x;
  const uint base = row * p.n;
  float sum = 0.0;
  for (uint i = lid; i < p.n; i += WG) sum += x[base + i];
  partial[lid] = sum;
  const float mean = tree_sum(lid) / float(p.n);
  float squares = 0.0;
  for (uint i = lid; i < p.n; i += WG) squares += (x[base + i] - mean) * (x[base + i] - mean);
  partial[lid] = squares;
  const float scale = 1.0 / sqrt(tree_sum(lid) / float(p.n) + p.eps);
  for (uint i = lid; i < p.n; i += WG) {
    float v = (x[base + i] - mean) * scale;
    if (p.has_weight != 0) v *= w[i];
    if (p.has_bias != 0) v += b[i];
    y[base + i] = v;
  }
}
