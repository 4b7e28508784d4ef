#version 450
#extension GL_GOOGLE_include_directive : require
// Attention of one query head over its sequence's F16 KV cache: one workgroup of 128
// invocations (fixed, not the device's: every device sums alike) per (query, head). K and V rows are n_kv_heads heads wide and live in pages of
// 2^page_shift positions; a query's page table (its sequence's pages, in position
// order) starts at pages[table]. As llama.cpp's non-flash path over an F16 cache:
// Q rounded to F16 for the K dot, scale, optional softcap, a window mask, softmax,
// the probabilities rounded to F16 for the V dot. Each query is computed alone in one
// fixed order (keys in position order, a fixed tree for the max and the sum), so its
// result does not depend on its batch. The V sums split the keys over
// key_groups = 128 / dv groups of invocations (key j to group j % key_groups, each in
// position order), added group after group at the end: chains a quarter as long
// for dv = 64, which a decode step's few workgroups wait on.
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
const uint WG = 128;
layout(local_size_x = 128) in;
layout(std430, binding = 0) readonly buffer Queries { float q[]; };
layout(std430, binding = 1) readonly buffer Keys { float16_t k[]; };
layout(std430, binding = 1) readonly buffer Keys4 { f16vec4 k4[]; };  // the same, 4 at a time
layout(std430, binding = 2) readonly buffer Values { float16_t v[]; };
layout(std430, binding = 3) readonly buffer QueryInfo { uvec4 info[]; };  // pos, n_pos, table, -
layout(std430, binding = 4) readonly buffer Pages { uint pages[]; };       // first row of each page
layout(std430, binding = 5) buffer Scores { float scores[]; };
layout(std430, binding = 6) writeonly buffer Output { float y[]; };
layout(push_constant) uniform Push {
  uint q_row_stride; uint n_head; uint n_head_kv; uint dk; uint dv; uint k_row; uint v_row;
  uint page_shift; uint max_keys; uint window; float scale; float softcap;
} p;
shared float partial[WG];
// The query head rounded to F16 once (a head over kMaxHeadDim is rounded at each use).
const uint kMaxHeadDim = 512;
shared float query_half[kMaxHeadDim];

#include "float_rounding.glsl"

uint row_of(uint table, uint key) {
  return pages[table + (key >> p.page_shift)] + (key & ((1u << p.page_shift) - 1u));
}

void main() {
  const uint t = gl_WorkGroupID.x, h = gl_WorkGroupID.y, lid = gl_LocalInvocationID.x;
  const uint kvh = h / (p.n_head / p.n_head_kv);
  const uvec4 query = info[t];
  const int pos = int(query.x), n_pos = int(query.y);
  const uint table = query.z;
  const int first = p.window > 0 ? max(0, pos - int(p.window) + 1) : 0;
  const int last = min(pos, n_pos - 1);
  const uint n_keys = uint(max(0, last - first + 1));
  const uint base = (t * p.n_head + h) * p.max_keys;
  const uint qi = t * p.q_row_stride + h * p.dk;

  const bool kept = p.dk <= kMaxHeadDim;
  for (uint d = lid; kept && d < p.dk; d += WG) query_half[d] = round_to_half(q[qi + d]);
  barrier();
  float local_max = -1.0 / 0.0;
  for (uint j = lid; j < n_keys; j += WG) {
    const uint kr = row_of(table, uint(first) + j) * p.k_row + kvh * p.dk;
    float s = 0.0;
    if (kept && kr % 4 == 0 && p.dk % 4 == 0) {
      for (uint d = 0; d < p.dk; d += 4) {
        const vec4 kv = vec4(k4[(kr + d) / 4]);
        s += query_half[d] * kv.x;
        s += query_half[d + 1] * kv.y;
        s += query_half[d + 2] * kv.z;
        s += query_half[d + 3] * kv.w;
      }
    } else {
      for (uint d = 0; d < p.dk; ++d) s += (kept ? query_half[d] : round_to_half(q[qi + d])) * float(k[kr + d]);
    }
    s *= p.scale;
    if (p.softcap > 0.0) s = p.softcap * tanh(s / p.softcap);
    scores[base + j] = s;
    local_max = max(local_max, s);
  }
  partial[lid] = local_max;
  barrier();
  for (uint s = WG / 2; s > 0; s >>= 1) {
    if (lid < s) partial[lid] = max(partial[lid], partial[lid + s]);
    barrier();
  }
  const float row_max = partial[0];
  barrier();
  float local_sum = 0.0;
  for (uint j = lid; j < n_keys; j += WG) {
    const float e = exp(scores[base + j] - row_max);
    scores[base + j] = e;
    local_sum += e;
  }
  partial[lid] = local_sum;
  memoryBarrierBuffer();
  barrier();
  for (uint s = WG / 2; s > 0; s >>= 1) {
    if (lid < s) partial[lid] += partial[lid + s];
    barrier();
  }
  const float inverse = n_keys > 0 ? 1.0 / partial[0] : 0.0;
  // The probabilities rounded to F16 once, not once per output dimension.
  for (uint j = lid; j < n_keys; j += WG) scores[base + j] = round_to_half(scores[base + j] * inverse);
  memoryBarrierBuffer();
  barrier();
  const uint yi = (t * p.n_head + h) * p.dv;
  const uint key_groups = max(1u, WG / p.dv), group = lid / p.dv;
  for (uint d = lid % p.dv; d < p.dv && group < key_groups; d += WG) {
    float acc = 0.0;
    for (uint j = group; j < n_keys; j += key_groups) {
      const uint vr = row_of(table, uint(first) + j) * p.v_row + kvh * p.dv;
      acc += scores[base + j] * float(v[vr + d]);
    }
    if (key_groups == 1) {
      y[yi + d] = acc;
    } else {
      partial[lid] = acc;  // lid = group * dv + d
    }
  }
  if (key_groups > 1) {
    barrier();
    for (uint d = lid; d < p.dv; d += WG) {
      float sum = partial[d];
      for (uint g = 1; g < key_groups; ++g) sum += partial[g * p.dv + d];
      y[yi + d] = sum;
    }
  }
}
