// matmul over a block type (included by the type's file, which defines BLOCK_BYTES,
// BLOCK_VALUES and float block_value(uint base, uint j), value j of the block at byte
// base of w). A row's dot product is spread over LANES = 32 lanes: lane l takes the
// row's values in runs of GROUP = 4, runs l, l + 32, l + 64, ... (so the lanes of a
// step read 128 neighbouring values of x and of the row: coalesced), each lane summing
// its products in that order; then a fixed tree over the 32 lanes (s = 16, 8, 4, 2, 1),
// through subgroup shuffles where the device's subgroups hold whole groups of 32 lanes
// (SUBGROUP_TREE, set by the device) or shared memory elsewhere: the same additions in
// the same order, so the same bits. A workgroup takes WG / 32 rows; the tiled shader
// (MATMUL_TILED, for batches) takes each of them for TOKEN_TILE tokens, decoding each
// weight value once for the tile. Every output gets the same operations in the same
// order, `precise` (nothing contracted into a multiply-add): a token alone or in a
// batch, in any place of a tile, gets the same bits.
//
// MATMUL_ID (the experts of a MoE FFN): w holds n_expert matrices of `rows` rows one
// after another; output row s ("slot" s = token * slots + j) is expert ids[s]'s matrix
// times input row s (x_per_slot) or times its token's row s / slots. Only the chosen
// experts' rows are read; one slot per workgroup (neighbouring slots use other experts).
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle_relative : require
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(constant_id = 1) const uint SUBGROUP_TREE = 0;
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
#define LANES 32  // vulkan_ops.cpp's kMatmulLanes
#define GROUP 4
#if TOKEN_TILE == 1
#define STEPS 4  // a lane's runs in flight at once: a decode step's rows are few, each long
#else
#define STEPS 1  // a tile's tokens give each weight value work enough
#endif
const uint ROWS = WG / LANES;
shared float partial[ROWS * TOKEN_TILE * LANES];

void main() {
  // With the subgroup tree a row's 32 lanes are 32 neighbours of one subgroup.
  const uint index = SUBGROUP_TREE != 0 ? gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID : gl_LocalInvocationID.x;
  const uint lane = index % LANES, row_in_group = index / LANES;
  const uint r = (gl_WorkGroupID.x + gl_WorkGroupID.z * gl_NumWorkGroups.x) * ROWS + row_in_group;
  const bool in_range = r < p.rows;
  const uint t0 = gl_WorkGroupID.y * TOKEN_TILE;
  const uint blocks = p.cols / BLOCK_VALUES;
#ifdef MATMUL_ID
  const uint n_tokens = 1;
  const uint expert = uint(ids[t0]);
  if (expert >= p.n_expert) {  // never from moe_route; a stray id writes 0, reads nothing (the whole workgroup)
    if (lane == 0 && in_range) y[t0 * p.y_stride + p.row_offset + r] = 0.0;
    return;
  }
  const uint weight_row = expert * p.rows + r;
  const uint x_row = p.x_per_slot != 0 ? t0 : t0 / p.slots;
#else
  const uint n_tokens = TOKEN_TILE == 1 ? 1u : min(uint(TOKEN_TILE), p.tokens - t0);
  const uint weight_row = r;
  const uint x_row = t0;
#endif
  precise float sum[TOKEN_TILE];
  for (uint i = 0; i < TOKEN_TILE; ++i) sum[i] = 0.0;
  if (in_range) {
    const uint xi = x_row * p.cols;
    for (uint first = lane * GROUP; first < p.cols; first += STEPS * LANES * GROUP) {
      // STEPS runs read (weights decoded, x loaded) before any is summed, so that their
      // loads are in flight together; past the row's end (or the tile's last token) a
      // clamped read, never summed.
      float value[STEPS * GROUP];
      float xs[STEPS * GROUP * TOKEN_TILE];
      for (uint u = 0; u < STEPS * GROUP; ++u) {
        const uint at = min(first + (u / GROUP) * LANES * GROUP + u % GROUP, p.cols - 1);
        value[u] = block_value((weight_row * blocks + at / BLOCK_VALUES) * BLOCK_BYTES, at % BLOCK_VALUES);
        for (uint i = 0; i < TOKEN_TILE; ++i) xs[u * TOKEN_TILE + i] = x[xi + min(i, n_tokens - 1) * p.cols + at];
      }
      for (uint u = 0; u < STEPS * GROUP; ++u) {
        if (first + (u / GROUP) * LANES * GROUP + u % GROUP < p.cols) {
          for (uint i = 0; i < TOKEN_TILE; ++i) {
            if (i < n_tokens) sum[i] += value[u] * xs[u * TOKEN_TILE + i];
          }
        }
      }
    }
  }
  if (SUBGROUP_TREE != 0) {
    for (uint s = LANES / 2; s > 0; s >>= 1) {
      for (uint i = 0; i < TOKEN_TILE; ++i) sum[i] += subgroupShuffleDown(sum[i], s);
    }
  } else {
    const uint at = row_in_group * TOKEN_TILE * LANES;
    for (uint i = 0; i < TOKEN_TILE; ++i) partial[at + i * LANES + lane] = sum[i];
    barrier();
    for (uint s = LANES / 2; s > 0; s >>= 1) {
      if (lane < s) {
        for (uint i = 0; i < TOKEN_TILE; ++i) partial[at + i * LANES + lane] += partial[at + i * LANES + lane + s];
      }
      barrier();
    }
    for (uint i = 0; i < TOKEN_TILE; ++i) sum[i] = partial[at + i * LANES];
  }
  if (lane == 0 && in_range) {
    for (uint i = 0; i < TOKEN_TILE; ++i) {
      if (i < n_tokens) y[(t0 + i) * p.y_stride + p.row_offset + r] = sum[i];
    }
  }
}
