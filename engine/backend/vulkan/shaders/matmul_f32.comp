#version 450
// y[t * y_stride + row_offset + r] = dot(w row r, x row t): one workgroup per output,
// each invocation summing a strided share of the columns, then a fixed tree over the
// workgroup. The order is the same whatever the batch, so is the result.
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(std430, binding = 0) readonly buffer Weights { float w[]; };
layout(std430, binding = 1) readonly buffer Input { float x[]; };
layout(std430, binding = 2) writeonly buffer Output { float y[]; };
layout(push_constant) uniform Push { uint cols; uint rows; uint y_stride; uint row_offset; } p;
shared float partial[WG];

void main() {
  const uint r = gl_WorkGroupID.x + gl_WorkGroupID.z * gl_NumWorkGroups.x;
  if (r >= p.rows) return;
  const uint t = gl_WorkGroupID.y;
  const uint lid = gl_LocalInvocationID.x;
  float sum = 0.0;
  for (uint i = lid; i < p.cols; i += WG) sum += w[r * p.cols + i] * x[t * p.cols + i];
  partial[lid] = sum;
  barrier();
  for (uint s = WG / 2; s > 0; s >>= 1) {
    if (lid < s) partial[lid] += partial[lid + s];
    barrier();
  }
  if (lid == 0) y[t * p.y_stride + p.row_offset + r] = partial[0];
}
