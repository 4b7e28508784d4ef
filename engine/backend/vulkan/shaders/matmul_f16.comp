#version 450
// matmul_f32's order over F16 weights (each weight converted to float, then multiplied).
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(std430, binding = 0) readonly buffer Weights { float16_t w[]; };
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
  for (uint i = lid; i < p.cols; i += WG) sum += float(w[r * p.cols + i]) * x[t * p.cols + i];
  partial[lid] = sum;
  barrier();
  for (uint s = WG / 2; s > 0; s >>= 1) {
    if (lid < s) partial[lid] += partial[lid + s];
    barrier();
  }
  if (lid == 0) y[t * p.y_stride + p.row_offset + r] = partial[0];
}
