#version 450
// out row t = sum over j = 0..k-1, in that order, of weights[t*k + j] times the expert
// output row t*k + j (each product rounded: `precise` forbids fusing it into the sum).
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(std430, binding = 0) readonly buffer Expert { float expert_out[]; };
layout(std430, binding = 1) readonly buffer Weights { float weights[]; };
layout(std430, binding = 2) writeonly buffer Output { float y[]; };
layout(push_constant) uniform Push { uint n; uint k; } p;

void main() {
  const uint t = gl_WorkGroupID.y;
  for (uint c = gl_LocalInvocationID.x + gl_WorkGroupID.x * WG; c < p.n; c += WG * gl_NumWorkGroups.x) {
    precise float sum = 0.0;
    for (uint j = 0; j < p.k; ++j) {
      precise float product = weights[t * p.k + j] * expert_out[(t * p.k + j) * p.n + c];
      sum += product;
    }
    y[t * p.n + c] = sum;
  }
}
