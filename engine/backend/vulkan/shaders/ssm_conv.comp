#version 450
// The causal depthwise conv with its state (backend.hpp's ssm_conv): one invocation
// per (channel, sequence) runs the sequence's rows in order with the last taps rows of
// its channel in registers, the taps summed in order; the state becomes the last
// taps - 1 rows. sequences[s] = (first row, rows, state offset in floats, -).
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(std430, binding = 0) readonly buffer Input { float x[]; };
layout(std430, binding = 1) readonly buffer Weights { float w[]; };
layout(std430, binding = 2) readonly buffer Sequences { uvec4 sequences[]; };
layout(std430, binding = 3) buffer State { float state[]; };
layout(std430, binding = 4) writeonly buffer Output { float y[]; };
layout(push_constant) uniform Push { uint channels; uint taps; } p;
const uint kMaxTaps = 8;

void main() {
  const uint c = gl_WorkGroupID.x * WG + gl_LocalInvocationID.x;
  if (c >= p.channels) return;
  const uvec4 seq = sequences[gl_WorkGroupID.y];
  const uint held = p.taps - 1;
  float window[kMaxTaps];
  for (uint i = 0; i < held; ++i) window[i] = state[seq.z + i * p.channels + c];
  for (uint t = 0; t < seq.y; ++t) {
    const uint row = seq.x + t;
    window[held] = x[row * p.channels + c];
    float sum = 0.0;
    for (uint i = 0; i < p.taps; ++i) sum += window[i] * w[i * p.channels + c];
    y[row * p.channels + c] = sum;
    for (uint i = 0; i < held; ++i) window[i] = window[i + 1];
  }
  for (uint i = 0; i < held; ++i) state[seq.z + i * p.channels + c] = window[i];
}
