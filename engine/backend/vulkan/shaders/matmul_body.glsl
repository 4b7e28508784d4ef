// matmul over a block type (included by the type's file, which defines BLOCK_BYTES,
// BLOCK_VALUES and float block_value(uint base, uint j), value j of the block at byte
// base of w): one workgroup per output row and tile of TOKEN_TILE tokens (MATMUL_TILED,
// for batches: each weight value decoded once for the tile; else one token); each
// invocation takes chunks of up to 32 values (whole blocks, or parts of a K-quant's),
// a token's products of a chunk summed in order, its chunks in order; then a fixed tree
// over the workgroup per token. Both shaders give every output the same
// operations in the same order, `precise` (nothing contracted into a multiply-add):
// a token alone or in a batch, in any place of a tile, gets the same bits.
//
// MATMUL_ID (the experts of a MoE FFN): w holds n_expert matrices of `rows` rows one
// after another; output row s ("slot" s = token * slots + j) is expert ids[s]'s matrix
// times input row s (x_per_slot) or times its token's row s / slots. Only the chosen
// experts' rows are read; one slot per workgroup (neighbouring slots use other experts).
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(std430, binding = 1) readonly buffer Input { float x[]; };
layout(std430, binding = 2) writeonly buffer Output { float y[]; };
#ifdef MATMUL_ID
#define TOKEN_TILE 1
layout(std430, binding = 3) readonly buffer Ids { int ids[]; };
layout(push_constant) uniform Push { uint cols; uint rows; uint y_stride; uint row_offset; uint slots; uint x_per_slot; uint n_expert; } p;
#else
#ifdef MATMUL_TILED
#define TOKEN_TILE 8  // vulkan_ops.cpp's kMatmulTokenTile
#else
#define TOKEN_TILE 1
#endif
layout(push_constant) uniform Push { uint cols; uint rows; uint y_stride; uint row_offset; uint tokens; } p;
#endif
shared float partial[TOKEN_TILE * WG];
#if BLOCK_VALUES > 32
#define CHUNK 32
#else
#define CHUNK BLOCK_VALUES
#endif

void main() {
  const uint r = gl_WorkGroupID.x + gl_WorkGroupID.z * gl_NumWorkGroups.x;
  if (r >= p.rows) return;
  const uint t0 = gl_WorkGroupID.y * TOKEN_TILE;
  const uint lid = gl_LocalInvocationID.x;
  const uint blocks = p.cols / BLOCK_VALUES;
#ifdef MATMUL_ID
  const uint n_tokens = 1;
  const uint expert = uint(ids[t0]);
  if (expert >= p.n_expert) {  // never from moe_route; a stray id writes 0, reads nothing
    if (lid == 0) y[t0 * p.y_stride + p.row_offset + r] = 0.0;
    return;
  }
  const uint weight_row = expert * p.rows + r;
  const uint x_row = p.x_per_slot != 0 ? t0 : t0 / p.slots;
#else
  const uint n_tokens = TOKEN_TILE == 1 ? 1u : min(uint(TOKEN_TILE), p.tokens - t0);
  const uint weight_row = r;
  const uint x_row = t0;
#endif
  // Chunks of CHUNK values (a block, or a 32-value part of a K-quant's 256) spread
  // over the invocations, so that a row of a few large blocks still keeps them busy.
  const uint chunks_per_block = BLOCK_VALUES / CHUNK;
  const uint chunks = blocks * chunks_per_block;
  precise float sum[TOKEN_TILE];
  for (uint i = 0; i < TOKEN_TILE; ++i) sum[i] = 0.0;
  for (uint c = lid; c < chunks; c += WG) {
    const uint b = c / chunks_per_block;
    const uint first = (c % chunks_per_block) * CHUNK;
    const uint base = (weight_row * blocks + b) * BLOCK_BYTES;
    const uint xi = x_row * p.cols + b * BLOCK_VALUES;
    precise float chunk[TOKEN_TILE];
    for (uint i = 0; i < TOKEN_TILE; ++i) chunk[i] = 0.0;
    for (uint j = first; j < first + CHUNK; ++j) {
      const float value = block_value(base, j);
      for (uint i = 0; i < TOKEN_TILE; ++i) {
        if (i < n_tokens) chunk[i] += value * x[xi + i * p.cols + j];
      }
    }
    for (uint i = 0; i < TOKEN_TILE; ++i) sum[i] += chunk[i];
  }
  for (uint i = 0; i < TOKEN_TILE; ++i) partial[i * WG + lid] = sum[i];
  barrier();
  for (uint s = WG / 2; s > 0; s >>= 1) {
    if (lid < s) {
      for (uint i = 0; i < TOKEN_TILE; ++i) {
        if (i < n_tokens) partial[i * WG + lid] += partial[i * WG + lid + s];
      }
    }
    barrier();
  }
  if (lid == 0) {
    for (uint i = 0; i < TOKEN_TILE; ++i) {
      if (i < n_tokens) y[(t0 + i) * p.y_stride + p.row_offset + r] = partial[i * WG];
    }
  }
}
