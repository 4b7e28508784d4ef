#version 450
// matmul over Q8_0 weights (blocks of 32: an F16 scale d, 32 int8 q; 34 bytes): each
// invocation takes whole blocks, block b's 32 products summed in order, times d; then
// matmul_f32's fixed tree.
#extension GL_EXT_shader_8bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(std430, binding = 0) readonly buffer Weights { uint8_t w[]; };
layout(std430, binding = 1) readonly buffer Input { float x[]; };
layout(std430, binding = 2) writeonly buffer Output { float y[]; };
layout(push_constant) uniform Push { uint cols; uint rows; uint y_stride; uint row_offset; } p;
shared float partial[WG];

void main() {
  const uint r = gl_WorkGroupID.x + gl_WorkGroupID.z * gl_NumWorkGroups.x;
  if (r >= p.rows) return;
  const uint t = gl_WorkGroupID.y;
  const uint lid = gl_LocalInvocationID.x;
  const uint blocks = p.cols / 32;
  float sum = 0.0;
  for (uint b = lid; b < blocks; b += WG) {
    const uint base = (r * blocks + b) * 34;
    const float d = unpackHalf2x16(uint(w[base]) | (uint(w[base + 1]) << 8)).x;
    const uint xi = t * p.cols + b * 32;
    float block = 0.0;
    for (uint j = 0; j < 32; ++j) block += float(int8_t(w[base + 2 + j])) * x[xi + j];
    sum += d * block;
  }
  partial[lid] = sum;
  barrier();
  for (uint s = WG / 2; s > 0; s >>= 1) {
    if (lid < s) partial[lid] += partial[lid + s];
    barrier();
  }
  if (lid == 0) y[t * p.y_stride + p.row_offset + r] = partial[0];
}
