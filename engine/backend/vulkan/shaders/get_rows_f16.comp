#version 450
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(std430, binding = 0) readonly buffer Table { float16_t table[]; };
layout(std430, binding = 1) readonly buffer Ids { int ids[]; };
layout(std430, binding = 2) writeonly buffer Output { float y[]; };
layout(push_constant) uniform Push { uint cols; uint rows; } p;

void main() {
  const uint i = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  const uint row = uint(ids[i]);
  if (row >= p.rows) return;
  for (uint c = gl_LocalInvocationID.x; c < p.cols; c += WG) y[i * p.cols + c] = float(table[row * p.cols + c]);
}
