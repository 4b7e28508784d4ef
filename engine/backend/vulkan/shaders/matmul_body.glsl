// matmul over a block type (included by the type's file, which defines BLOCK_BYTES,
// BLOCK_VALUES and float block_value(uint base, uint j), value j of the block at byte
// base of w): one workgroup per output; each invocation takes whole blocks, a block's
// products summed in order; then a fixed tree over the workgroup. The same order for
// a token alone or in a batch.
//
// MATMUL_ID (the experts of a MoE FFN): w holds n_expert matrices of `rows` rows one
// after another; output row s ("slot" s = token * slots + j) is expert ids[s]'s matrix
// times input row s (x_per_slot) or times its token's row s / slots. Only the chosen
// experts' rows are read.
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(std430, binding = 1) readonly buffer Input { float x[]; };
layout(std430, binding = 2) writeonly buffer Output { float y[]; };
#ifdef MATMUL_ID
layout(std430, binding = 3) readonly buffer Ids { int ids[]; };
layout(push_constant) uniform Push { uint cols; uint rows; uint y_stride; uint row_offset; uint slots; uint x_per_slot; uint n_expert; } p;
#else
layout(push_constant) uniform Push { uint cols; uint rows; uint y_stride; uint row_offset; } p;
#endif
shared float partial[WG];

void main() {
  const uint r = gl_WorkGroupID.x + gl_WorkGroupID.z * gl_NumWorkGroups.x;
  if (r >= p.rows) return;
  const uint t = gl_WorkGroupID.y;
  const uint lid = gl_LocalInvocationID.x;
  const uint blocks = p.cols / BLOCK_VALUES;
#ifdef MATMUL_ID
  const uint expert = uint(ids[t]);
  if (expert >= p.n_expert) {  // never from moe_route; a stray id writes 0, reads nothing
    if (lid == 0) y[t * p.y_stride + p.row_offset + r] = 0.0;
    return;
  }
  const uint weight_row = expert * p.rows + r;
  const uint x_row = p.x_per_slot != 0 ? t : t / p.slots;
#else
  const uint weight_row = r;
  const uint x_row = t;
#endif
  float sum = 0.0;
  for (uint b = lid; b < blocks; b += WG) {
    const uint base = (weight_row * blocks + b) * BLOCK_BYTES;
    const uint xi = x_row * p.cols + b * BLOCK_VALUES;
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
