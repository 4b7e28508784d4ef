#version 450
// y = x / (1 + e^-x).
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(std430, binding = 0) readonly buffer Input { float x[]; };
layout(std430, binding = 1) writeonly buffer Output { float y[]; };
layout(push_constant) uniform Push { uint count; } p;

void main() {
  const uint i = (gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x) * WG + gl_LocalInvocationID.x;
  if (i >= p.count) return;
  y[i] = x[i] / (1.0 + exp(-x[i]));
}
