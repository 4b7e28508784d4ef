#version 450
// The gated delta rule (backend.hpp's delta_rule): one workgroup per (sequence, value
// head); invocation j owns row j of the head's d x d state and runs the sequence's
// tokens in order: row *= e^g; u = (v_j - row . k) beta; row += k u; out_j = row . q
// scale. Rows are independent, so no invocation waits for another, and the order is
// the same for a prompt and for decoding. sequences[s] = (first row, rows, -, state
// offset in floats).
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(std430, binding = 0) readonly buffer Q { float q[]; };
layout(std430, binding = 1) readonly buffer K { float k[]; };
layout(std430, binding = 2) readonly buffer V { float v[]; };
layout(std430, binding = 3) readonly buffer LogDecay { float log_decay[]; };
layout(std430, binding = 4) readonly buffer Beta { float beta[]; };
layout(std430, binding = 5) readonly buffer Sequences { uvec4 sequences[]; };
layout(std430, binding = 6) buffer State { float state[]; };
layout(std430, binding = 7) writeonly buffer Output { float y[]; };
layout(push_constant) uniform Push { uint row_stride; uint n_k_heads; uint n_v_heads; uint d; uint grouped; float scale; } p;

void main() {
  const uvec4 seq = sequences[gl_WorkGroupID.x];
  const uint h = gl_WorkGroupID.y;
  const uint group = p.n_v_heads / p.n_k_heads;
  const uint kh = p.grouped != 0 ? h / group : h % p.n_k_heads;
  for (uint j = gl_LocalInvocationID.x; j < p.d; j += WG) {
    const uint row = seq.w + (h * p.d + j) * p.d;
    for (uint t = seq.x; t < seq.x + seq.y; ++t) {
      const float decay = exp(log_decay[t * p.n_v_heads + h]);
      const uint ki = t * p.row_stride + kh * p.d;
      float dot_k = 0.0;
      for (uint i = 0; i < p.d; ++i) {
        state[row + i] *= decay;
        dot_k += state[row + i] * k[ki + i];
      }
      const float u = (v[t * p.row_stride + h * p.d + j] - dot_k) * beta[t * p.n_v_heads + h];
      float dot_q = 0.0;
      for (uint i = 0; i < p.d; ++i) {
        state[row + i] += k[ki + i] * u;
        dot_q += state[row + i] * q[ki + i];
      }
      y[(t * p.n_v_heads + h) * p.d + j] = dot_q * p.scale;
    }
  }
}
