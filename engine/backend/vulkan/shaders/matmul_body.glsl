// matmul over a block type (included by the type's file, which defines BLOCK_BYTES,
// BLOCK_VALUES and float block_value(uint base, uint j), value j of the block at byte
// base of w). A row's dot product is spread over LANES = 32 lanes: lane l takes the
// row's values in runs of GROUP = 4, runs l, l + 32, l + 64, ... (so the lanes of a
// step read 128 neighbouring values of x and of the row: coalesced), each lane summing
// its products in that order; then a fixed tree over the 32 lanes (s = 16, 8, 4, 2, 1),
// through subgroup shuffles where the device's subgroups hold whole groups of 32 lanes
// (SUBGROUP_TREE, set by the device) or shared memory elsewhere: the same additions in
// the same order, so the same bits. Each 32 lanes of a workgroup take a row; in the
// tiled shader (MATMUL_TILED, for batches) ROW_TILE rows for TOKEN_TILE tokens, each
// weight value decoded once for the tile's tokens and each x value loaded once for its
// rows. Every output gets the same operations in the same
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
layout(std430, binding = 1) readonly buffer Input4 { vec4 x4[]; };  // the same, 4 at a time
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
#define STEPS 4     // a lane's runs in flight at once: a decode step's rows are few, each long
#define ROW_TILE 1
#else
#define STEPS 1     // a tile's tokens give each weight value work enough
#define ROW_TILE 4  // rows per 32 lanes, each x value loaded once for them (vulkan_ops.cpp's kMatmulTiledRows)
#endif
const uint ROWS = WG / LANES;  // groups of 32 lanes in a workgroup

// Values j .. j + 3 of the block at base (j a multiple of 4: never past its block), or
// for single-value blocks the values at base and the 3 after it. A type's file may
// define BLOCK_VALUES4 and its own, with wider loads: the same values.
#ifndef BLOCK_VALUES4
vec4 block_values4(uint base, uint j) {
  if (BLOCK_VALUES == 1) {
    return vec4(block_value(base, 0), block_value(base + BLOCK_BYTES, 0), block_value(base + 2 * BLOCK_BYTES, 0),
                block_value(base + 3 * BLOCK_BYTES, 0));
  }
  return vec4(block_value(base, j), block_value(base, j + 1), block_value(base, j + 2), block_value(base, j + 3));
}
#endif
shared float partial[ROWS * ROW_TILE * TOKEN_TILE * LANES];

void main() {
  // With the subgroup tree a row's 32 lanes are 32 neighbours of one subgroup.
  const uint index = SUBGROUP_TREE != 0 ? gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID : gl_LocalInvocationID.x;
  const uint lane = index % LANES, lane_group = index / LANES;
  const uint r0 = ((gl_WorkGroupID.x + gl_WorkGroupID.z * gl_NumWorkGroups.x) * ROWS + lane_group) * ROW_TILE;
  const uint t0 = gl_WorkGroupID.y * TOKEN_TILE;
  const uint blocks = p.cols / BLOCK_VALUES;
#ifdef MATMUL_ID
  const uint n_tokens = 1;
  const uint expert = uint(ids[t0]);
  if (expert >= p.n_expert) {  // never from moe_route; a stray id writes 0, reads nothing (the whole workgroup)
    if (lane == 0 && r0 < p.rows) y[t0 * p.y_stride + p.row_offset + r0] = 0.0;
    return;
  }
  const uint first_weight_row = expert * p.rows + r0;
  const uint x_row = p.x_per_slot != 0 ? t0 : t0 / p.slots;
#else
  const uint n_tokens = TOKEN_TILE == 1 ? 1u : min(uint(TOKEN_TILE), p.tokens - t0);
  const uint first_weight_row = r0;
  const uint x_row = t0;
#endif
  // The tile's rows past the matrix: a clamped row read, never written.
  const uint n_rows = r0 < p.rows ? min(uint(ROW_TILE), p.rows - r0) : 0u;
  precise float sum[ROW_TILE * TOKEN_TILE];
  for (uint i = 0; i < ROW_TILE * TOKEN_TILE; ++i) sum[i] = 0.0;
  if (n_rows > 0 && p.cols % GROUP == 0) {
    // Runs of 4 whole: x read as vec4, a run's weights decoded together. The same
    // products, summed in the same order, as the value-by-value loop below.
    const uint xi4 = x_row * p.cols / 4;
    for (uint first = lane * GROUP; first < p.cols; first += STEPS * LANES * GROUP) {
      vec4 value[STEPS * ROW_TILE];
      vec4 xs[STEPS * TOKEN_TILE];
      for (uint st = 0; st < STEPS; ++st) {
        const uint at = min(first + st * LANES * GROUP, p.cols - GROUP);
        for (uint k = 0; k < ROW_TILE; ++k) {
          const uint row = ROW_TILE == 1 ? first_weight_row : first_weight_row + min(k, n_rows - 1);
          value[st * ROW_TILE + k] = block_values4((row * blocks + at / BLOCK_VALUES) * BLOCK_BYTES, at % BLOCK_VALUES);
        }
        for (uint i = 0; i < TOKEN_TILE; ++i) xs[st * TOKEN_TILE + i] = x4[xi4 + (min(i, n_tokens - 1) * p.cols + at) / 4];
      }
      for (uint st = 0; st < STEPS; ++st) {
        if (first + st * LANES * GROUP < p.cols) {
          for (uint g = 0; g < GROUP; ++g) {
            for (uint k = 0; k < ROW_TILE; ++k) {
              for (uint i = 0; i < TOKEN_TILE; ++i) {
                if ((ROW_TILE == 1 || k < n_rows) && i < n_tokens)
                  sum[k * TOKEN_TILE + i] += value[st * ROW_TILE + k][g] * xs[st * TOKEN_TILE + i][g];
              }
            }
          }
        }
      }
    }
  } else if (n_rows > 0) {
    const uint xi = x_row * p.cols;
    for (uint first = lane * GROUP; first < p.cols; first += STEPS * LANES * GROUP) {
      // STEPS runs read (weights decoded, x loaded) before any is summed, so that their
      // loads are in flight together; past the row's end (or the tile's last token) a
      // clamped read, never summed.
      float value[STEPS * GROUP * ROW_TILE];
      float xs[STEPS * GROUP * TOKEN_TILE];
      for (uint u = 0; u < STEPS * GROUP; ++u) {
        const uint at = min(first + (u / GROUP) * LANES * GROUP + u % GROUP, p.cols - 1);
        for (uint k = 0; k < ROW_TILE; ++k) {
          const uint row = ROW_TILE == 1 ? first_weight_row : first_weight_row + min(k, n_rows - 1);
          value[u * ROW_TILE + k] = block_value((row * blocks + at / BLOCK_VALUES) * BLOCK_BYTES, at % BLOCK_VALUES);
        }
        for (uint i = 0; i < TOKEN_TILE; ++i) xs[u * TOKEN_TILE + i] = x[xi + min(i, n_tokens - 1) * p.cols + at];
      }
      for (uint u = 0; u < STEPS * GROUP; ++u) {
        if (first + (u / GROUP) * LANES * GROUP + u % GROUP < p.cols) {
          for (uint k = 0; k < ROW_TILE; ++k) {
            for (uint i = 0; i < TOKEN_TILE; ++i) {
              if ((ROW_TILE == 1 || k < n_rows) && i < n_tokens) sum[k * TOKEN_TILE + i] += value[u * ROW_TILE + k] * xs[u * TOKEN_TILE + i];
            }
          }
        }
      }
    }
  }
  if (SUBGROUP_TREE != 0) {
    for (uint s = LANES / 2; s > 0; s >>= 1) {
      for (uint i = 0; i < ROW_TILE * TOKEN_TILE; ++i) sum[i] += subgroupShuffleDown(sum[i], s);
    }
  } else {
    const uint at = lane_group * ROW_TILE * TOKEN_TILE * LANES;
    for (uint i = 0; i < ROW_TILE * TOKEN_TILE; ++i) partial[at + i * LANES + lane] = sum[i];
    barrier();
    for (uint s = LANES / 2; s > 0; s >>= 1) {
      if (lane < s) {
        for (uint i = 0; i < ROW_TILE * TOKEN_TILE; ++i) partial[at + i * LANES + lane] += partial[at + i * LANES + lane + s];
      }
      barrier();
    }
    for (uint i = 0; i < ROW_TILE * TOKEN_TILE; ++i) sum[i] = partial[at + i * LANES];
  }
  if (lane == 0) {
    for (uint k = 0; k < ROW_TILE; ++k) {
      for (uint i = 0; i < TOKEN_TILE; ++i) {
        if (k < n_rows && i < n_tokens) y[(t0 + i) * p.y_stride + p.row_offset + r0 + k] = sum[k * TOKEN_TILE + i];
      }
    }
  }
}
