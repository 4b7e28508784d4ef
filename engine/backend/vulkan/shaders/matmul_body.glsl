// matmul over a block type (included by the type's file, which defines BLOCK_BYTES,
// BLOCK_VALUES and float block_value(uint base, uint j), value j of the block at byte
// base of w): each invocation takes whole blocks, a block's products summed in order;
// then matmul_f32's fixed tree over the workgroup.
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(std430, binding = 1) readonly buffer Input { float x[]; };
layout(std430, binding = 2) writeonly buffer Output { float y[]; };
layout(push_constant) uniform Push { uint cols; uint rows; uint y_stride; uint row_offset; } p;
shared float partial[WG];

void main() {
  const uint r = gl_WorkGroupID.x + gl_WorkGroupID.z * gl_NumWorkGroups.x;
  if (r >= p.rows) return;
  const uint t = gl_WorkGroupID.y;
  const uint lid = gl_LocalInvocationID.x;
  const uint blocks = p.cols / BLOCK_VALUES;
  float sum = 0.0;
  for (uint b = lid; b < blocks; b += WG) {
    const uint base = (r * blocks + b) * BLOCK_BYTES;
    const uint xi = t * p.cols + b * BLOCK_VALUES;
    float block = 0.0;
    for (uint j = 0; j < BLOCK_VALUES; ++j) block += block_value(base, j) * x[xi + j];
    sum += block;
  }
  partial[lid] = sum;
  barrier();
  for (uint s = WG / 2; s > 0; s >>= 1) {
    if (lid < s) partial[lid] += partial[lid + s];
    barrier();
  }
  if (lid == 0) y[t * p.y_stride + p.row_offset + r] = partial[0];
}
