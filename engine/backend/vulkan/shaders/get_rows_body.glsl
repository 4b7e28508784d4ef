// get_rows over a block type (see matmul_body.glsl for what the type's file defines).
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(std430, binding = 1) readonly buffer Ids { int ids[]; };
layout(std430, binding = 2) writeonly buffer Output { float y[]; };
layout(push_constant) uniform Push { uint cols; uint rows; } p;

void main() {
  const uint i = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  const uint row = uint(ids[i]);
  if (row >= p.rows) return;
  const uint blocks = p.cols / BLOCK_VALUES;
  for (uint c = gl_LocalInvocationID.x; c < p.cols; c += WG)
    y[i * p.cols + c] = block_value((row * blocks + c / BLOCK_VALUES) * BLOCK_BYTES, c % BLOCK_VALUES);
}
